/* vk_device.c — a Vulkan device as the backend holds it: the instance and
 * the physical devices of a context, device creation with the features the
 * shaders need, the memory sub-allocator over large VkDeviceMemory blocks,
 * command batches (record many dispatches, submit, wait only when the host
 * needs values), pipelines built from the embedded SPIR-V, and transfers
 * through staging memory. The op table and the vtable are in
 * vk_backend.c. */
#include "backend/vulkan/vk_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---- */

const char *vk_result_name(VkResult r) {
    switch (r) {
    case VK_SUCCESS:
        return "VK_SUCCESS";
    case VK_TIMEOUT:
        return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY:
        return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
        return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED:
        return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST:
        return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT:
        return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT:
        return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT:
        return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER:
        return "VK_ERROR_INCOMPATIBLE_DRIVER";
    default:
        return "VkResult error";
    }
}

/* A failed call: the device is marked lost when the driver says so, and
 * every later call on it fails at once instead of waiting on it. */
ts_status vk_fail(ts_ctx *ctx, vk_dev *d, VkResult r, const char *what) {
    if (r == VK_ERROR_DEVICE_LOST && d)
        d->lost = true;
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return ts_set_error(ctx, TS_ERR_OOM, "vulkan:%d: %s: %s",
                            d ? d->index : 0, what, vk_result_name(r));
    return ts_set_error(ctx, TS_ERR_STATE, "vulkan:%d: %s: %s (%d)%s",
                        d ? d->index : 0, what, vk_result_name(r), (int)r,
                        r == VK_ERROR_DEVICE_LOST
                            ? "; the device is lost, its tensors are gone"
                            : "");
}

/* ---- the instance (per context) ---- */

static VKAPI_ATTR VkBool32 VKAPI_CALL
on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
              VkDebugUtilsMessageTypeFlagsEXT type,
              const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)type;
    vk_state *s = user;
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        s->validation_errors++;
        fprintf(stderr, "vulkan validation error: %s\n", data->pMessage);
    } else if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        fprintf(stderr, "vulkan validation warning: %s\n", data->pMessage);
    }
    return VK_FALSE;
}

static bool env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

static bool has_layer(const char *name) {
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, NULL);
    VkLayerProperties *l = calloc(n ? n : 1, sizeof *l);
    bool found = false;
    if (l && vkEnumerateInstanceLayerProperties(&n, l) >= 0)
        for (uint32_t i = 0; i < n && !found; i++)
            found = !strcmp(l[i].layerName, name);
    free(l);
    return found;
}

/* Creates ctx's instance and lists its devices, once; a machine without a
 * driver leaves the state with no devices and the reason in s->why. */
vk_state *vk_state_get(ts_ctx *ctx) {
    vk_state *s = ctx->backend_state[TS_DEVICE_VULKAN];
    if (s)
        return s;
    s = calloc(1, sizeof *s);
    if (!s) {
        ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
        return NULL;
    }
    ctx->backend_state[TS_DEVICE_VULKAN] = s;
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "tessera",
                             .pEngineName = "tessera",
                             .apiVersion = VK_API_VERSION_1_2};
    const char *layers[1], *exts[1];
    uint32_t nl = 0, ne = 0;
    bool validate = env_on("TS_VK_VALIDATE");
    if (validate) {
        if (has_layer("VK_LAYER_KHRONOS_validation")) {
            layers[nl++] = "VK_LAYER_KHRONOS_validation";
            exts[ne++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
        } else {
            fprintf(stderr, "tessera: TS_VK_VALIDATE is set but the "
                            "validation layer is not installed "
                            "(vulkan-validationlayers)\n");
            validate = false;
        }
    }
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pApplicationInfo = &app,
                               .enabledLayerCount = nl,
                               .ppEnabledLayerNames = layers,
                               .enabledExtensionCount = ne,
                               .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateInstance(&ci, NULL, &s->instance);
    if (r != VK_SUCCESS) {
        snprintf(s->why, sizeof s->why,
                 "no Vulkan driver: vkCreateInstance failed with %s (install "
                 "a GPU driver, or mesa-vulkan-drivers for lavapipe)",
                 vk_result_name(r));
        s->instance = VK_NULL_HANDLE;
        return s;
    }
    if (validate) {
        PFN_vkCreateDebugUtilsMessengerEXT mk =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
                s->instance, "vkCreateDebugUtilsMessengerEXT");
        VkDebugUtilsMessengerCreateInfoEXT mi = {
            .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT,
            .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            .pfnUserCallback = on_validation,
            .pUserData = s};
        if (mk)
            mk(s->instance, &mi, NULL, &s->messenger);
    }
    uint32_t n = 0;
    r = vkEnumeratePhysicalDevices(s->instance, &n, NULL);
    if (n > TS_MAX_DEVICES)
        n = TS_MAX_DEVICES;
    if (r >= 0 && n)
        r = vkEnumeratePhysicalDevices(s->instance, &n, s->phys);
    if (r < 0 || n == 0) {
        snprintf(s->why, sizeof s->why,
                 "no Vulkan device: the driver lists none (%s)",
                 r < 0 ? vk_result_name(r) : "0 devices");
        n = 0;
    }
    s->n_phys = (int)n;
    return s;
}

void vk_state_free(ts_ctx *ctx) {
    vk_state *s = ctx->backend_state[TS_DEVICE_VULKAN];
    if (!s)
        return;
    for (int i = 0; i < TS_MAX_DEVICES; i++)
        if (s->devs[i])
            vk_dev_destroy(s->devs[i]);
    if (s->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT rm =
            (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
                s->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (rm)
            rm(s->instance, s->messenger, NULL);
    }
    if (s->instance)
        vkDestroyInstance(s->instance, NULL);
    if (s->validation_errors)
        fprintf(stderr, "tessera: %d Vulkan validation error(s)\n",
                s->validation_errors);
    free(s);
    ctx->backend_state[TS_DEVICE_VULKAN] = NULL;
}

int vk_device_count(ts_ctx *ctx) {
    vk_state *s = vk_state_get(ctx);
    if (!s)
        return 0;
    if (s->n_phys == 0)
        ts_set_error(ctx, TS_ERR_UNSUPPORTED, "%s", s->why);
    return s->n_phys;
}

/* ---- device creation ---- */

static bool has_dev_ext(VkPhysicalDevice p, const char *name) {
    uint32_t n = 0;
    vkEnumerateDeviceExtensionProperties(p, NULL, &n, NULL);
    VkExtensionProperties *e = calloc(n ? n : 1, sizeof *e);
    bool found = false;
    if (e && vkEnumerateDeviceExtensionProperties(p, NULL, &n, e) >= 0)
        for (uint32_t i = 0; i < n && !found; i++)
            found = !strcmp(e[i].extensionName, name);
    free(e);
    return found;
}

static int find_mem_type(const VkPhysicalDeviceMemoryProperties *mp,
                         uint32_t bits, VkMemoryPropertyFlags want,
                         VkMemoryPropertyFlags avoid) {
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++)
        if ((bits & (1u << i)) &&
            (mp->memoryTypes[i].propertyFlags & want) == want &&
            !(mp->memoryTypes[i].propertyFlags & avoid))
            return (int)i;
    return -1;
}

/* the features every shader relies on, and what the device lacks of them */
static const char *missing_features(VkPhysicalDevice p) {
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .pNext = &f12};
    VkPhysicalDeviceFeatures2 f = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    VkPhysicalDeviceProperties pr;
    vkGetPhysicalDeviceProperties(p, &pr);
    if (pr.apiVersion < VK_API_VERSION_1_2)
        return "Vulkan 1.2";
    vkGetPhysicalDeviceFeatures2(p, &f);
    if (!f12.bufferDeviceAddress)
        return "bufferDeviceAddress";
    if (!f.features.shaderInt64)
        return "shaderInt64";
    if (!f.features.shaderInt16)
        return "shaderInt16";
    if (!f11.storageBuffer16BitAccess)
        return "storageBuffer16BitAccess";
    if (pr.limits.maxComputeWorkGroupInvocations < 256)
        return "256 invocations per workgroup";
    VkPhysicalDeviceSubgroupProperties sg = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(p, &p2);
    VkSubgroupFeatureFlags want =
        VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    if (!(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
        (sg.supportedOperations & want) != want)
        return "subgroup arithmetic in compute shaders";
    return NULL;
}

static ts_status create_device(ts_ctx *ctx, vk_dev *d) {
    VkPhysicalDevice p = d->phys;
    const char *miss = missing_features(p);
    if (miss)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan:%d (%s): the device lacks %s, which "
                            "Tessera's shaders need",
                            d->index, d->props.deviceName, miss);
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(p, &nq, NULL);
    VkQueueFamilyProperties qp[32];
    if (nq > 32)
        nq = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(p, &nq, qp);
    int qfam = -1;
    for (uint32_t i = 0; i < nq; i++) /* a compute queue, dedicated first */
        if ((qp[i].queueFlags & VK_QUEUE_COMPUTE_BIT) &&
            (qfam < 0 || !(qp[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)))
            qfam = (int)i;
    if (qfam < 0)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan:%d (%s): no compute queue", d->index,
                            d->props.deviceName);
    d->qfam = (uint32_t)qfam;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = d->qfam,
        .queueCount = 1,
        .pQueuePriorities = &prio};
    /* enable what is offered among what the kernels can use */
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT af = {
        .sType =
            VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .pNext = &f12};
    VkPhysicalDeviceFeatures2 f = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    const char *exts[4];
    uint32_t ne = 0;
    bool atomic_float =
        has_dev_ext(p, VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
    if (atomic_float) {
        exts[ne++] = VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME;
        f12.pNext = &af;
    }
    d->has_budget = has_dev_ext(p, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    if (d->has_budget)
        exts[ne++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    vkGetPhysicalDeviceFeatures2(p, &f);
    d->lim.atomic_float_add = atomic_float && af.shaderBufferFloat32AtomicAdd;
    /* keep only what is used (the rest off: fewer driver paths) */
    VkPhysicalDeviceFeatures2 en = f;
    memset(&en.features, 0, sizeof en.features);
    en.features.shaderInt64 = VK_TRUE;
    en.features.shaderInt16 = VK_TRUE;
    VkPhysicalDeviceVulkan11Features e11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .storageBuffer16BitAccess = VK_TRUE,
        .uniformAndStorageBuffer16BitAccess =
            f11.uniformAndStorageBuffer16BitAccess};
    VkPhysicalDeviceVulkan12Features e12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .bufferDeviceAddress = VK_TRUE,
        .shaderFloat16 = f12.shaderFloat16,
        .shaderInt8 = f12.shaderInt8,
        .storageBuffer8BitAccess = f12.storageBuffer8BitAccess,
        .vulkanMemoryModel = f12.vulkanMemoryModel,
        .vulkanMemoryModelDeviceScope = f12.vulkanMemoryModelDeviceScope};
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT eaf = {
        .sType =
            VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT,
        .shaderBufferFloat32AtomicAdd = af.shaderBufferFloat32AtomicAdd,
        .shaderBufferFloat32Atomics = af.shaderBufferFloat32Atomics,
        .shaderSharedFloat32AtomicAdd = af.shaderSharedFloat32AtomicAdd,
        .shaderSharedFloat32Atomics = af.shaderSharedFloat32Atomics};
    en.pNext = &e11;
    e11.pNext = &e12;
    e12.pNext = atomic_float ? &eaf : NULL;
    d->lim.fp16 = f12.shaderFloat16;
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .pNext = &en,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi,
                             .enabledExtensionCount = ne,
                             .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateDevice(p, &di, NULL, &d->dev);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkCreateDevice");
    vkGetDeviceQueue(d->dev, d->qfam, 0, &d->queue);
    return TS_OK;
}

static void fill_limits(vk_dev *d) {
    VkPhysicalDeviceSubgroupProperties sg = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(d->phys, &p2);
    const VkPhysicalDeviceLimits *l = &d->props.limits;
    d->lim.subgroup_size = sg.subgroupSize ? sg.subgroupSize : 1;
    d->lim.max_workgroup_invocations = l->maxComputeWorkGroupInvocations;
    d->lim.max_shared_bytes = l->maxComputeSharedMemorySize;
    for (int i = 0; i < 3; i++)
        d->lim.max_groups[i] = l->maxComputeWorkGroupCount[i];
    /* no cooperative matrices: VK_KHR_cooperative_matrix is newer than
     * Debian 12's Vulkan headers (1.3.239), so the plain tiled shaders run
     * everywhere; see docs/BACKENDS.md */
    VkPhysicalDeviceMaintenance3Properties m3 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    VkPhysicalDeviceMaintenance4Properties m4 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES};
    VkPhysicalDeviceProperties2 q = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    if (d->props.apiVersion >= VK_API_VERSION_1_3)
        m3.pNext = &m4;
    vkGetPhysicalDeviceProperties2(d->phys, &q);
    d->max_alloc = m3.maxMemoryAllocationSize;
    if (m4.maxBufferSize && m4.maxBufferSize < d->max_alloc)
        d->max_alloc = m4.maxBufferSize;
    if (!d->max_alloc)
        d->max_alloc = (uint64_t)1 << 31;
}

vk_dev *vk_dev_get(ts_ctx *ctx, int index) {
    vk_state *s = vk_state_get(ctx);
    if (!s)
        return NULL;
    if (index < 0 || index >= s->n_phys) {
        if (s->n_phys == 0)
            ts_set_error(ctx, TS_ERR_UNSUPPORTED, "vulkan:%d: %s", index,
                         s->why);
        else
            ts_set_error(ctx, TS_ERR_RANGE,
                         "vulkan:%d: no such device (this machine has "
                         "vulkan:0..vulkan:%d)",
                         index, s->n_phys - 1);
        return NULL;
    }
    if (s->devs[index])
        return s->devs[index];
    if (s->failed[index]) {
        ts_set_error(ctx, TS_ERR_UNSUPPORTED, "%s", s->fail_msg[index]);
        return NULL;
    }
    vk_dev *d = calloc(1, sizeof *d);
    if (!d) {
        ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
        return NULL;
    }
    d->ctx = ctx;
    d->index = index;
    d->phys = s->phys[index];
    vkGetPhysicalDeviceProperties(d->phys, &d->props);
    vkGetPhysicalDeviceMemoryProperties(d->phys, &d->memprops);
    fill_limits(d);
    ts_status st = create_device(ctx, d);
    if (st == TS_OK)
        st = vk_mem_init(ctx, d);
    if (st == TS_OK)
        st = vk_exec_init(ctx, d);
    if (st != TS_OK) {
        s->failed[index] = true;
        snprintf(s->fail_msg[index], sizeof s->fail_msg[index], "%s",
                 ts_errmsg(ctx));
        vk_dev_destroy(d);
        return NULL;
    }
    s->devs[index] = d;
    return d;
}

const vk_limits *vk_dev_limits(const vk_dev *d) {
    return &d->lim;
}

void vk_dev_destroy(vk_dev *d) {
    if (d->dev) {
        if (!d->lost) /* a hung device is not waited for again */
            vkDeviceWaitIdle(d->dev);
        while (d->n_graphs) /* plans outliving the trace (none expected) */
            vk_graph_free(d->graphs[d->n_graphs - 1]);
        free(d->graphs);
        vk_exec_destroy(d);
        vk_mem_destroy(d);
        vkDestroyDevice(d->dev, NULL);
    }
    free(d);
}

/* ---- memory: blocks, size classes ---- */

static ts_status oom(ts_ctx *ctx, vk_dev *d, size_t bytes) {
    size_t fr, tot;
    vk_mem_info(d, &fr, &tot);
    return ts_set_error(ctx, TS_ERR_OOM,
                        "vulkan:%d: out of device memory: asked %zu bytes, "
                        "%zu free of %zu (one allocation may be at most %llu)",
                        d->index, bytes, fr, tot,
                        (unsigned long long)d->max_alloc);
}

/* a block's memory: one VkDeviceMemory with one buffer over all of it */
static ts_status raw_alloc(ts_ctx *ctx, vk_dev *d, size_t bytes, int kind,
                           vk_raw *out) {
    bool host = kind != VK_MEM_DEVICE;
    memset(out, 0, sizeof *out);
    if (bytes > d->max_alloc)
        return oom(ctx, d, bytes);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = bytes,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                      VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(d->dev, &bi, NULL, &out->buf);
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return oom(ctx, d, bytes);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, out->buf, &req);
    /* kernel parameters: device memory the host can write (a discrete
     * GPU's BAR) when there is some, so kernels read them locally */
    int type = kind == VK_MEM_PARAMS
                   ? find_mem_type(&d->memprops, req.memoryTypeBits,
                                   VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT |
                                       VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                       VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                   0)
                   : -1;
    if (type < 0)
        type = host ? find_mem_type(&d->memprops, req.memoryTypeBits,
                                    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                        VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                        VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
                                    0)
                    : find_mem_type(&d->memprops, req.memoryTypeBits,
                                    VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (type < 0)
        type = host ? find_mem_type(&d->memprops, req.memoryTypeBits,
                                    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                        VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                    0)
                    : find_mem_type(&d->memprops, req.memoryTypeBits, 0, 0);
    if (type < 0) {
        vkDestroyBuffer(d->dev, out->buf, NULL);
        out->buf = VK_NULL_HANDLE;
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan:%d: no %s memory type for buffers",
                            d->index, host ? "host-visible" : "device");
    }
    VkMemoryAllocateFlagsInfo fi = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
        .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .pNext = &fi,
                               .allocationSize = req.size,
                               .memoryTypeIndex = (uint32_t)type};
    r = vkAllocateMemory(d->dev, &ai, NULL, &out->mem);
    if (r == VK_SUCCESS)
        r = vkBindBufferMemory(d->dev, out->buf, out->mem, 0);
    if (r == VK_SUCCESS && host)
        r = vkMapMemory(d->dev, out->mem, 0, VK_WHOLE_SIZE, 0, &out->map);
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(d->dev, out->buf, NULL);
        if (out->mem)
            vkFreeMemory(d->dev, out->mem, NULL);
        memset(out, 0, sizeof *out);
        if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY ||
            r == VK_ERROR_OUT_OF_HOST_MEMORY)
            return oom(ctx, d, bytes);
        return vk_fail(ctx, d, r, "vkAllocateMemory");
    }
    VkBufferDeviceAddressInfo bai = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO,
        .buffer = out->buf};
    out->addr = vkGetBufferDeviceAddress(d->dev, &bai);
    out->bytes = bytes;
    d->mem_reserved += host ? 0 : bytes;
    return TS_OK;
}

static void raw_free(vk_dev *d, vk_raw *r, bool host) {
    if (r->map)
        vkUnmapMemory(d->dev, r->mem);
    if (r->buf)
        vkDestroyBuffer(d->dev, r->buf, NULL);
    if (r->mem)
        vkFreeMemory(d->dev, r->mem, NULL);
    if (!host)
        d->mem_reserved -= r->bytes;
    memset(r, 0, sizeof *r);
}

ts_status vk_host_buffer(ts_ctx *ctx, vk_dev *d, size_t bytes, vk_raw *out) {
    return raw_alloc(ctx, d, bytes, VK_MEM_STAGING, out);
}

ts_status vk_params_buffer(ts_ctx *ctx, vk_dev *d, size_t bytes, vk_raw *out) {
    if (raw_alloc(ctx, d, bytes, VK_MEM_PARAMS, out) == TS_OK)
        return TS_OK;
    ts_clear_error(ctx); /* the BAR is small: host memory will do */
    return raw_alloc(ctx, d, bytes, VK_MEM_STAGING, out);
}
void vk_host_buffer_free(vk_dev *d, vk_raw *r) {
    raw_free(d, r, true);
}

/* size classes: 256-byte granules up to 4 KiB, then 4 steps per power of
 * two (at most 19% rounding) */
static int size_class(size_t bytes, size_t *rounded) {
    if (bytes <= 4096) {
        size_t g = (bytes + 255) / 256;
        *rounded = g * 256;
        return (int)g - 1; /* 0..15 */
    }
    int lg = 63 - __builtin_clzll((unsigned long long)(bytes - 1));
    size_t base = (size_t)1 << lg, step = base / 4;
    size_t k = (bytes - base + step - 1) / step; /* 1..4 */
    *rounded = base + k * step;
    return 16 + (lg - 12) * 4 + (int)k - 1;
}

ts_status vk_mem_init(ts_ctx *ctx, vk_dev *d) {
    (void)ctx;
    const char *e = getenv("TS_VK_BLOCK_MB");
    long mb = e ? strtol(e, NULL, 10) : 0;
    /* shaders reach memory by device address, so blocks are not bound by
     * maxStorageBufferRange; 256 MiB, a quarter of lavapipe's 2 GiB limit
     * on one allocation */
    d->block_bytes = (size_t)(mb > 0 && mb <= 4096 ? mb : 256) << 20;
    return TS_OK;
}

void vk_mem_destroy(vk_dev *d) {
    for (int c = 0; c < VK_CLASSES; c++) {
        vk_chunk *ch = d->free_chunks[c];
        while (ch) {
            vk_chunk *nx = ch->next;
            free(ch);
            ch = nx;
        }
        d->free_chunks[c] = NULL;
    }
    for (int i = 0; i < d->n_blocks; i++) {
        raw_free(d, &d->blocks[i]->raw, false);
        free(d->blocks[i]);
    }
    free(d->blocks);
    d->blocks = NULL;
    d->n_blocks = 0;
}

void vk_mem_info(vk_dev *d, size_t *free_bytes, size_t *total) {
    size_t tot = 0;
    for (uint32_t i = 0; i < d->memprops.memoryHeapCount; i++)
        if (d->memprops.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            tot += d->memprops.memoryHeaps[i].size;
    size_t fr = tot > d->mem_reserved ? tot - d->mem_reserved : 0;
    if (d->has_budget) {
        VkPhysicalDeviceMemoryBudgetPropertiesEXT b = {
            .sType =
                VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
        VkPhysicalDeviceMemoryProperties2 mp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
            .pNext = &b};
        vkGetPhysicalDeviceMemoryProperties2(d->phys, &mp);
        size_t budget = 0, used = 0;
        for (uint32_t i = 0; i < mp.memoryProperties.memoryHeapCount; i++)
            if (mp.memoryProperties.memoryHeaps[i].flags &
                VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
                budget += b.heapBudget[i];
                used += b.heapUsage[i];
            }
        if (budget)
            fr = budget > used ? budget - used : 0;
    }
    *free_bytes = fr;
    *total = tot;
}

/* blocks are kept sorted by device address: the block of an address is a
 * binary search */
vk_block *vk_block_of(vk_dev *d, uint64_t addr) {
    int lo = 0, hi = d->n_blocks - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        vk_block *b = d->blocks[mid];
        if (addr < b->raw.addr)
            hi = mid - 1;
        else if (addr >= b->raw.addr + b->raw.bytes)
            lo = mid + 1;
        else
            return b;
    }
    return NULL;
}

static ts_status add_block(ts_ctx *ctx, vk_dev *d, size_t bytes, bool dedicated,
                           vk_block **out) {
    vk_block *b = calloc(1, sizeof *b);
    if (!b)
        return ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
    ts_status st = raw_alloc(ctx, d, bytes, VK_MEM_DEVICE, &b->raw);
    if (st != TS_OK) {
        free(b);
        return st;
    }
    b->dedicated = dedicated;
    vk_block **nb = realloc(d->blocks, sizeof *nb * (size_t)(d->n_blocks + 1));
    if (!nb) {
        raw_free(d, &b->raw, false);
        free(b);
        return ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
    }
    d->blocks = nb;
    int i = d->n_blocks++;
    while (i > 0 && d->blocks[i - 1]->raw.addr > b->raw.addr) {
        d->blocks[i] = d->blocks[i - 1];
        i--;
    }
    d->blocks[i] = b;
    *out = b;
    return TS_OK;
}

static void remove_block(vk_dev *d, vk_block *b) {
    int i = 0;
    while (i < d->n_blocks && d->blocks[i] != b)
        i++;
    for (; i + 1 < d->n_blocks; i++)
        d->blocks[i] = d->blocks[i + 1];
    d->n_blocks--;
    raw_free(d, &b->raw, false);
    free(b);
}

/* drops every cached chunk and the blocks that hold nothing live: when
 * an allocation fails, before reporting out of memory. Everything queued
 * is run first (cached chunks may be read by recorded kernels); the
 * temporaries of the batch being recorded stay (the kernel asking may hold
 * some for launches still to come). */
static ts_status release_idle_blocks(vk_dev *d) {
    ts_status st = vk_exec_wait_keep_temps(d->ctx, d);
    if (st != TS_OK)
        return st;
    for (int c = 0; c < VK_CLASSES; c++) {
        vk_chunk *ch = d->free_chunks[c];
        while (ch) {
            vk_chunk *nx = ch->next;
            free(ch); /* a block with live chunks keeps this memory */
            ch = nx;
        }
        d->free_chunks[c] = NULL;
    }
    d->cached_bytes = 0;
    for (int i = d->n_blocks - 1; i >= 0; i--) {
        vk_block *b = d->blocks[i];
        if (b->live == 0 && !b->dedicated) {
            if (d->carve == b)
                d->carve = NULL;
            remove_block(d, b);
        }
    }
    return TS_OK;
}

uint64_t vk_alloc_addr(ts_ctx *ctx, vk_dev *d, size_t bytes) {
    if (d->lost) {
        ts_set_error(ctx, TS_ERR_STATE, "vulkan:%d: the device is lost",
                     d->index);
        return 0;
    }
    size_t rounded;
    if (bytes == 0)
        bytes = 1;
    if (bytes > d->block_bytes / 2) { /* large: a block of its own */
        vk_block *b;
        size_t want = (bytes + 4095) & ~(size_t)4095;
        if (add_block(ctx, d, want, true, &b) != TS_OK) {
            if (release_idle_blocks(d) != TS_OK)
                return 0; /* the wait failed: its error stands */
            ts_clear_error(ctx);
            if (add_block(ctx, d, want, true, &b) != TS_OK)
                return 0;
        }
        b->live = 1;
        return b->raw.addr;
    }
    int c = size_class(bytes, &rounded);
    vk_chunk *ch = d->free_chunks[c];
    if (ch) { /* a cached chunk of this class */
        d->free_chunks[c] = ch->next;
        uint64_t a = ch->addr;
        free(ch);
        d->cached_bytes -= rounded;
        vk_block_of(d, a)->live++;
        return a;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!d->carve || d->carve->used + rounded > d->carve->raw.bytes) {
            vk_block *b;
            if (add_block(ctx, d, d->block_bytes, false, &b) != TS_OK) {
                if (attempt == 0) {
                    if (release_idle_blocks(d) != TS_OK)
                        return 0;
                    ts_clear_error(ctx);
                    continue;
                }
                return 0;
            }
            d->carve = b;
        }
        uint64_t a = d->carve->raw.addr + d->carve->used;
        d->carve->used += rounded;
        d->carve->live++;
        return a;
    }
    return 0;
}

void vk_free_addr(vk_dev *d, uint64_t addr, size_t bytes) {
    vk_block *b = vk_block_of(d, addr);
    if (!b)
        return;
    if (bytes == 0)
        bytes = 1;
    if (b->dedicated) {
        /* kernels in flight may still read it: freed when they are done */
        vk_exec_defer_block(d, b);
        return;
    }
    size_t rounded;
    int c = size_class(bytes, &rounded);
    vk_chunk *ch = malloc(sizeof *ch);
    b->live--;
    if (!ch)
        return; /* the chunk is lost until its block goes */
    /* reuse is safe without waiting: later work on the one queue runs
     * after the kernels that read the old contents */
    ch->addr = addr;
    ch->next = d->free_chunks[c];
    d->free_chunks[c] = ch;
    d->cached_bytes += rounded;
}

void vk_block_release(vk_dev *d, vk_block *b) {
    if (d->carve == b)
        d->carve = NULL;
    remove_block(d, b);
}
