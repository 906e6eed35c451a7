"""Tessera from Python: tensors over the C runtime (libtessera.so), models
loaded from Hugging Face folders, generation, serving, training, and
PyTorch modules compiled onto Tessera's devices (tessera.torch.compile).

    import tessera
    x = tessera.tensor([[1.0, 2.0]])
    y = (x @ x.T).softmax(-1)       # runs on Tessera's CPU kernels
    y.numpy()                        # a NumPy view, no copy

Errors from the runtime are tessera.Error, with the C message.
"""

import ctypes as _c

from . import _lib
from ._lib import Error, lib as _L
from .tensor import (Tensor, arange, from_dlpack, from_numpy, full, ones,
                     randn, tensor, zeros)
from .tensor import _wrap
from .models import Model, Tokenizer, load
from .serve import Server, serve
from .train import prepare_data, train

__version__ = "0.23.0"

__all__ = [
    "cpu_isa",
    "Error", "Tensor", "tensor", "from_numpy", "from_dlpack", "zeros", "ones", "full",
    "arange", "randn", "devices", "device_count", "set_device", "set_num_threads",
    "get_num_threads", "set_mode", "get_mode", "sync", "no_grad", "matmul", "linear",
    "embedding", "softmax", "log_softmax", "rms_norm", "layer_norm", "gelu", "silu", "relu",
    "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "where", "masked_fill", "cat",
    "scaled_dot_product_attention", "cross_entropy", "load", "Model", "Tokenizer", "serve",
    "Server", "train", "prepare_data",
]


# ---- context-wide settings ----
def cpu_isa():
    """The CPU kernels' ISA level in use ("sse2", "avx2", "avx512",
    "avx512_bf16", "amx"; TS_CPU_ISA lowers it) and the machine's highest,
    as a pair."""
    return _L.ts_cpu_isa().decode(), _L.ts_cpu_isa_max().decode()


def device_count(kind="cpu"):
    """How many devices of a kind ("cpu" or "vulkan") this process can use."""
    code = _lib.DEVICE_KINDS.index(kind)
    n = _L.ts_device_count(_lib.ctx(), code)
    _L.ts_clear_error(_lib.ctx())  # no Vulkan is a count of 0, not an error
    return n


def devices():
    """The names of the devices there are: ["cpu:0", ..., "vulkan:0", ...]."""
    out = ["cpu:%d" % i for i in range(device_count("cpu"))]
    return out + ["vulkan:%d" % i for i in range(device_count("vulkan"))]


def set_device(device):
    """Where new tensors go ("cpu", "vulkan:0", ...)."""
    _lib.check(_L.ts_set_device(_lib.ctx(), _lib.parse_device(device)))


def set_num_threads(n):
    _lib.check(_L.ts_set_num_threads(_lib.ctx(), int(n)))


def get_num_threads():
    return _L.ts_get_num_threads(_lib.ctx())


def set_mode(mode):
    """"eager" (each op runs at once) or "compiled" (ops are recorded and
    run as one planned graph when a result is read); returns the old one."""
    if mode not in ("eager", "compiled"):
        raise Error(f"set_mode: {mode!r} is not 'eager' or 'compiled'")
    old = _L.ts_set_mode(_lib.ctx(), 1 if mode == "compiled" else 0)
    return "compiled" if old == 1 else "eager"


def get_mode():
    return "compiled" if _L.ts_get_mode(_lib.ctx()) == 1 else "eager"


def sync():
    """Runs what compiled mode has recorded."""
    _lib.check(_L.ts_sync(_lib.ctx()))


class no_grad:
    """with tessera.no_grad(): ops record no autograd graph."""

    def __enter__(self):
        self._old = _L.ts_set_grad_enabled(_lib.ctx(), False)

    def __exit__(self, *exc):
        _L.ts_set_grad_enabled(_lib.ctx(), self._old)


# ---- ops (the C API's, by PyTorch's names) ----
def _h(t):
    return t._h if t is not None else None


def matmul(a, b):
    return _wrap(_L.ts_matmul(a._h, b._h))


def linear(x, weight, bias=None):
    return _wrap(_L.ts_linear(x._h, weight._h, _h(bias)))


def embedding(ids, weight):
    return _wrap(_L.ts_embedding(weight._h, ids._h))


def softmax(x, dim=-1):
    return _wrap(_L.ts_softmax(x._h, dim))


def log_softmax(x, dim=-1):
    return _wrap(_L.ts_log_softmax(x._h, dim))


def rms_norm(x, weight=None, eps=1e-6):
    return _wrap(_L.ts_rmsnorm(x._h, _h(weight), eps))


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    return _wrap(_L.ts_layernorm(x._h, _h(weight), _h(bias), eps))


def gelu(x, approximate="none"):
    return _wrap(_L.ts_gelu(x._h, 1 if approximate == "tanh" else 0))


def where(cond, a, b):
    return _wrap(_L.ts_where(cond._h, a._h, b._h))


def masked_fill(x, mask, value):
    return _wrap(_L.ts_masked_fill(x._h, mask._h, float(value)))


def cat(tensors, dim=0):
    arr = (_c.c_void_p * len(tensors))(*[t._h for t in tensors])
    return _wrap(_L.ts_concat(len(tensors), arr, dim))


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """q (B, H, T, D), k/v (B, KV, S, D); fused, online softmax."""
    return _wrap(_L.ts_attention(q._h, k._h, v._h, _h(attn_mask), bool(is_causal),
                                 0.0 if scale is None else float(scale)))


def cross_entropy(logits, targets, ignore_index=-100, reduction="mean"):
    red = {"mean": 0, "sum": 1, "none": 2}[reduction]
    return _wrap(_L.ts_cross_entropy(logits._h, targets._h, ignore_index, red))


def _unary(cname):
    f = getattr(_L, cname)

    def op(x):
        return _wrap(f(x._h))

    op.__name__ = cname[3:]
    return op


silu, relu, sigmoid, tanh, exp, log, sqrt, rsqrt = (
    _unary("ts_" + n) for n in ("silu", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt"))
