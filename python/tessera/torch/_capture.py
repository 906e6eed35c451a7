"""_capture — a torch.nn.Module to a small graph of aten ops (IR), ready to
lower onto Tessera: captured with make_fx at concrete shapes (as
torch.compile's static-shape mode), parameters and user inputs as graph
inputs, buffers and everything computable from constants folded in
PyTorch at capture time, then peephole passes that give back what aten's
decompositions took apart: batched matmuls from expand/reshape/bmm,
linear layers, RMSNorm and scaled dot-product attention (fused kernels in
Tessera, with their backward rules).

Owns the IR (N) and the passes; lowering to Tessera calls is _lower.py's.
"""

import operator
import os
import re

import torch
from torch.fx.experimental import proxy_tensor
from torch.nn.utils import stateless

aten = torch.ops.aten

_TORCH_DIR = os.path.dirname(torch.__file__)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


class N:
    """One value of the graph: an input, a constant (value set), or an op
    over other N's (args may hold N's, lists of N's and Python constants)."""

    __slots__ = ("op", "target", "args", "kwargs", "shape", "dtype", "src", "users", "value",
                 "const", "input_index", "var", "state")

    def __init__(self, op, target=None, args=(), kwargs=None):
        self.op, self.target, self.args, self.kwargs = op, target, tuple(args), kwargs or {}
        self.shape = self.dtype = self.src = self.value = None
        self.users, self.const, self.input_index, self.var = 0, False, -1, None
        self.state = False  # a constant that is the module's state (a buffer)

    def __repr__(self):
        return f"N({self.op}, shape={self.shape})"


def is_inplace(target):
    """aten.add_.Tensor, aten.copy_.default, ...: ops that write an operand."""
    parts = str(target).split(".")
    return len(parts) >= 2 and parts[0] == "aten" and parts[1].endswith("_")


def op_name(target):
    if target is operator.getitem:
        return "getitem"
    return str(target)  # "aten.add.Tensor"


def user_frame(stack_trace):
    """(file, line, code) of the innermost frame of the user's code in an fx
    node's stack trace (neither torch's nor Tessera's)."""
    if not stack_trace:
        return None
    for m in _FRAME.finditer(stack_trace):
        if m.group(1).startswith("<"):  # fx's generated code, not a file
            continue
        f = os.path.abspath(m.group(1))
        if f.startswith(_TORCH_DIR) or f.startswith(_PKG_DIR):
            continue
        return f"{m.group(1)}:{m.group(2)} in {m.group(3)}: {m.group(4).strip()}"
    return None


def _walk(a, fn):
    """fn over the leaves of nested lists, tuples, namedtuples and dicts
    (fx's immutable ones become plain lists and dicts)."""
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return type(a)(*(_walk(x, fn) for x in a))
    if isinstance(a, tuple):
        return tuple(_walk(x, fn) for x in a)
    if isinstance(a, list):
        return [_walk(x, fn) for x in a]
    if isinstance(a, dict):
        d = {k: _walk(v, fn) for k, v in a.items()}
        return d if type(a).__name__ == "immutable_dict" else type(a)(d)
    return fn(a)


def _has_node(a):
    found = []
    _walk(a, lambda x: found.append(x) if isinstance(x, N) else None)
    return bool(found)


def state_aliases(module, tensors, kind):
    """For each tensor (parameters or buffers of module, kind "_parameters"
    or "_buffers"), every name it has: a tied weight (GPT-2's wte and
    lm_head) is one tensor under two names, and functional_call must swap
    both for the same graph input."""
    names = {id(t): [] for t in tensors}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for name, t in getattr(m, kind).items():
            if t is not None and id(t) in names:
                names[id(t)].append(f"{prefix}.{name}" if prefix else name)
    return [names[id(t)] for t in tensors]


def trace(module, state_names, state, inputs, rebuild):
    """make_fx of module(*rebuild(inputs)) with state (parameters, buffers)
    as explicit inputs, state_names[i] the names of state[i]; returns the fx
    GraphModule. rebuild puts the input tensors back among the call's other
    (constant) arguments."""
    n_state = len(state)

    def f(*flat):
        d = {name: t for names, t in zip(state_names, flat[:n_state]) for name in names}
        return stateless.functional_call(module, d, tuple(rebuild(flat[n_state:])))

    old = proxy_tensor.PythonKeyTracer.record_stack_traces
    proxy_tensor.PythonKeyTracer.record_stack_traces = True
    try:
        with torch.no_grad():
            return proxy_tensor.make_fx(f)(*state, *inputs)
    finally:
        proxy_tensor.PythonKeyTracer.record_stack_traces = old


def to_ir(gm, n_params, n_buffers, buffers):
    """The fx graph as a list of N (in order) and the output structure.
    Placeholders: parameters (graph inputs), buffers (constants: their
    values now), then the user's inputs (graph inputs)."""
    env, nodes, inputs = {}, [], []
    k = 0
    out = None
    for fx in gm.graph.nodes:
        if fx.op == "placeholder":
            if n_params <= k < n_params + n_buffers:
                n = N("const")
                n.const, n.value, n.state = True, buffers[k - n_params], True
            else:
                n = N("input")
                n.input_index = len(inputs)
                inputs.append(n)
            k += 1
        elif fx.op == "call_function" and isinstance(fx.target, type) and \
                issubclass(fx.target, tuple) and hasattr(fx.target, "_fields"):
            # a namedtuple the module returns: the structure, not an op
            env[fx] = fx.target(*_walk(fx.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a))
            continue
        elif fx.op == "call_function":
            args = _walk(fx.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
            kwargs = {key: _walk(v, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
                      for key, v in fx.kwargs.items()}
            n = N(op_name(fx.target), fx.target, args, kwargs)
            n.src = user_frame(getattr(fx, "stack_trace", None))
            consts = not _has_node(list(args) + list(kwargs.values())) or all(
                a.const for a in _nodes_in(args, kwargs))
            # an update in place folds only into a constant of the capture's
            # own making, never into a buffer: that is the module's state
            if consts and not (is_inplace(fx.target) and (not args or not isinstance(args[0], N)
                                                          or args[0].state)):
                _fold(n)
        elif fx.op == "get_attr":  # a tensor constant the trace lifted
            n = N("const")
            n.const, n.value = True, getattr(gm, fx.target)
        elif fx.op == "output":
            out = _walk(fx.args[0], lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
            continue
        else:
            raise RuntimeError(f"tessera.torch: unexpected fx node {fx.op} {fx.target}")
        meta = fx.meta.get("tensor_meta")
        if meta is not None and hasattr(meta, "shape"):
            n.shape, n.dtype = tuple(meta.shape), meta.dtype
        env[fx] = n
        nodes.append(n)
    return nodes, inputs, out


def _nodes_in(args, kwargs):
    found = []

    def visit(a):
        if isinstance(a, N):
            found.append(a)
        return a

    _walk(list(args), visit)
    _walk(list(kwargs.values()), visit)
    return found


def _value(a):
    return a.value if isinstance(a, N) else a


def _fold(n):
    """Evaluates an op over constants in PyTorch, now."""
    args = _walk(n.args, _value)
    kwargs = {k: _walk(v, _value) for k, v in n.kwargs.items()}
    with torch.no_grad():
        n.value = n.target(*args, **kwargs)
    n.const = True
    n.op = "const"


# ---- peephole passes -------------------------------------------------------


def count_users(nodes, out):
    for n in nodes:
        n.users = 0
    for n in nodes:
        if n.op in ("const", "dead"):
            continue
        for a in _nodes_in(n.args, n.kwargs):
            a.users += 1
    for a in _nodes_in([out], {}):
        a.users += 1


def _is(n, *ops):
    return isinstance(n, N) and not n.const and n.op in ops


_VIEWS = ("aten.view.default", "aten._reshape_alias.default", "aten._unsafe_view.default",
          "aten.reshape.default")


def _unexpand(r):
    """bmm operand r = view(expand(A, s), [prod(s[:-2]), m, n]) with A of
    shape s (the expand a no-op): A, else None."""
    if not _is(r, *_VIEWS) or r.users != 1:
        return None
    e = r.args[0]
    if _is(e, "aten.clone.default") and e.users == 1 and not e.kwargs.get("memory_format"):
        e = e.args[0]  # the copy reshape makes of a strided operand
    elif _is(e, "aten.clone.default") and e.users == 1:
        e = e.args[0]
    if not _is(e, "aten.expand.default") or e.users != 1:
        return None
    a = e.args[0]
    if not isinstance(a, N) or a.shape is None or tuple(a.shape) != tuple(e.shape):
        return None
    return a


def fold_matmuls(nodes):
    """view(bmm(view(expand(A)), view(expand(B))), s) -> matmul(A, B): the
    4-D products torch.matmul decomposes into 3-D ones (and copies)."""
    for n in nodes:
        if not _is(n, *_VIEWS) or len(n.args) < 1:
            continue
        b = n.args[0]
        if not _is(b, "aten.bmm.default") or b.users != 1:
            continue
        A, B = _unexpand(b.args[0]), _unexpand(b.args[1])
        if A is None or B is None or len(A.shape) != len(n.shape) or len(B.shape) != len(n.shape):
            continue
        if tuple(A.shape[:-1]) + (B.shape[-1],) != tuple(n.shape) or A.shape[:-2] != B.shape[:-2]:
            continue  # the view regroups the product: not the 4-D matmul
        n.op, n.target, n.args, n.kwargs = "ts.matmul", None, (A, B), {}
        b.op = "dead"


def fold_linear(nodes):
    """addmm(b, x, t(W)) -> linear(x, W, b); mm(x, t(W)) -> linear(x, W)."""
    for n in nodes:
        if _is(n, "aten.addmm.default") and not n.kwargs:
            bias, x, wt = n.args
            if _is(wt, "aten.t.default") and isinstance(x, N):
                n.op, n.args = "ts.linear", (x, wt.args[0], bias)
        elif _is(n, "aten.mm.default"):
            x, wt = n.args
            if _is(wt, "aten.t.default"):
                n.op, n.args = "ts.linear", (x, wt.args[0], None)


def fold_rmsnorm(nodes):
    """x * rsqrt(mean(x^2 | x*x, -1, keepdim) + eps) [* w] -> rms_norm."""
    for n in nodes:
        if not _is(n, "aten.mul.Tensor"):
            continue
        for side in (0, 1):
            x, r = n.args[side], n.args[1 - side]
            if not (_is(r, "aten.rsqrt.default") and r.users == 1 and isinstance(x, N)):
                continue
            a = r.args[0]
            if not (_is(a, "aten.add.Tensor", "aten.add.Scalar") and a.users == 1
                    and isinstance(a.args[1], (int, float)) and not a.kwargs):
                continue
            m = a.args[0]
            if not (_is(m, "aten.mean.dim") and m.users == 1 and list(m.args[1]) in ([-1], [len(x.shape) - 1])
                    and len(m.args) > 2 and m.args[2]):
                continue
            q = m.args[0]
            ok = (_is(q, "aten.pow.Tensor_Scalar") and q.args[0] is x and q.args[1] == 2) or (
                _is(q, "aten.mul.Tensor") and q.args[0] is x and q.args[1] is x)
            if not ok or q.users != 1 or x.shape != n.shape:
                continue
            n.op, n.args, n.kwargs = "ts.rms_norm", (x, None, float(a.args[1])), {}
            for d in (r, a, m, q):
                d.op = "dead"
            break
    # rms_norm(x) * w (or w * rms_norm(x)) with w a 1-D weight -> rms_norm(x, w)
    for n in nodes:
        if not _is(n, "aten.mul.Tensor"):
            continue
        for side in (0, 1):
            r, w = n.args[side], n.args[1 - side]
            if (_is(r, "ts.rms_norm") and r.users == 1 and r.args[1] is None and isinstance(w, N)
                    and w.shape is not None and len(w.shape) == 1 and w.shape[0] == r.shape[-1]
                    and w.dtype == r.dtype):
                n.op, n.args = "ts.rms_norm", (r.args[0], w, r.args[2])
                r.op = "dead"
                break


def _transposed_last(k):
    """K when k is K transposed over its last two dims."""
    if _is(k, "aten.transpose.int") and k.users == 1:
        nd = len(k.shape)
        d0, d1 = sorted(d % nd for d in k.args[1:3])
        if (d0, d1) == (nd - 2, nd - 1):
            return k.args[0]
    if _is(k, "aten.permute.default") and k.users == 1:
        p = list(k.args[1])
        nd = len(p)
        if [d % nd for d in p] == list(range(nd - 2)) + [nd - 1, nd - 2]:
            return k.args[0]
    return None


def _causal_mask(mask, T, S):
    """True when mask (bool, True where masked) is exactly the causal one of
    the last T queries over S keys, broadcast."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return False
    ref = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
    try:
        return bool(torch.equal(mask.expand(*mask.shape[:-2], T, S), ref.expand(*mask.shape[:-2], T, S)))
    except RuntimeError:
        return False


def _replace_uses(nodes, out, old, new):
    def sub(a):
        return new if a is old else a

    for n in nodes:
        if n.op in ("dead", "const"):
            continue
        n.args = _walk(n.args, sub)
        n.kwargs = {k: _walk(v, sub) for k, v in n.kwargs.items()}
    return _walk(out, sub)


def fold_noop_slices(nodes, out):
    """slice(x, d, 0, >= size, 1) (what x[:, :, None] leaves around the
    new axis) is x itself."""
    for n in nodes:
        if _is(n, "aten.slice.Tensor") and isinstance(n.args[0], N) and n.args[0].shape is not None:
            a = list(n.args) + [None] * 5
            x = a[0]
            d = (a[1] or 0) % len(x.shape)
            if (a[2] in (0, None)) and (a[3] is None or a[3] >= x.shape[d]) and a[4] in (1, None) \
                    and n.shape == x.shape:
                out = _replace_uses(nodes, out, n, x)
                n.op = "dead"
    return out


def fold_repeat_interleave(nodes):
    """index_select(x, d, [0]*r + [1]*r + ...) (repeat_interleave(r, dim=d),
    how grouped-query attention repeats its key/value heads) -> repeat_kv."""
    for n in nodes:
        if not _is(n, "aten.index_select.default"):
            continue
        x, d, idx = n.args
        if not (isinstance(idx, N) and idx.const and isinstance(x, N) and x.shape is not None):
            continue
        d = d % len(x.shape)
        size = x.shape[d]
        iv = idx.value
        if iv.dim() != 1 or size == 0 or iv.numel() % size:
            continue
        r = iv.numel() // size
        if torch.equal(iv.cpu().long(), torch.arange(size).repeat_interleave(r)):
            n.op, n.args = "ts.repeat_kv", (x, d, r)
    # Hugging Face's repeat_kv: x[:, :, None].expand(B, KV, r, S, D).reshape(B, KV * r, S, D)
    for n in nodes:
        if not _is(n, *_VIEWS):
            continue
        e = n.args[0]
        if _is(e, "aten.clone.default") and e.users == 1:
            e = e.args[0]
        if not (_is(e, "aten.expand.default") and e.users == 1):
            continue
        u = e.args[0]
        if not (_is(u, "aten.unsqueeze.default") and u.users == 1):
            continue
        x = u.args[0]
        if not isinstance(x, N) or x.shape is None:
            continue
        d1 = u.args[1] % (len(x.shape) + 1)
        if d1 == 0:
            continue
        d = d1 - 1
        r = e.shape[d1]
        want = tuple(x.shape[:d]) + (x.shape[d] * r,) + tuple(x.shape[d + 1:])
        if tuple(e.shape[:d1]) + tuple(e.shape[d1 + 1:]) == tuple(x.shape) and tuple(n.shape) == want:
            n.op, n.target, n.args, n.kwargs = "ts.repeat_kv", None, (x, d, r), {}


def _rotate_half_of(c):
    """x when c is cat([-x[..., h:], x[..., :h]], -1) (Hugging Face's
    rotate_half), read only here; else None."""
    if not (_is(c, "aten.cat.default") and c.users == 1 and len(c.args[0]) == 2):
        return None
    nd = len(c.shape)
    dim = c.args[1] if len(c.args) > 1 else 0
    if dim % nd != nd - 1:
        return None
    ng, lo = c.args[0]
    if not (_is(ng, "aten.neg.default") and ng.users == 1):
        return None
    hi = ng.args[0]
    for sl in (hi, lo):
        if not (_is(sl, "aten.slice.Tensor") and sl.users == 1 and sl.args[1] % nd == nd - 1
                and (len(sl.args) < 5 or sl.args[4] == 1)):
            return None
    x = hi.args[0]
    D = c.shape[-1]
    h = D // 2
    if lo.args[0] is not x or D % 2 or hi.args[2] != h or lo.args[2] not in (0, None) or lo.args[3] != h \
            or hi.args[3] < D:
        return None
    return x


def _rope_table(t, T, D):
    """A (T, D) float32 table from a constant broadcast to (..., T, D)."""
    if not (isinstance(t, N) and t.const and isinstance(t.value, torch.Tensor)):
        return None
    v = t.value
    if v.dim() < 1 or v.shape[-1] != D or any(d != 1 for d in v.shape[:-2]):
        return None
    v = v.reshape(-1, D) if v.dim() >= 2 else v.reshape(1, D)
    if v.shape[0] not in (1, T):
        return None
    return v.expand(T, D).to(torch.float32).contiguous()


def fold_rope(nodes):
    """x * cos + rotate_half(x) * sin -> rope(x, cos, sin), cos and sin
    constant tables (T, D) (positions folded at capture)."""
    for n in nodes:
        if not (_is(n, "aten.add.Tensor") and not n.kwargs):
            continue
        for side in (0, 1):
            m1, m2 = n.args[side], n.args[1 - side]
            if not (_is(m1, "aten.mul.Tensor") and _is(m2, "aten.mul.Tensor") and m1.users == 1
                    and m2.users == 1):
                continue
            x = c = cos = sin = None
            for a, b in ((m2.args[0], m2.args[1]), (m2.args[1], m2.args[0])):
                if isinstance(a, N) and _rotate_half_of(a) is not None:
                    c, sin, x = a, b, _rotate_half_of(a)
                    break
            if x is None:
                continue
            if m1.args[0] is x:
                cos = m1.args[1]
            elif m1.args[1] is x:
                cos = m1.args[0]
            if cos is None or x.shape is None or len(x.shape) < 2 or x.shape != n.shape or \
                    x.dtype != torch.float32:
                continue
            T, D = x.shape[-2], x.shape[-1]
            tc, tsn = _rope_table(cos, T, D), _rope_table(sin, T, D)
            if tc is None or tsn is None:
                continue
            ng, lo = c.args[0]
            n.op, n.target, n.args, n.kwargs = "ts.rope", None, (x, tc, tsn), {}
            for d in (m1, m2, c, ng, ng.args[0], lo):
                d.op = "dead"
            break


def fold_cross_entropy(nodes):
    """nll_loss(log_softmax(z, -1), t) -> cross_entropy(z, t): one fused
    pass (and its backward) instead of a log-probability tensor."""
    for n in nodes:
        if _is(n, "aten.nll_loss_forward.default") and n.args[2] is None:
            x = n.args[0]
            if _is(x, "aten._log_softmax.default") and x.users == 1 and x.args[1] in (-1, 1) \
                    and len(x.shape) == 2:
                n.op, n.args = "ts.cross_entropy", (x.args[0],) + tuple(n.args[1:])
                x.op = "dead"


def fold_attention(nodes, train=False, dtype_ok=lambda dt: dt == torch.float32):
    """matmul(softmax([masked_fill|add](matmul(Q, K^T) [/ c | * c], mask), -1), V)
    -> scaled_dot_product_attention(Q, K, V, mask, causal, scale)."""
    for n in nodes:
        if not _is(n, "ts.matmul"):
            continue
        p, V = n.args
        if not (_is(p, "aten._softmax.default") and p.users == 1 and p.args[1] in (-1, len(p.shape) - 1)):
            continue
        s = p.args[0]
        mask = causal = None
        chain = [p]
        if _is(s, "aten.masked_fill.Scalar") and s.users == 1 and s.args[2] == float("-inf") \
                and isinstance(s.args[1], N) and s.args[1].const:
            mask, chain = ("fill", s.args[1].value), chain + [s]
            s = s.args[0]
        elif _is(s, "aten.add.Tensor") and s.users == 1 and isinstance(s.args[1], N) and s.args[1].const \
                and not s.kwargs:
            mask, chain = ("add", s.args[1].value), chain + [s]
            s = s.args[0]
        elif not train and _is(s, "aten.add.Tensor") and s.users == 1 and isinstance(s.args[1], N) \
                and not s.kwargs and s.args[1].dtype == torch.float32 and s.args[1].shape is not None \
                and len(s.args[1].shape) == 4:
            mask, chain = ("input", s.args[1]), chain + [s]  # a mask the caller passes
            s = s.args[0]
        scale = 1.0
        if _is(s, "aten.div.Tensor") and s.users == 1 and isinstance(s.args[1], (int, float)):
            scale, chain = 1.0 / float(s.args[1]), chain + [s]
            s = s.args[0]
        elif _is(s, "aten.mul.Tensor") and s.users == 1 and isinstance(s.args[1], (int, float)):
            scale, chain = float(s.args[1]), chain + [s]
            s = s.args[0]
        if not (_is(s, "ts.matmul") and s.users == 1) or not (0 < scale < float("inf")):
            continue  # (the kernel reads a scale <= 0 as 1/sqrt(D))
        Q, KT = s.args
        K = _transposed_last(KT)
        # grouped-query attention: the kernel reads each key/value head for
        # its H / KV query heads itself
        if _is(K, "ts.repeat_kv") and K.args[1] == 1 and K.users == 1 and \
                _is(V, "ts.repeat_kv") and V.args[1] == 1 and V.users == 1:
            chain += [K, V]
            K, V = K.args[0], V.args[0]
        if K is None or not all(isinstance(x, N) and x.shape is not None and len(x.shape) == 4
                                for x in (Q, K, V)):
            continue
        if not all(dtype_ok(x.dtype) for x in (Q, K, V)) or Q.shape[-1] != K.shape[-1] \
                or K.shape[:-1] != V.shape[:-1] or Q.shape[1] % K.shape[1] \
                or V.shape[-1] != Q.shape[-1]:
            continue
        T, S = Q.shape[2], K.shape[2]
        m_add = None
        causal = False
        if mask is not None:
            kind, mv = mask
            if kind == "fill" and _causal_mask(mv, T, S):
                causal = True
            elif kind == "add" and isinstance(mv, torch.Tensor) and mv.is_floating_point() \
                    and _causal_mask(torch.isneginf(mv), T, S) and bool((mv[~torch.isneginf(mv)] == 0).all()):
                causal = True
            elif kind == "fill":
                m_add = torch.zeros(mv.shape, dtype=torch.float32).masked_fill(mv.bool(), float("-inf"))
            elif kind == "input":
                m_add = mv
            else:
                m_add = mv.to(torch.float32)
            if m_add is not None:
                try:
                    torch.broadcast_shapes(tuple(m_add.shape), tuple(Q.shape[:2]) + (T, S))
                except RuntimeError:
                    continue
        n.op, n.args, n.kwargs = "ts.attention", (Q, K, V, m_add, causal, scale), {}
        for d in chain + [s, KT]:
            d.op = "dead"


def dead_code(nodes, out):
    """Counts readers again and kills what nothing reads (the views and
    expands around a folded bmm, ...), and so what only they read."""
    count_users(nodes, out)
    for n in reversed(nodes):
        # an update in place is read through its operand: never dead
        if n.op not in ("dead", "input", "const") and n.users == 0 and not is_inplace(n.target):
            n.op = "dead"
            for a in _nodes_in(n.args, n.kwargs):
                a.users -= 1


def simplify(nodes, out, train=False):
    out = fold_noop_slices(nodes, out)
    for fold in (fold_matmuls, fold_linear, fold_rmsnorm, fold_repeat_interleave, fold_attention,
                 fold_cross_entropy, fold_rope):
        dead_code(nodes, out)
        if fold is fold_attention:
            fold(nodes, train)
        else:
            fold(nodes)
    dead_code(nodes, out)
    return [n for n in nodes if n.op != "dead"], out
