"""_lower — the captured IR (_capture.N) to a Python function of Tessera
calls, generated as source and compiled once per captured shape, the way
torch.fx's GraphModule generates its forward: one line per op, each a
ctypes call into libtessera whose NULL result raises tessera.Error, and a
`del` after each value's last use so that compiled mode plans its memory
with nothing held that the graph no longer needs.

An aten op with no Tessera lowering raises UnsupportedOp naming the op and
the user's source line; with fallback it runs in PyTorch on the host
(values moved through DLPack) between the Tessera ops around it.
"""

import torch
from torch.utils import dlpack as tdl

from .. import _lib
from .._lib import Error, lib as L
from ..tensor import _wrap, from_dlpack

_TS_DTYPE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int32: 3, torch.int64: 4}


class UnsupportedOp(Error):
    """An op of the captured module that Tessera has no kernel for."""

    def __init__(self, message):
        super().__init__(message, "UNSUPPORTED")


def unsupported(n, why=""):
    where = f" (called at {n.src})" if n.src else ""
    why = why.replace("tessera.torch.compile: ", "")
    extra = f": {why}" if why else ""
    return UnsupportedOp(f"tessera.torch.compile: {n.op}{extra} has no Tessera lowering{where}; "
                         f"pass fallback=True to run it in PyTorch")


def ts_dtype(dt):
    if dt not in _TS_DTYPE:
        raise Error(f"tessera.torch.compile: dtype {dt} is not a Tessera dtype "
                    "(float32, bfloat16, float16, int32, int64)", "DTYPE")
    return _TS_DTYPE[dt]


def torch_to_ts(t, device):
    """A torch tensor's Tessera view (zero copy on the host), on device."""
    if t.dtype == torch.float64:
        t = t.to(torch.float32)
    elif t.dtype == torch.bool:
        t = t.to(torch.float32)
    if t.dtype not in _TS_DTYPE:
        raise Error(f"tessera.torch.compile: a tensor of dtype {t.dtype} is not a Tessera dtype", "DTYPE")
    x = from_dlpack(t.detach())
    return x if device is None else _wrap(L.ts_to_device(x._h, device))


def ts_to_torch(x):
    """A Tessera tensor as a torch tensor (zero copy from host memory)."""
    if L.ts_tensor_device(x._h).kind != 0:
        x = _wrap(L.ts_to_device(x._h, _lib.Device(0, 0)))
    return tdl.from_dlpack(x)


class Codegen:
    def __init__(self, device, train):
        self.consts = []  # (torch value, Tessera tensor): the value keeps its id unique
        self.device, self.train = device, train
        self.const_ids = {}
        self.pre, self.n_tmp = [], 0

    # the expression for a tensor argument's handle
    def t(self, a):
        from ._capture import N

        if isinstance(a, N):
            if a.const:
                return f"C[{self.const(a.value)}]._h"
            return f"{a.var}._h"
        if a is None:
            return "None"
        if isinstance(a, torch.Tensor):
            return f"C[{self.const(a)}]._h"
        raise Error(f"tessera.torch.compile: expected a tensor, got {a!r}")

    def const(self, value, dtype=None):
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        if dtype is not None and value.dtype != dtype:
            value = value.to(dtype)
        key = (id(value), value.dtype)
        if key not in self.const_ids:
            self.const_ids[key] = len(self.consts)
            self.consts.append((value, torch_to_ts(value.contiguous(), self.device)))
        return self.const_ids[key]

    def sub(self, expr):
        """A temporary for expr (a W(...) of a new handle), assigned in a
        statement of its own before the node's line, so that it stays alive
        while the node's call reads its handle: `W(...)._h` inline would
        free the tensor before the outer call runs. Returns `name._h`."""
        name = f"_t{self.n_tmp}"
        self.n_tmp += 1
        self.pre.append(f"{name} = {expr}")
        return f"{name}._h"

    def take_pre(self):
        pre, self.pre = self.pre, []
        names = [ln.split(" = ", 1)[0] for ln in pre]
        return pre, names


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _float_only(n, *args):
    """Tessera's arithmetic kernels take floating-point values: integer or
    boolean math (position ids, masks) is left to PyTorch (fallback)."""
    dts = [n.dtype] + [_arg_dtype(a) for a in args]
    for dt in dts:
        if dt is not None and dt not in _FLOATS:
            raise Error(f"{dt} operands (Tessera computes this op on floats only)")


def _scalar(a):
    """a as a Python number when it is one (or a one-element constant)."""
    from ._capture import N

    if isinstance(a, bool):
        return float(a)
    if isinstance(a, (int, float)):
        return float(a)
    if isinstance(a, N) and a.const and isinstance(a.value, torch.Tensor) and a.value.numel() == 1 \
            and a.value.dim() == 0:
        return float(a.value.item())
    if isinstance(a, torch.Tensor) and a.numel() == 1 and a.dim() == 0:
        return float(a.item())
    return None


def _arg_dtype(a):
    from ._capture import N

    if isinstance(a, N):
        return a.value.dtype if a.const and isinstance(a.value, torch.Tensor) else a.dtype
    return None


def _cast_to(g, n, a):
    """a's handle expression, cast to n's dtype when it differs (torch's
    type promotion of mixed operands)."""
    from ._capture import N

    dt = _arg_dtype(a)
    if dt is None or dt == n.dtype or n.dtype is None:
        return g.t(a)
    if isinstance(a, N) and a.const:
        return f"C[{g.const(a.value, n.dtype)}]._h"
    return g.sub(f"W(L.ts_cast({g.t(a)}, {ts_dtype(n.dtype)}))")


def _shape(s):
    s = tuple(int(x) for x in s)
    return f"(c_int64 * {len(s)})(*{s!r})" if s else "None", len(s)


def _dims(d):
    d = [int(x) for x in (d if isinstance(d, (list, tuple)) else [d])]
    return f"(c_int * {len(d)})(*{d!r})", len(d)


# ---- the lowering table: op name -> fn(g, n) returning an expression of a
# new handle (wrapped in W()), or a full right-hand side with "=" prefix ----
LOWER = {}


def lower(*names):
    def reg(fn):
        for nm in names:
            LOWER[nm] = fn
        return fn

    return reg


def _binary(cname, cscalar=None, scalar_first=None):
    def fn(g, n):
        a, b = n.args[0], n.args[1]
        alpha = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1)
        _float_only(n, a, b)
        sb, sa = _scalar(b), _scalar(a)
        if cscalar and sb is not None and not (hasattr(b, "shape") and b.shape and len(b.shape) > 0):
            return cscalar(g, n, _cast_to(g, n, a), sb * alpha)
        if sa is not None and scalar_first and not (hasattr(a, "shape") and a.shape and len(a.shape) > 0):
            return scalar_first(g, n, _cast_to(g, n, b), sa, alpha)
        if alpha != 1:
            bb = g.sub(f"W(L.ts_mul_scalar({_cast_to(g, n, b)}, {float(alpha)!r}))")
        else:
            bb = _cast_to(g, n, b)
        return f"W(L.{cname}({_cast_to(g, n, a)}, {bb}))"

    return fn


def _add_s(g, n, a, s):
    return f"W(L.ts_add_scalar({a}, {s!r}))"


def _sub_s(g, n, a, s):
    return f"W(L.ts_add_scalar({a}, {-s!r}))"


def _mul_s(g, n, a, s):
    return f"W(L.ts_mul_scalar({a}, {s!r}))"


def _div_s(g, n, a, s):
    return f"W(L.ts_mul_scalar({a}, {1.0 / s!r}))" if s != 0 else f"W(L.ts_mul_scalar({a}, float('inf')))"


def _rsub_first(g, n, b, s, alpha):  # s - b*alpha
    return f"W(L.ts_add_scalar({g.sub(f'W(L.ts_mul_scalar({b}, {-float(alpha)!r}))')}, {s!r}))"


def _mul_first(g, n, b, s, alpha):
    return f"W(L.ts_mul_scalar({b}, {s!r}))"


def _add_first(g, n, b, s, alpha):
    return f"W(L.ts_add_scalar({g.sub(f'W(L.ts_mul_scalar({b}, {float(alpha)!r}))')}, {s!r}))" if alpha != 1 \
        else f"W(L.ts_add_scalar({b}, {s!r}))"


def _div_first(g, n, b, s, alpha):
    return f"W(L.ts_mul_scalar({g.sub(f'W(L.ts_pow_scalar({b}, -1.0))')}, {s!r}))"


LOWER["aten.add.Tensor"] = LOWER["aten.add.Scalar"] = _binary("ts_add", _add_s, _add_first)
LOWER["aten.mul.Tensor"] = LOWER["aten.mul.Scalar"] = _binary("ts_mul", _mul_s, _mul_first)
LOWER["aten.div.Tensor"] = LOWER["aten.div.Scalar"] = _binary("ts_div", _div_s, _div_first)


def _sub_first(g, n, b, s, alpha):
    return f"W(L.ts_add_scalar({g.sub(f'W(L.ts_mul_scalar({b}, {-float(alpha)!r}))')}, {s!r}))"


LOWER["aten.sub.Tensor"] = LOWER["aten.sub.Scalar"] = _binary("ts_sub", _sub_s, _sub_first)


@lower("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(g, n):
    a, b = n.args[0], n.args[1]
    alpha = float(n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1))
    _float_only(n, a, b)
    sb = _scalar(b)
    if sb is not None:
        return _rsub_first(g, n, _cast_to(g, n, a), sb, alpha)
    scaled = g.sub(f"W(L.ts_mul_scalar({_cast_to(g, n, a)}, {alpha!r}))")
    return f"W(L.ts_sub({_cast_to(g, n, b)}, {scaled}))"


for _nm in ("neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu", "silu"):
    LOWER[f"aten.{_nm}.default"] = (
        lambda c: lambda g, n: _float_only(n, n.args[0]) or f"W(L.{c}({g.t(n.args[0])}))")("ts_" + _nm)


@lower("aten.reciprocal.default")
def _recip(g, n):
    return f"W(L.ts_pow_scalar({g.t(n.args[0])}, -1.0))"


@lower("aten.gelu.default")
def _gelu(g, n):
    approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    return f"W(L.ts_gelu({g.t(n.args[0])}, {1 if approx == 'tanh' else 0}))"


@lower("aten.pow.Tensor_Scalar")
def _pow(g, n):
    _float_only(n, n.args[0])
    return f"W(L.ts_pow_scalar({g.t(n.args[0])}, {float(n.args[1])!r}))"


def _reduce(cname):
    def fn(g, n):
        x = n.args[0]
        _float_only(n, x)
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
        if n.kwargs.get("dtype") not in (None, n.dtype):
            raise Error("dtype argument")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            return f"W(L.{cname}({g.t(x)}, 0, None, {keep}))"
        d, k = _dims(dims)
        return f"W(L.{cname}({g.t(x)}, {k}, {d}, {keep}))"

    return fn


LOWER["aten.sum.dim_IntList"] = LOWER["aten.sum.default"] = _reduce("ts_sum")
LOWER["aten.mean.dim"] = LOWER["aten.mean.default"] = _reduce("ts_mean")
LOWER["aten.amax.default"] = _reduce("ts_amax")


@lower("aten.max.dim")
def _max_dim(g, n):
    x, dim = n.args[0], int(n.args[1])
    keep = bool(n.args[2]) if len(n.args) > 2 else False
    return f"=(W(L.ts_max({g.t(x)}, {dim}, {keep})), W(L.ts_argmax({g.t(x)}, {dim}, {keep})))"


@lower("aten._softmax.default")
def _softmax(g, n):
    _float_only(n, n.args[0])
    return f"W(L.ts_softmax({g.t(n.args[0])}, {int(n.args[1])}))"


@lower("aten._log_softmax.default")
def _log_softmax(g, n):
    return f"W(L.ts_log_softmax({g.t(n.args[0])}, {int(n.args[1])}))"


@lower("ts.matmul", "aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(g, n):
    return f"W(L.ts_matmul({g.t(n.args[0])}, {g.t(n.args[1])}))"


@lower("ts.linear")
def _linear(g, n):
    x, w, b = n.args
    return f"W(L.ts_linear({g.t(x)}, {g.t(w)}, {g.t(b)}))"


@lower("aten.addmm.default")
def _addmm(g, n):
    if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
        raise Error("beta/alpha other than 1")
    b, x, w = n.args
    return f"W(L.ts_add({g.sub(f'W(L.ts_matmul({g.t(x)}, {g.t(w)}))')}, {g.t(b)}))"


@lower("ts.rms_norm")
def _rms(g, n):
    x, w, eps = n.args
    return f"W(L.ts_rmsnorm({g.t(x)}, {g.t(w)}, {eps!r}))"


@lower("ts.rope")
def _rope(g, n):
    x, cos, sin = n.args
    return f"W(L.ts_rope({g.t(x)}, C[{g.const(cos)}]._h, C[{g.const(sin)}]._h))"


@lower("ts.attention")
def _attn(g, n):
    q, k, v, mask, causal, scale = n.args
    m = g.t(mask) if mask is not None else "None"
    return f"W(L.ts_attention({g.t(q)}, {g.t(k)}, {g.t(v)}, {m}, {bool(causal)}, {float(scale)!r}))"


@lower("aten.view.default", "aten._unsafe_view.default", "aten._reshape_alias.default",
       "aten.reshape.default", "aten.squeeze.default", "aten.flatten.using_ints")
def _reshape(g, n):
    s, k = _shape(n.shape)
    return f"W(L.ts_reshape({g.t(n.args[0])}, {k}, {s}))"


@lower("aten.expand.default")
def _expand(g, n):
    s, k = _shape(n.shape)
    return f"W(L.ts_expand({g.t(n.args[0])}, {k}, {s}))"


@lower("aten.permute.default")
def _permute(g, n):
    d, _ = _dims(n.args[1])
    return f"W(L.ts_permute({g.t(n.args[0])}, {d}))"


@lower("aten.transpose.int")
def _transpose(g, n):
    return f"W(L.ts_transpose({g.t(n.args[0])}, {int(n.args[1])}, {int(n.args[2])}))"


@lower("aten.t.default")
def _t(g, n):
    if len(n.shape) < 2:
        return f"={n.args[0].var}"
    return f"W(L.ts_transpose({g.t(n.args[0])}, 0, 1))"


@lower("aten.unsqueeze.default")
def _unsqueeze(g, n):
    return f"W(L.ts_unsqueeze({g.t(n.args[0])}, {int(n.args[1])}))"


@lower("aten.squeeze.dim")
def _squeeze(g, n):
    return f"W(L.ts_squeeze({g.t(n.args[0])}, {int(n.args[1])}))"


_BIG = (1 << 62)


@lower("aten.slice.Tensor")
def _slice(g, n):
    a = list(n.args) + [None] * 5
    dim = int(a[1]) if a[1] is not None else 0
    start = 0 if a[2] is None else max(min(int(a[2]), _BIG), -_BIG)
    end = _BIG if a[3] is None else max(min(int(a[3]), _BIG), -_BIG)
    step = 1 if a[4] is None else int(a[4])
    return f"W(L.ts_slice({g.t(n.args[0])}, {dim}, {start}, {end}, {step}))"


@lower("aten.select.int")
def _select(g, n):
    x, dim, i = n.args[0], int(n.args[1]), int(n.args[2])
    if x.shape is None:
        raise Error("an operand of unknown shape")
    if i < 0:
        i += x.shape[dim]
    return f"W(L.ts_squeeze({g.sub(f'W(L.ts_slice({g.t(x)}, {dim}, {i}, {i + 1}, 1))')}, {dim}))"


@lower("aten.clone.default")
def _clone(g, n):
    return f"W(L.ts_copy({g.t(n.args[0])}))"


@lower("aten.alias.default", "aten.lift_fresh.default")
def _alias(g, n):
    return f"={n.args[0].var}"


@lower("aten.detach.default")
def _detach(g, n):
    return f"W(L.ts_detach({g.t(n.args[0])}))" if g.train else f"={n.args[0].var}"


@lower("aten._to_copy.default")
def _to_copy(g, n):
    dt = n.kwargs.get("dtype")
    src = _arg_dtype(n.args[0])
    if dt is None or dt == src:
        return f"W(L.ts_copy({g.t(n.args[0])}))"
    return f"W(L.ts_cast({g.t(n.args[0])}, {ts_dtype(dt)}))"


@lower("aten.cat.default")
def _cat(g, n):
    xs = n.args[0]
    dim = int(n.args[1]) if len(n.args) > 1 else 0
    hs = ", ".join(_cast_to(g, n, x) for x in xs)
    return f"W(L.ts_concat({len(xs)}, (c_void_p * {len(xs)})({hs}), {dim}))"


@lower("aten.stack.default")
def _stack(g, n):
    xs = n.args[0]
    dim = int(n.args[1]) if len(n.args) > 1 else 0
    if dim < 0:
        dim += len(n.shape)
    keep = []
    for x in xs:
        keep.append(f"W(L.ts_unsqueeze({_cast_to(g, n, x)}, {dim}))")
    return f"CAT([{', '.join(keep)}], {dim})"


@lower("aten.split.Tensor", "aten.split_with_sizes.default")
def _split(g, n):
    x = n.args[0]
    dim = int(n.args[2]) if len(n.args) > 2 else int(n.kwargs.get("dim", 0))
    size = x.shape[dim]
    if n.op == "aten.split.Tensor":
        step = int(n.args[1])
        sizes = [min(step, size - i) for i in range(0, size, step)]
    else:
        sizes = [int(s) for s in n.args[1]]
    s, k = _shape(sizes)
    return f"=SPLIT({g.t(x)}, {dim}, {k}, {s})"


@lower("ts.repeat_kv")
def _repeat_kv(g, n):
    x, d, r = n.args
    es = list(x.shape[:d + 1]) + [r] + list(x.shape[d + 1:])
    e, k = _shape(es)
    s, ks = _shape(n.shape)
    u = g.sub(f"W(L.ts_unsqueeze({g.t(x)}, {d + 1}))")
    ex = g.sub(f"W(L.ts_expand({u}, {k}, {e}))")
    return f"W(L.ts_reshape({ex}, {ks}, {s}))"


@lower("aten.index_select.default")
def _index_select(g, n):
    x, d, idx = n.args
    if not (getattr(idx, "const", False)):
        raise Error("an index that is not a constant")
    d = d % len(x.shape)
    view = [1] * len(x.shape)
    view[d] = -1
    index = idx.value.long().view(view).expand(n.shape).contiguous()
    return f"W(L.ts_gather({g.t(x)}, {d}, C[{g.const(index)}]._h))"


@lower("aten.unbind.int")
def _unbind(g, n):
    x = n.args[0]
    dim = int(n.args[1]) if len(n.args) > 1 else 0
    dim %= len(x.shape)
    k = x.shape[dim]
    return (f"=tuple(W(L.ts_squeeze(t._h, {dim})) for t in "
            f"SPLIT({g.t(x)}, {dim}, {k}, (c_int64 * {k})(*{(1,) * k!r})))")


@lower("aten.embedding.default")
def _embedding(g, n):
    w, ids = n.args[0], n.args[1]
    pad = n.args[2] if len(n.args) > 2 else n.kwargs.get("padding_idx", -1)
    if g.train and pad is not None and pad >= 0:
        raise Error(f"padding_idx={pad} in training (its row must get no gradient)")
    return f"W(L.ts_embedding({g.t(w)}, {g.t(ids)}))"


@lower("aten.native_layer_norm.default")
def _layer_norm(g, n):
    x, shape, w, b, eps = n.args
    if len(shape) != 1:
        raise Error("normalized over more than the last dim")
    return f"=(W(L.ts_layernorm({g.t(x)}, {g.t(w)}, {g.t(b)}, {float(eps)!r})), None, None)"


@lower("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(g, n):
    x, mask, value = n.args
    v = _scalar(value)
    if v is None:
        raise Error("a fill value that is not a scalar")
    return f"W(L.ts_masked_fill({g.t(x)}, {g.t(mask)}, {v!r}))"


@lower("aten.where.self")
def _where(g, n):
    c, a, b = n.args
    return f"W(L.ts_where({g.t(c)}, {_cast_to(g, n, a)}, {_cast_to(g, n, b)}))"


@lower("aten.native_dropout.default")
def _dropout(g, n):
    x, p, train = n.args
    if p != 0 and train:
        raise Error(f"dropout with p={p} in training mode (use p=0 or module.eval())")
    return f"=({n.args[0].var}, None)"


@lower("ts.cross_entropy")
def _nll(g, n):
    x, target, weight, reduction, ignore = n.args
    if weight is not None:
        raise Error("class weights")
    # nll(log_softmax(z)), folded by the capture (an nll over other
    # inputs has no lowering)
    z = x
    red = {0: 2, 1: 0, 2: 1}[int(reduction)]
    return f"=(W(L.ts_cross_entropy({g.t(z)}, {g.t(target)}, {int(ignore)}, {red})), None)"


@lower("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default",
       "aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default")
def _full_like(g, n):
    value = {"aten.zeros_like.default": 0.0, "aten.ones_like.default": 1.0,
             "aten.new_zeros.default": 0.0, "aten.new_ones.default": 1.0}.get(n.op)
    if value is None:
        value = float(n.args[1] if n.op == "aten.full_like.default" else n.args[2])
    s, k = _shape(n.shape)
    return f"W(L.ts_full(CTX, {ts_dtype(n.dtype)}, {k}, {s}, {value!r}))"


@lower("getitem")
def _getitem(g, n):
    return f"={n.args[0].var}[{int(n.args[1])}]"


_VIEW_OPS = ("aten.view.default", "aten._unsafe_view.default", "aten._reshape_alias.default",
             "aten.reshape.default", "aten.expand.default", "aten.permute.default",
             "aten.transpose.int", "aten.t.default", "aten.unsqueeze.default", "aten.squeeze.dim",
             "aten.squeeze.default", "aten.slice.Tensor", "aten.select.int", "aten.alias.default",
             "aten.detach.default", "aten.split.Tensor", "aten.split_with_sizes.default",
             "aten.unbind.int", "getitem", "ts.repeat_kv")


def inplace_as_outofplace(n):
    """The out-of-place op for an in-place one (x.add_(y) -> add(x, y)) when
    nothing else can see x change: x is an intermediate, not a view of
    another value, not read by anything else (no view of it exists); else
    None (an error naming it, or PyTorch with fallback)."""
    op = _INPLACE.get(n.op)
    x = n.args[0] if n.args else None
    if op is None or getattr(x, "op", "input") in ("input", "const") or x.const or \
            x.op in _VIEW_OPS or x.users != 1:
        return None
    return op


_INPLACE = {"aten.add_.Tensor": "aten.add.Tensor", "aten.mul_.Tensor": "aten.mul.Tensor",
            "aten.sub_.Tensor": "aten.sub.Tensor", "aten.div_.Tensor": "aten.div.Tensor",
            "aten.add_.Scalar": "aten.add.Scalar", "aten.mul_.Scalar": "aten.mul.Scalar"}


def fallback_fn(n, device, train):
    """Runs n's aten op in PyTorch on the host. Over Tessera values (train
    off: they are converted both ways through DLPack, no copy on the host)
    or, with train, over torch values with autograd on, between Tessera
    segments that are autograd nodes themselves."""
    from ._capture import N, _walk

    target = n.target

    def to_ts(r):
        if isinstance(r, torch.Tensor):
            return torch_to_ts(r, device)
        if isinstance(r, (tuple, list)):
            return type(r)(to_ts(x) for x in r)
        return r

    def fn(*vals):
        vi = iter(vals)

        def pick(a):
            if isinstance(a, N):
                if a.const:
                    return a.value
                v = next(vi)
                if train or v is None:
                    return v
                t = ts_to_torch(v)
                # Tessera holds booleans as 0/1 floats: PyTorch gets them back
                return t.to(a.dtype) if a.dtype is not None and t.dtype != a.dtype else t
            return a

        args = _walk(n.args, pick)
        kwargs = {k: _walk(v, pick) for k, v in n.kwargs.items()}
        if train:
            return target(*args, **kwargs)
        with torch.no_grad():
            return to_ts(target(*args, **kwargs))

    return fn
