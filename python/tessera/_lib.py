"""_lib — the shared library (libtessera.so) through ctypes: finding it,
the prototypes of the C functions the package calls, the process's default
context and the conversion of C errors into tessera.Error.

Owns nothing above the C API: tensors live in tensor.py, models in
models.py. Every pointer-returning function gets restype c_void_p (a
ctypes default of int would cut 64-bit pointers).
"""

import ctypes
import ctypes.util
import os
import threading

c_void_p, c_int, c_int64, c_double, c_char_p, c_bool, c_size_t, c_uint64 = (
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int64,
    ctypes.c_double,
    ctypes.c_char_p,
    ctypes.c_bool,
    ctypes.c_size_t,
    ctypes.c_uint64,
)
P_INT64 = ctypes.POINTER(c_int64)
P_INT = ctypes.POINTER(c_int)

STATUS_NAMES = (
    "OK",
    "INVALID_ARG",
    "SHAPE",
    "DTYPE",
    "RANGE",
    "OOM",
    "IO",
    "STATE",
    "UNSUPPORTED",
)


class Error(RuntimeError):
    """An error reported by the Tessera runtime: .status is the C status's
    name ("SHAPE", "IO", ...), str() the C message."""

    def __init__(self, message, status="INVALID_ARG"):
        super().__init__(message)
        self.status = status


def _candidates():
    env = os.environ.get("TESSERA_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libtessera.so.0", "libtessera.so"):
        yield os.path.join(here, name)  # installed by pip with the package
    # the source tree: python/tessera -> build/
    root = os.path.dirname(os.path.dirname(here))
    yield os.path.join(root, "build", "libtessera.so")
    found = ctypes.util.find_library("tessera")  # make install
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError(
        "tessera: libtessera.so not found; build it (make build), set "
        "TESSERA_LIBRARY to its path, or pip install ./python. Tried: " + ", ".join(tried)
    )


lib, path = _load()


def _decl(name, restype, argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = argtypes
    return f


class Device(ctypes.Structure):
    _fields_ = [("kind", c_int), ("index", c_int)]


# name: (restype, argtypes); T is a tensor handle
T = c_void_p
_PROTOS = {
    "ts_ctx_new": (c_int, [ctypes.POINTER(c_void_p), c_void_p]),
    "ts_ctx_free": (None, [c_void_p]),
    "ts_errmsg": (c_char_p, [c_void_p]),
    "ts_model_file_text": (c_void_p, [c_void_p, c_char_p, c_char_p]),
    "ts_cpu_isa": (c_char_p, []),
    "ts_cpu_isa_max": (c_char_p, []),
    "ts_ctx_status": (c_int, [c_void_p]),
    "ts_clear_error": (None, [c_void_p]),
    "ts_get_num_threads": (c_int, [c_void_p]),
    "ts_set_num_threads": (c_int, [c_void_p, c_int]),
    "ts_set_device": (c_int, [c_void_p, Device]),
    "ts_get_device": (Device, [c_void_p]),
    "ts_device_parse": (c_int, [c_void_p, c_char_p, ctypes.POINTER(Device)]),
    "ts_device_name": (c_char_p, [Device, c_char_p]),
    "ts_device_count": (c_int, [c_void_p, c_int]),
    "ts_to_device": (T, [T, Device]),
    "ts_set_mode": (c_int, [c_void_p, c_int]),
    "ts_get_mode": (c_int, [c_void_p]),
    "ts_sync": (c_int, [c_void_p]),
    "ts_empty": (T, [c_void_p, c_int, c_int, P_INT64]),
    "ts_zeros": (T, [c_void_p, c_int, c_int, P_INT64]),
    "ts_full": (T, [c_void_p, c_int, c_int, P_INT64, c_double]),
    "ts_from_data": (T, [c_void_p, c_int, c_int, P_INT64, c_void_p]),
    "ts_scalar": (T, [c_void_p, c_int, c_double]),
    "ts_arange": (T, [c_void_p, c_int, c_double, c_double, c_double]),
    "ts_randn": (T, [c_void_p, c_int, c_int, P_INT64, c_double, c_uint64]),
    "ts_retain": (T, [T]),
    "ts_release": (None, [T]),
    "ts_tensor_dtype": (c_int, [T]),
    "ts_tensor_ndim": (c_int, [T]),
    "ts_tensor_shape": (P_INT64, [T]),
    "ts_tensor_strides": (P_INT64, [T]),
    "ts_tensor_numel": (c_int64, [T]),
    "ts_tensor_device": (Device, [T]),
    "ts_tensor_data": (c_void_p, [T]),
    "ts_tensor_read": (c_int, [T, c_void_p, c_int]),
    "ts_item": (c_int, [T, ctypes.POINTER(c_double)]),
    "ts_to_string": (c_void_p, [T]),
    "ts_to_dlpack": (c_int, [T, ctypes.POINTER(c_void_p)]),
    "ts_from_dlpack": (T, [c_void_p, c_void_p]),
    "ts_set_requires_grad": (c_int, [T, c_bool]),
    "ts_requires_grad": (c_bool, [T]),
    "ts_is_leaf": (c_bool, [T]),
    "ts_grad": (T, [T]),
    "ts_zero_grad": (None, [T]),
    "ts_backward": (c_int, [T, T]),
    "ts_detach": (T, [T]),
    "ts_set_grad_enabled": (c_bool, [c_void_p, c_bool]),
    "ts_is_grad_enabled": (c_bool, [c_void_p]),
    "ts_copy_": (c_int, [T, T]),
    "ts_fill_": (c_int, [T, c_double]),
    "ts_reshape": (T, [T, c_int, P_INT64]),
    "ts_permute": (T, [T, P_INT]),
    "ts_transpose": (T, [T, c_int, c_int]),
    "ts_slice": (T, [T, c_int, c_int64, c_int64, c_int64]),
    "ts_expand": (T, [T, c_int, P_INT64]),
    "ts_squeeze": (T, [T, c_int]),
    "ts_unsqueeze": (T, [T, c_int]),
    "ts_contiguous": (T, [T]),
    "ts_add": (T, [T, T]),
    "ts_sub": (T, [T, T]),
    "ts_mul": (T, [T, T]),
    "ts_div": (T, [T, T]),
    "ts_add_scalar": (T, [T, c_double]),
    "ts_mul_scalar": (T, [T, c_double]),
    "ts_pow_scalar": (T, [T, c_double]),
    "ts_gelu": (T, [T, c_int]),
    "ts_where": (T, [T, T, T]),
    "ts_masked_fill": (T, [T, T, c_double]),
    "ts_cast": (T, [T, c_int]),
    "ts_copy": (T, [T]),
    "ts_sum": (T, [T, c_int, P_INT, c_bool]),
    "ts_mean": (T, [T, c_int, P_INT, c_bool]),
    "ts_amax": (T, [T, c_int, P_INT, c_bool]),
    "ts_max": (T, [T, c_int, c_bool]),
    "ts_argmax": (T, [T, c_int, c_bool]),
    "ts_softmax": (T, [T, c_int]),
    "ts_log_softmax": (T, [T, c_int]),
    "ts_matmul": (T, [T, T]),
    "ts_linear": (T, [T, T, T]),
    "ts_embedding": (T, [T, T]),
    "ts_concat": (T, [c_int, ctypes.POINTER(c_void_p), c_int]),
    "ts_rmsnorm": (T, [T, T, c_double]),
    "ts_layernorm": (T, [T, T, T, c_double]),
    "ts_attention": (T, [T, T, T, T, c_bool, c_double]),
    "ts_rope": (T, [T, T, T]),
    "ts_cross_entropy": (T, [T, T, c_int64, c_int]),
    "ts_gather": (T, [T, c_int, T]),
    "ts_split": (c_int, [T, c_int, c_int, P_INT64, ctypes.POINTER(c_void_p)]),
}
for _name in ("neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu", "silu"):
    _PROTOS["ts_" + _name] = (T, [T])

for _name, (_r, _a) in _PROTOS.items():
    _decl(_name, _r, _a)

DTYPES = ("float32", "bfloat16", "float16", "int32", "int64",
          "q8_0", "q4_0", "q4_k", "q5_k", "q6_k")  # block formats: weights only
DTYPE_SIZES = (4, 2, 2, 4, 8, 0, 0, 0, 0, 0)
DEVICE_KINDS = ("cpu", "vulkan")
MODE_EAGER, MODE_COMPILED = 0, 1

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [c_void_p]
_libc.free.restype = None
free = _libc.free

_ctx = None
_ctx_lock = threading.Lock()


def ctx():
    """The process's default context (made at first use; TS_NUM_THREADS or
    the cores sets its threads)."""
    global _ctx
    if _ctx is None:
        with _ctx_lock:
            if _ctx is None:
                h = c_void_p()
                if lib.ts_ctx_new(ctypes.byref(h), None) != 0 or not h.value:
                    raise Error("tessera: could not create a context", "OOM")
                _ctx = h.value
    return _ctx


def last_error(c=None):
    """The context's last error as an Error (and clears it)."""
    c = c or ctx()
    st = lib.ts_ctx_status(c)
    msg = lib.ts_errmsg(c).decode("utf-8", "replace") or "unknown error"
    lib.ts_clear_error(c)
    name = STATUS_NAMES[st] if 0 <= st < len(STATUS_NAMES) else str(st)
    return Error(msg, name)


def check(status, c=None):
    if status != 0:
        raise last_error(c)


def shape_arg(shape):
    n = len(shape)
    return n, (c_int64 * n)(*shape) if n else None


def dtype_code(dtype):
    """A dtype name ("float32", "f32", "bf16", ...), a numpy/torch dtype, or a
    code -> the C enum value."""
    if isinstance(dtype, int):
        return dtype
    s = str(dtype).replace("torch.", "")
    aliases = {
        "float32": 0, "f32": 0, "float": 0,
        "bfloat16": 1, "bf16": 1,
        "float16": 2, "f16": 2, "half": 2,
        "int32": 3, "i32": 3,
        "int64": 4, "i64": 4, "long": 4,
    }
    if s in aliases:
        return aliases[s]
    raise Error(f"dtype {dtype}: Tessera's dtypes are float32, bfloat16, float16, int32 and int64", "DTYPE")


def parse_device(spec):
    if isinstance(spec, Device):
        return spec
    d = Device()
    check(lib.ts_device_parse(ctx(), str(spec).encode(), ctypes.byref(d)))
    return d


def device_name(d):
    buf = ctypes.create_string_buffer(32)
    return lib.ts_device_name(d, buf).decode()
