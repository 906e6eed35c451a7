"""tessera.torch — PyTorch modules run on Tessera's devices, unchanged.

    cm = tessera.torch.compile(model, device="cpu")        # or "vulkan:0"
    logits = cm(ids)                                        # torch tensors in and out

    cm = tessera.torch.compile(model, train=True)
    loss = F.cross_entropy(cm(x).flatten(0, 1), y.flatten())
    loss.backward()                  # Tessera's autograd fills every p.grad
    opt.step()                       # torch.optim as usual

At the first call for each set of input shapes (dtypes, requires_grad) the
module is captured with torch.fx (make_fx: aten ops at those shapes),
simplified (_capture.py) and lowered to Tessera calls (_lower.py); later
calls replay it in Tessera's compiled mode, whose own plan cache (keyed by
the graph's structure and shapes) serves the repeated graph. Parameters are
handed over once: on the host Tessera reads the torch parameters' memory
itself (DLPack, zero copy), so optimizer steps are seen at once; on another
device they are copied there and copied again only when a parameter's
version changes (torch bumps it at every in-place update). Buffers are
constants of the capture (recaptured when one changes).

On torch >= 2 the same is registered as torch.compile(model,
backend="tessera").
"""

import builtins

import torch
from torch.utils import _pytree as pytree

from .. import _lib
from .._lib import Error, lib as L
from ..tensor import Tensor, _wrap
from . import _capture, _lower
from ._lower import UnsupportedOp, torch_to_ts, ts_to_torch

__all__ = ["compile", "UnsupportedOp", "CompiledModule"]

_c = _lib.ctypes


def _split(h, dim, n, sizes):
    outs = (_c.c_void_p * n)()
    _lib.check(L.ts_split(h, dim, n, sizes, outs))
    return tuple(_wrap(outs[i]) for i in range(n))


def _cat(ts, dim):
    arr = (_c.c_void_p * len(ts))(*[t._h for t in ts])
    return _wrap(L.ts_concat(len(ts), arr, dim))


_TUPLE_OPS = ("aten.native_layer_norm.default", "ts.cross_entropy", "aten.native_dropout.default")


class Segment:
    """Consecutive ops lowered to Tessera: a generated function of the
    values it reads from outside (in_nodes, in order) returning the values
    read after it (out_nodes)."""

    def __init__(self, in_nodes, out_nodes, lines, glb, name):
        self.in_nodes, self.out_nodes = in_nodes, out_nodes
        body = [f"{x.var} = I[{j}]" for j, x in enumerate(in_nodes)] + lines
        rets = [x.var for x in out_nodes]
        self.source = "def run(I):\n    " + "\n    ".join(body or ["pass"]) + \
            f"\n    return ({', '.join(rets)}{',' if len(rets) == 1 else ''})\n"
        g = dict(glb)
        exec(builtins.compile(self.source, name, "exec"), g)
        self.fn = g["run"]


class Program:
    """One capture: Tessera segments, split where ops run in PyTorch
    (fallback), and the module's output structure."""

    def __init__(self, cm, nodes, inputs, out, device_code, n_params):
        self.out_flat, self.out_spec = pytree.tree_flatten(out)
        self.inputs, self.n_params = inputs, n_params
        g = _lower.Codegen(device_code, cm.train)
        live = [n for n in nodes if n.op != "const"]
        for i, n in enumerate(live):
            n.var = f"v{i}"
        # each op: its line of Tessera code, or a PyTorch fallback
        items = []  # ("ts", node, line) | ("fb", node, fn) | ("get", node, None)
        for n in live:
            if n.op == "input":
                continue
            rhs, err = None, None
            op = n.op
            if n.op in _lower._INPLACE:
                op = _lower.inplace_as_outofplace(n)
            if n.op == "getitem" and items and any(k == "fb" and m is n.args[0] for k, m, _ in items):
                items.append(("get", n, None))  # an element of a fallback's result
                continue
            if op in _lower.LOWER:
                if n.op == "getitem" and n.args[0].op in _TUPLE_OPS and n.args[1] != 0:
                    err = _lower.unsupported(n.args[0], "its auxiliary outputs (statistics, masks)")
                else:
                    try:
                        rhs = _lower.LOWER[op](g, n)
                    except (Error, KeyError, TypeError, ValueError, IndexError) as e:
                        err = _lower.unsupported(n, str(e))
            else:
                err = _lower.unsupported(n)
            pre, tmps = g.take_pre()
            if rhs is None:
                if not cm.fallback or n.op.startswith("ts."):
                    raise err  # a folded node has no PyTorch op to fall back on
                items.append(("fb", n, _lower.fallback_fn(n, device_code, cm.train)))
            else:
                line = f"{n.var} {rhs}" if rhs.startswith("=") else f"{n.var} = {rhs}"
                if pre:  # temporaries alive through the line, then gone
                    line = "\n    ".join(pre + [line, "del " + ", ".join(tmps)])
                items.append(("ts", n, line))
        glb = {"W": _wrap, "L": L, "C": [t for _, t in g.consts], "CTX": _lib.ctx(),
               "SPLIT": _split, "CAT": _cat, "c_int64": _c.c_int64, "c_int": _c.c_int,
               "c_void_p": _c.c_void_p, "inf": float("inf"), "nan": float("nan")}
        # where each value is read last (item index); outputs: past the end
        last = {}
        for k, (_, n, _) in enumerate(items):
            for a in _capture._nodes_in(n.args, n.kwargs):
                last[id(a)] = k
        for a in self.out_flat:
            if isinstance(a, _capture.N):
                last[id(a)] = len(items)
        # runs of Tessera ops become segments
        self.steps = []  # ("seg", Segment) | ("fb", node, fn) | ("get", node)
        name = f"<tessera.torch.compile {type(cm.module).__name__}>"
        k = 0
        while k < len(items):
            kind, n, x = items[k]
            if kind != "ts":
                self.steps.append((kind, n, x))
                k += 1
                continue
            j = k
            while j < len(items) and items[j][0] == "ts":
                j += 1
            seg_nodes = [items[i][1] for i in range(k, j)]
            inside = {id(m) for m in seg_nodes}
            in_nodes, seen = [], set()
            if k == 0 and j == len(items):
                in_nodes = list(inputs)  # the whole program: every input, in order
                seen = {id(m) for m in inputs}
            lines = []
            for i in range(k, j):
                n = items[i][1]
                for a in _capture._nodes_in(n.args, n.kwargs):
                    if not a.const and id(a) not in inside and id(a) not in seen:
                        seen.add(id(a))
                        in_nodes.append(a)
                lines.append(items[i][2])
                dead = sorted({a.var for a in _capture._nodes_in(n.args, n.kwargs)
                               if not a.const and last.get(id(a)) == i})
                if dead:
                    lines.append("del " + ", ".join(dead))
            out_nodes = [m for m in seg_nodes if last.get(id(m), -1) >= j]
            self.steps.append(("seg", Segment(in_nodes, out_nodes, lines, glb, name), None))
            k = j
        self.single = len(self.steps) == 1 and self.steps[0][0] == "seg" and \
            self.steps[0][1].in_nodes == list(inputs)
        if self.single:  # where each output is: the segment's results or the inputs
            seg = self.steps[0][1]
            pos = {id(m): i for i, m in enumerate(seg.out_nodes)}
            self.pick = []
            for a in self.out_flat:
                if isinstance(a, _capture.N) and not a.const:
                    if id(a) in pos:
                        self.pick.append((0, pos[id(a)]))
                    elif a.op == "input":
                        self.pick.append((1, a.input_index))
                    else:
                        self.single = False
        self.source = "\n".join(st[1].source if st[0] == "seg" else f"# PyTorch: {st[1].op}\n"
                                for st in self.steps)

    def run(self, env, seg_fn):
        """Runs the steps over env (id(N) -> value, the inputs filled in);
        seg_fn(segment, values) runs a segment. Returns the output values."""
        for kind, n, x in self.steps:
            if kind == "seg":
                outs = seg_fn(n, [env[id(a)] for a in n.in_nodes])
                for m, v in zip(n.out_nodes, outs):
                    env[id(m)] = v
            elif kind == "fb":
                env[id(n)] = x(*[env[id(a)] for a in _capture._nodes_in(n.args, n.kwargs) if not a.const])
            else:
                env[id(n)] = env[id(n.args[0])][int(n.args[1])]
        return [env[id(a)] for a in self.out_flat if isinstance(a, _capture.N) and not a.const]

    def outputs(self, values):
        """The module's output structure with the run's values."""
        it = iter(values)
        flat = []
        for a in self.out_flat:
            if isinstance(a, _capture.N) and not a.const:
                v = next(it)
                if isinstance(v, torch.Tensor) and a.dtype is not None and v.dtype != a.dtype:
                    v = v.to(a.dtype)  # bool held as float, ...
                flat.append(v)
            else:
                flat.append(a.value if isinstance(a, _capture.N) else a)
        return pytree.tree_unflatten(flat, self.out_spec)


class _Mode:
    """Tessera's compiled (or eager) mode, grad mode and device for a call."""

    def __init__(self, cm, grad):
        self.cm, self.grad = cm, grad

    def __enter__(self):
        c = _lib.ctx()
        self.old_dev = L.ts_get_device(c)
        if self.cm.device is not None:  # first: a failure changes nothing
            _lib.check(L.ts_set_device(c, self.cm.device))
        self.old_mode = L.ts_set_mode(c, 0 if self.cm.mode == "eager" else 1)
        self.old_grad = L.ts_set_grad_enabled(c, self.grad)

    def __exit__(self, *exc):
        c = _lib.ctx()
        L.ts_set_device(c, self.old_dev)
        L.ts_set_grad_enabled(c, self.old_grad)
        L.ts_set_mode(c, self.old_mode)  # back to eager runs what is left


class _TesseraFunction(torch.autograd.Function):
    """A Tessera segment as one autograd node: forward in Tessera (its graph
    kept for backward), backward by Tessera's autograd; its inputs are the
    torch values it reads (parameters among them, whose gradients PyTorch
    then accumulates into .grad)."""

    @staticmethod
    def forward(ctx, cm, seg, n_params, *tensors):
        with _Mode(cm, True):
            leaves = []
            for a, t in zip(seg.in_nodes, tensors):
                if a.op == "input" and a.input_index < n_params:
                    leaves.extend(cm._state([t], grad=True))
                else:
                    leaves.append(cm._input(t, grad=t.requires_grad and t.is_floating_point()))
            outs = seg.fn(leaves)
            torch_outs = [ts_to_torch(o) for o in outs]
        ctx.cm, ctx.outs, ctx.leaves = cm, outs, leaves
        ctx.leaf_grad = [t.requires_grad for t in tensors]
        ctx.mark_non_differentiable(*[t for t in torch_outs if not t.is_floating_point()])
        return tuple(torch_outs)

    @staticmethod
    def backward(ctx, *grads):
        cm, outs = ctx.cm, ctx.outs
        if outs is None:
            raise Error("tessera.torch.compile: a second backward through the same forward "
                        "(retain_graph is not supported: call the module again)", "STATE")
        with _Mode(cm, False):
            pairs = [(o, g) for o, g in zip(outs, grads)
                     if g is not None and L.ts_tensor_dtype(o._h) in (0, 1, 2)]
            if pairs:
                gts = [torch_to_ts(g.contiguous(), cm.device) for _, g in pairs]
                if len(pairs) == 1:
                    _lib.check(L.ts_backward(pairs[0][0]._h, gts[0]._h))
                else:  # one root, sum(out_i * grad_i), recorded for autograd
                    old = L.ts_set_grad_enabled(_lib.ctx(), True)
                    root = None
                    for (o, _), g in zip(pairs, gts):
                        prod = _wrap(L.ts_mul(o._h, g._h))
                        term = _wrap(L.ts_sum(prod._h, 0, None, False))
                        root = term if root is None else _wrap(L.ts_add(root._h, term._h))
                    L.ts_set_grad_enabled(_lib.ctx(), old)
                    _lib.check(L.ts_backward(root._h, None))
            grads_out = []
            for leaf, wants in zip(ctx.leaves, ctx.leaf_grad):
                gh = L.ts_grad(leaf._h) if wants else None
                if gh:
                    grads_out.append(ts_to_torch(_wrap(L.ts_retain(gh))))
                    L.ts_zero_grad(leaf._h)
                else:
                    grads_out.append(None)
        ctx.outs = ctx.leaves = None  # the forward's graph goes with them
        return (None, None, None, *grads_out)


def _arg_key(a):
    """A call argument's part of the capture key: a tensor's shape, dtype and
    requires_grad; a plain value itself; any other object its identity (its
    value is baked into the capture)."""
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.dtype, a.requires_grad)
    if a is None or isinstance(a, (bool, int, float, str)):
        return ("value", type(a).__name__, a)
    return ("object", type(a).__name__, id(a))


class CompiledModule:
    """What compile() returns: call it as the module."""

    def __init__(self, module, device="cpu", train=False, fallback=False, mode="compiled"):
        if not isinstance(module, torch.nn.Module):
            raise Error(f"tessera.torch.compile: expected a torch.nn.Module, got {type(module).__name__}")
        if mode not in ("compiled", "eager"):
            raise Error(f"tessera.torch.compile: mode {mode!r} is not 'compiled' or 'eager'")
        self.module, self.train, self.fallback, self.mode = module, bool(train), bool(fallback), mode
        d = _lib.parse_device(device)
        self.device = None if (d.kind == 0 and d.index == 0) else d
        self.device_name = _lib.device_name(d)
        self._programs = {}
        self._params = {}  # id(param) -> (data_ptr, version, ts tensor)
        self.captures = 0

    def __repr__(self):
        return f"tessera.torch.compile({type(self.module).__name__}, device={self.device_name!r})"

    # ---- handing tensors to Tessera ----
    def _state(self, params, grad):
        out = []
        for p in params:
            ent = self._params.get(id(p))
            ptr, ver = p.data_ptr(), p._version
            if ent is None or ent[0] != ptr or ent[3] is not p:
                t = torch_to_ts(p.detach(), self.device)
                ent = [ptr, ver, t, p]
                self._params[id(p)] = ent
            elif self.device is not None and ent[1] != ver:
                host = torch_to_ts(p.detach(), None)
                _lib.check(L.ts_copy_(ent[2]._h, host._h))
                ent[1] = ver
            t = ent[2]
            want = bool(grad and p.requires_grad)
            if L.ts_requires_grad(t._h) != want:
                _lib.check(L.ts_set_requires_grad(t._h, want))
            out.append(t)
        return out

    def _input(self, x, grad):
        t = torch_to_ts(x.detach(), self.device)
        if grad:
            if self.device is None:
                t = _wrap(L.ts_detach(t._h))  # a leaf of its own
            _lib.check(L.ts_set_requires_grad(t._h, True))
        return t

    # ---- capture ----
    def _capture(self, args, tensors):
        params = list(self.module.parameters())
        bufs = list(self.module.buffers())
        flat, spec = pytree.tree_flatten(args)
        slots = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

        def rebuild(ts):
            f = list(flat)
            for i, t in zip(slots, ts):
                f[i] = t
            return pytree.tree_unflatten(f, spec)

        state_names = _capture.state_aliases(self.module, params, "_parameters") + \
            _capture.state_aliases(self.module, bufs, "_buffers")
        gm = _capture.trace(self.module, state_names,
                            [p.detach() for p in params] + [b.detach().clone() for b in bufs],
                            [t.detach().clone() for t in tensors], rebuild)
        nodes, inputs, out = _capture.to_ir(gm, len(params), len(bufs), [b.detach() for b in bufs])
        nodes, out = _capture.simplify(nodes, out, self.train)
        self.captures += 1
        return Program(self, nodes, inputs, out, self.device, len(params)), [(b, b._version) for b in bufs]

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise Error("tessera.torch.compile: keyword arguments are not taken; pass them positionally")
        flat, spec = pytree.tree_flatten(args)
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        grad = self.train and torch.is_grad_enabled()
        params = list(self.module.parameters())
        key = (str(spec), tuple(m.training for m in self.module.modules()), grad,
               tuple(_arg_key(a) for a in flat),
               tuple((p.dtype, tuple(p.shape)) for p in params))
        ent = self._programs.get(key)
        if ent is not None and (any(b._version != v for b, v in ent[1]) or
                                [id(b) for b, _ in ent[1]] != [id(b) for b in self.module.buffers()]):
            ent = None  # a buffer changed or was replaced: its value is baked in
        if ent is None:
            ent = self._capture(args, tensors)
            self._programs[key] = ent
        prog = ent[0]
        if grad and (any(p.requires_grad for p in params) or any(t.requires_grad for t in tensors)):
            env = {id(a): v for a, v in zip(prog.inputs, params + tensors)}
            n_params = prog.n_params
            outs = prog.run(env, lambda seg, vals: _TesseraFunction.apply(self, seg, n_params, *vals))
            return prog.outputs(outs)
        with _Mode(self, False):
            state = self._state(params, grad=False)
            ins = [torch_to_ts(t.detach(), self.device) for t in tensors]
            if prog.single:
                inputs = state + ins
                res = prog.steps[0][1].fn(inputs)
                outs = [res[i] if k == 0 else inputs[i] for k, i in prog.pick]
            else:
                env = {id(a): v for a, v in zip(prog.inputs, state + ins)}
                outs = prog.run(env, lambda seg, vals: seg.fn(vals))
            return prog.outputs([ts_to_torch(o) if isinstance(o, Tensor) else o for o in outs])


def compile(module, device="cpu", train=False, fallback=False, mode="compiled"):
    """module captured onto Tessera (see the package's doc): a callable with
    the module's signature whose outputs are torch tensors.

    device: "cpu" or "vulkan:0", ...; train: run the backward in Tessera and
    fill the parameters' .grad; fallback: ops Tessera lacks run in PyTorch
    (forward only) instead of raising UnsupportedOp; mode: "compiled" (one
    planned graph per call) or "eager" (op by op, to debug)."""
    return CompiledModule(module, device=device, train=train, fallback=fallback, mode=mode)


def _register_dynamo():
    dyn = getattr(torch, "_dynamo", None)
    if dyn is None or not hasattr(dyn, "register_backend"):
        return

    def tessera_backend(gm, example_inputs, **options):
        cm = CompiledModule(gm, **options)

        def run(*a):
            out = cm(*a)
            return out if isinstance(out, (tuple, list)) else (out,)

        return run

    try:
        dyn.register_backend(name="tessera")(tessera_backend)
    except Exception:  # registered already, or an API that moved
        pass


_register_dynamo()
