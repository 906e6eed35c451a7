"""tensor — tessera.Tensor, a handle on a C ts_tensor, with NumPy and
DLPack exchange (zero copy on the host), device moves and the op functions.

Each Tensor holds one reference to its C tensor and releases it when it
dies. Ops check the C result: NULL raises tessera.Error with the C message.
"""

import ctypes

from . import _lib
from ._lib import Error, lib

_c = ctypes


class Tensor:
    __slots__ = ("_h", "__weakref__")

    def __init__(self, *a, **k):
        raise TypeError("tessera.Tensor is made by tessera.tensor, from_numpy, from_dlpack, zeros, ...")

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            lib.ts_release(h)

    # ---- inspection ----
    @property
    def dtype(self):
        return _lib.DTYPES[lib.ts_tensor_dtype(self._h)]

    @property
    def shape(self):
        n = lib.ts_tensor_ndim(self._h)
        p = lib.ts_tensor_shape(self._h)
        return tuple(p[i] for i in range(n))

    def size(self, dim=None):
        s = self.shape
        return s if dim is None else s[dim]

    @property
    def ndim(self):
        return lib.ts_tensor_ndim(self._h)

    def dim(self):
        return self.ndim

    def numel(self):
        return lib.ts_tensor_numel(self._h)

    def __len__(self):
        s = self.shape
        if not s:
            raise TypeError("len() of a 0-d tensor")
        return s[0]

    @property
    def strides(self):
        n = lib.ts_tensor_ndim(self._h)
        p = lib.ts_tensor_strides(self._h)
        return tuple(p[i] for i in range(n))

    @property
    def device(self):
        return _lib.device_name(lib.ts_tensor_device(self._h))

    def __repr__(self):
        p = lib.ts_to_string(self._h)
        if not p:
            raise _lib.last_error()
        try:
            return _c.string_at(p).decode("utf-8", "replace").rstrip("\n")
        finally:
            _lib.free(p)

    def item(self):
        v = _c.c_double()
        _lib.check(lib.ts_item(self._h, _c.byref(v)))
        return int(v.value) if self.dtype.startswith("int") else v.value

    def tolist(self):
        return self.numpy().tolist()

    # ---- exchange ----
    def numpy(self):
        """A NumPy array of the values: a zero-copy view of host memory
        (bfloat16, which NumPy lacks, comes as a float32 copy)."""
        import numpy as np

        t = self
        if t.device != "cpu:0" and not t.device.startswith("cpu"):
            t = t.to("cpu")
        if t.dtype == "bfloat16":
            t = t.to(dtype="float32")
        return np.from_dlpack(t)

    def __array__(self, dtype=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __dlpack__(self, stream=None):
        if stream is not None and stream != -1:
            raise BufferError("tessera: host tensors take no stream")
        m = _c.c_void_p()
        _lib.check(lib.ts_to_dlpack(self._h, _c.byref(m)))
        return _capsule_new(m.value)

    def __dlpack_device__(self):
        d = lib.ts_tensor_device(self._h)
        if d.kind != 0:
            # a Vulkan tensor: DLPack's kDLVulkan (7); its data is not host memory
            return (7, d.index)
        return (1, 0)  # kDLCPU

    def to(self, device=None, dtype=None):
        """A copy on another device ("cpu", "cpu:1", "vulkan:0") and/or in
        another dtype; self when nothing changes."""
        t = self
        if device is not None:
            d = _lib.parse_device(device)
            t = _wrap(lib.ts_to_device(t._h, d))
        if dtype is not None:
            code = _lib.dtype_code(dtype)
            if code != lib.ts_tensor_dtype(t._h):
                t = _wrap(lib.ts_cast(t._h, code))
        return t

    def cpu(self):
        return self.to("cpu")

    # ---- autograd ----
    @property
    def requires_grad(self):
        return lib.ts_requires_grad(self._h)

    @requires_grad.setter
    def requires_grad(self, on):
        _lib.check(lib.ts_set_requires_grad(self._h, bool(on)))

    def requires_grad_(self, on=True):
        self.requires_grad = on
        return self

    @property
    def grad(self):
        g = lib.ts_grad(self._h)  # borrowed
        return _wrap(lib.ts_retain(g)) if g else None

    def zero_grad(self):
        lib.ts_zero_grad(self._h)

    def backward(self, grad=None):
        _lib.check(lib.ts_backward(self._h, grad._h if grad is not None else None))

    def detach(self):
        return _wrap(lib.ts_detach(self._h))

    # ---- shapes ----
    def reshape(self, *shape):
        shape = _shape_args(shape)
        n, arr = _lib.shape_arg(shape)
        return _wrap(lib.ts_reshape(self._h, n, arr))

    view = reshape

    def permute(self, *perm):
        perm = _shape_args(perm)
        arr = (_c.c_int * len(perm))(*perm)
        return _wrap(lib.ts_permute(self._h, arr))

    def transpose(self, d0, d1):
        return _wrap(lib.ts_transpose(self._h, d0, d1))

    @property
    def T(self):
        return self.transpose(-2, -1)

    def contiguous(self):
        return _wrap(lib.ts_contiguous(self._h))

    def expand(self, *shape):
        shape = _shape_args(shape)
        n, arr = _lib.shape_arg(shape)
        return _wrap(lib.ts_expand(self._h, n, arr))

    def squeeze(self, dim):
        return _wrap(lib.ts_squeeze(self._h, dim))

    def unsqueeze(self, dim):
        return _wrap(lib.ts_unsqueeze(self._h, dim))

    def __getitem__(self, idx):
        if not isinstance(idx, tuple):
            idx = (idx,)
        t, dim = self, 0
        for it in idx:
            if it is Ellipsis:
                dim = t.ndim - (len(idx) - 1 - idx.index(Ellipsis)) - 0
                continue
            if isinstance(it, slice):
                start = 0 if it.start is None else it.start
                stop = (1 << 62) if it.stop is None else it.stop
                t = _wrap(lib.ts_slice(t._h, dim, start, stop, it.step or 1))
                dim += 1
            elif isinstance(it, int):
                n = t.shape[dim]
                i = it + n if it < 0 else it
                if not 0 <= i < n:
                    raise IndexError(f"index {it} is out of range for dim {dim} of size {n}")
                one = _wrap(lib.ts_slice(t._h, dim, i, i + 1, 1))  # alive through the squeeze
                t = _wrap(lib.ts_squeeze(one._h, dim))
            else:
                raise TypeError(f"tessera.Tensor indexes by ints and slices, not {type(it).__name__}")
        return t

    # ---- arithmetic ----
    def __add__(self, o):
        return _binary(lib.ts_add, lib.ts_add_scalar, self, o)

    __radd__ = __add__

    def __mul__(self, o):
        return _binary(lib.ts_mul, lib.ts_mul_scalar, self, o)

    __rmul__ = __mul__

    def __sub__(self, o):
        if isinstance(o, Tensor):
            return _wrap(lib.ts_sub(self._h, o._h))
        return _wrap(lib.ts_add_scalar(self._h, -float(o)))

    def __rsub__(self, o):
        neg = _wrap(lib.ts_neg(self._h))  # alive through the next call
        return _wrap(lib.ts_add_scalar(neg._h, float(o)))

    def __truediv__(self, o):
        if isinstance(o, Tensor):
            return _wrap(lib.ts_div(self._h, o._h))
        o = float(o)
        if o == 0:  # IEEE division by +0 or -0, as PyTorch's: inf, -inf or nan
            zero = _wrap(lib.ts_scalar(_lib.ctx(), lib.ts_tensor_dtype(self._h), o))
            if zero.device != self.device:
                zero = zero.to(self.device)
            return _wrap(lib.ts_div(self._h, zero._h))
        return _wrap(lib.ts_mul_scalar(self._h, 1.0 / o))

    def __rtruediv__(self, o):
        inv = _wrap(lib.ts_pow_scalar(self._h, -1.0))  # alive through the next call
        return _wrap(lib.ts_mul_scalar(inv._h, float(o)))

    def __neg__(self):
        return _wrap(lib.ts_neg(self._h))

    def __pow__(self, e):
        return _wrap(lib.ts_pow_scalar(self._h, float(e)))

    def __matmul__(self, o):
        return _wrap(lib.ts_matmul(self._h, o._h))

    def sum(self, dim=None, keepdim=False):
        return _reduce(lib.ts_sum, self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return _reduce(lib.ts_mean, self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        return _reduce(lib.ts_amax, self, dim, keepdim)

    def argmax(self, dim=-1, keepdim=False):
        return _wrap(lib.ts_argmax(self._h, dim, keepdim))

    def softmax(self, dim=-1):
        return _wrap(lib.ts_softmax(self._h, dim))

    def log_softmax(self, dim=-1):
        return _wrap(lib.ts_log_softmax(self._h, dim))


def _shape_args(a):
    if len(a) == 1 and isinstance(a[0], (tuple, list)):
        return tuple(a[0])
    return tuple(a)


def _wrap(h):
    """A Tensor owning the new reference h; NULL raises the context's error."""
    if not h:
        raise _lib.last_error()
    t = object.__new__(Tensor)
    t._h = h
    return t


def _binary(fn, fn_scalar, a, b):
    if isinstance(b, Tensor):
        return _wrap(fn(a._h, b._h))
    return _wrap(fn_scalar(a._h, float(b)))


def _reduce(fn, t, dim, keepdim):
    if dim is None:
        return _wrap(fn(t._h, 0, None, keepdim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    arr = (_c.c_int * len(dims))(*dims)
    return _wrap(fn(t._h, len(dims), arr, keepdim))


# ---- DLPack capsules through the C API of Python itself ----
_pyapi = _c.pythonapi
_cap_new = _pyapi.PyCapsule_New
_cap_new.restype = _c.py_object
_cap_new.argtypes = [_c.c_void_p, _c.c_char_p, _c.c_void_p]
_cap_get = _pyapi.PyCapsule_GetPointer
_cap_get.restype = _c.c_void_p
_cap_get.argtypes = [_c.py_object, _c.c_char_p]
_cap_set_name = _pyapi.PyCapsule_SetName
_cap_set_name.restype = _c.c_int
_cap_set_name.argtypes = [_c.py_object, _c.c_char_p]
_cap_is_valid = _pyapi.PyCapsule_IsValid
_cap_is_valid.restype = _c.c_int
_cap_is_valid.argtypes = [_c.py_object, _c.c_char_p]
# the destructor sees a dying capsule: raw pointers only, never a py_object
_raw = _c.PyDLL(None)
_raw_is_valid = _raw.PyCapsule_IsValid
_raw_is_valid.restype = _c.c_int
_raw_is_valid.argtypes = [_c.c_void_p, _c.c_char_p]
_raw_get = _raw.PyCapsule_GetPointer
_raw_get.restype = _c.c_void_p
_raw_get.argtypes = [_c.c_void_p, _c.c_char_p]


class _DLManaged(_c.Structure):
    # DLTensor (data, device{type, id}, ndim, dtype{code, bits, lanes},
    # shape, strides, byte_offset), manager_ctx, deleter
    _fields_ = [
        ("data", _c.c_void_p),
        ("device_type", _c.c_int32),
        ("device_id", _c.c_int32),
        ("ndim", _c.c_int32),
        ("code", _c.c_uint8),
        ("bits", _c.c_uint8),
        ("lanes", _c.c_uint16),
        ("shape", _c.c_void_p),
        ("strides", _c.c_void_p),
        ("byte_offset", _c.c_uint64),
        ("manager_ctx", _c.c_void_p),
        ("deleter", _c.CFUNCTYPE(None, _c.c_void_p)),
    ]


@_c.CFUNCTYPE(None, _c.c_void_p)
def _capsule_destructor(cap):
    # a capsule nobody consumed still owns its DLManagedTensor
    if _raw_is_valid(cap, b"dltensor"):
        p = _raw_get(cap, b"dltensor")
        if p:
            m = _DLManaged.from_address(p)
            if m.deleter:
                m.deleter(p)


def _capsule_new(ptr):
    return _cap_new(ptr, b"dltensor", _c.cast(_capsule_destructor, _c.c_void_p))


def from_dlpack(obj):
    """A Tensor viewing the memory of obj (anything with __dlpack__: a torch
    tensor, a NumPy array, or a "dltensor" capsule), without a copy. Host
    memory; float32/bfloat16/float16/int32/int64."""
    if isinstance(obj, Tensor):
        return obj
    if hasattr(obj, "__dlpack__"):
        if getattr(obj, "requires_grad", False):
            raise Error("from_dlpack: the tensor requires grad; pass tensor.detach() (Tessera "
                        "shares its memory, not its autograd graph)")
        try:
            cap = obj.__dlpack__()
        except (RuntimeError, BufferError, TypeError, ValueError) as e:
            # the producer refuses (torch and NumPy have no DLPack bool, ...)
            dt = getattr(obj, "dtype", None)
            raise Error(f"from_dlpack: a tensor of dtype {dt} cannot be exchanged "
                        f"({e}); Tessera's dtypes are float32, bfloat16, float16, int32 and int64",
                        "DTYPE") from None
    else:
        cap = obj
    if not _cap_is_valid(cap, b"dltensor"):
        raise Error("from_dlpack: not a DLPack capsule (or one already consumed)")
    p = _cap_get(cap, b"dltensor")
    t = _wrap(lib.ts_from_dlpack(_lib.ctx(), p))  # raises with the C reason
    _cap_set_name(cap, b"used_dltensor")  # the tensor owns it now
    return t


def from_numpy(a):
    """A Tensor over a NumPy array's memory (zero copy when the array is
    writeable; otherwise a copy). float64 is not a Tessera dtype: convert
    first."""
    import numpy as np

    if a.dtype == np.float64:
        raise Error("from_numpy: float64 is not a Tessera dtype (float32, float16, int32, int64; "
                    "convert with a.astype(np.float32))", "DTYPE")
    if a.dtype == np.bool_:
        a = a.astype(np.int32)
    if not a.flags.writeable or any(st < 0 for st in a.strides):
        a = a.copy()  # DLPack has no read-only arrays nor negative strides
    return from_dlpack(a)


def tensor(data, dtype=None, device=None):
    """A new Tensor holding data (a nested list, a number, a NumPy array, or
    anything numpy.asarray takes), copied; floats become float32 unless
    dtype says otherwise."""
    import numpy as np

    a = np.asarray(data)
    if dtype is not None:
        code = _lib.dtype_code(dtype)
        npdt = (np.float32, np.float32, np.float16, np.int32, np.int64)[code]
    elif a.dtype.kind == "f":
        code, npdt = (2, np.float16) if a.dtype == np.float16 else (0, np.float32)
    elif a.dtype == np.int32:
        code, npdt = (3, np.int32)  # kept, as torch.tensor keeps it
    elif a.dtype.kind in "iub":
        code, npdt = (4, np.int64)
    else:
        raise Error(f"tensor: cannot make a tensor of {a.dtype}", "DTYPE")
    a = np.asarray(a, dtype=npdt, order="C")  # 0-d stays 0-d
    n, shape = _lib.shape_arg(a.shape)
    c = _lib.ctx()
    if code == 1:  # bf16: from f32, rounded by the runtime
        t = _wrap(lib.ts_from_data(c, 0, n, shape, a.ctypes.data))
        t = _wrap(lib.ts_cast(t._h, 1))
    else:
        t = _wrap(lib.ts_from_data(c, code, n, shape, a.ctypes.data))
    return t.to(device) if device is not None else t


def zeros(*shape, dtype="float32"):
    shape = _shape_args(shape)
    n, arr = _lib.shape_arg(shape)
    return _wrap(lib.ts_zeros(_lib.ctx(), _lib.dtype_code(dtype), n, arr))


def full(shape, value, dtype="float32"):
    n, arr = _lib.shape_arg(tuple(shape))
    return _wrap(lib.ts_full(_lib.ctx(), _lib.dtype_code(dtype), n, arr, float(value)))


def ones(*shape, dtype="float32"):
    return full(_shape_args(shape), 1.0, dtype)


def arange(start, end=None, step=1, dtype="float32"):
    if end is None:
        start, end = 0, start
    return _wrap(lib.ts_arange(_lib.ctx(), _lib.dtype_code(dtype), start, end, step))


def randn(*shape, std=1.0, seed=0, dtype="float32"):
    shape = _shape_args(shape)
    n, arr = _lib.shape_arg(shape)
    return _wrap(lib.ts_randn(_lib.ctx(), _lib.dtype_code(dtype), n, arr, std, seed))
