/* devices_cli.c — `tessera devices`: every device this build and machine
 * offer (the CPU, each Vulkan device), with memory and features, or why a
 * kind has none. */
#include "tessera.h"

#include "cli/opts.h"

#include <stdio.h>
#include <string.h>

static void print_one(ts_ctx *ctx, ts_device d) {
    ts_device_info in;
    char name[16];
    if (ts_device_info_get(ctx, d, &in) != TS_OK) {
        printf("%-10s error: %s\n", ts_device_name(d, name), ts_errmsg(ctx));
        ts_clear_error(ctx);
        return;
    }
    printf("%-10s %s\n", ts_device_name(d, name), in.name);
    printf("           type %s, memory %.1f GiB (%.1f GiB free)\n", in.type,
           (double)in.total_bytes / (1u << 30),
           (double)in.free_bytes / (1u << 30));
    if (in.driver[0])
        printf("           driver %s\n", in.driver);
    printf("           features %s\n", in.features);
}

static const cli_opt DEVICES_OPTS[] = {{0}};

static const cli_cmd DEVICES_CMD = {
    .name = "devices",
    .usage = "devices",
    .about =
        "Lists the devices models can run on: cpu:0 (the host; cpu:1..7 are "
        "separate pools of its memory) and vulkan:N, each Vulkan device the "
        "driver reports (Mesa's lavapipe on machines without a GPU).",
    .opts = DEVICES_OPTS,
    .short_threads = true,
};

int tessera_devices(int argc, char **argv) {
    cli_parser p;
    cli_val v;
    cli_begin(&p, &DEVICES_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(&DEVICES_CMD, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        return cli_fail(&DEVICES_CMD, "unexpected argument \"%s\"", v.s);
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK) {
        fprintf(stderr, "tessera devices: cannot create a context\n");
        return 1;
    }
    print_one(ctx, (ts_device){TS_DEVICE_CPU, 0});
    int n = ts_device_count(ctx, TS_DEVICE_VULKAN);
    if (n == 0)
        printf("vulkan     none: %s\n", ts_errmsg(ctx));
    for (int i = 0; i < n; i++)
        print_one(ctx, (ts_device){TS_DEVICE_VULKAN, i});
    ts_ctx_free(ctx);
    return 0;
}
