#!/usr/bin/env python3
"""op_cases.py — PyTorch reference cases for tests/test_ops_torch.c.

Usage: op_cases.py OUT.bin

Writes every case to one little-endian binary file:

    file   := "TSCASE01" u32:ncases case*
    case   := str:name str:op str:attrs u32:ntensors tensor*
    tensor := str:name u32:dtype u32:ndim i64:shape[ndim] u64:nbytes data
    str    := u32:len bytes (no terminator)

dtype codes are ts_dtype's: 0 f32, 1 bf16 (raw bits), 2 f16, 3 i32, 4 i64.

Tensor names: in0, in1, ... the stored inputs (leaves; the C side builds them
with ts_from_data); out (or out0, out1, ... for ops with several results)
the expected results; gout / gout0, ... the upstream gradients g (the loss is
sum(out * g)); grad0, grad1, ... the expected gradients of the stored inputs
(present exactly for the inputs that require grad).

attrs is "key=value;key=value". Keys every case may carry:
  vN      view chain applied to stored input N before the op, parts joined by
          '/': T d0,d1 (transpose), P perm (permute), S dim,start,end,step
          (slice), E shape (expand), R shape (reshape), U d (unsqueeze),
          Q d (squeeze). E.g. "v0=T0,1/S1,0,9,2".
  rtol, atol   tolerance of the outputs; grtol, gatol   of the gradients.
  exact=1      outputs must match bit for bit (casts, argmax).
  isview=1     the output must share storage with stored input 0.
  aN=j         input N is the same leaf as input j (no inN is stored).
  gabs=1       gatol is absolute. Otherwise the C side scales atol by the
               largest |expected| when that is below 1 (tiny results are
               checked to their own precision).
Op-specific keys are documented with the op in the C driver.

References: f32 cases are computed in float64 and rounded to f32; bf16 and
f16 cases are computed in float32 from the (exact) upcast inputs and rounded
once to bf16/f16 (outputs and gradients), which is what the library promises
("bf16/f16 are computed in f32"). Seeds are fixed, so the file is identical
on every run.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(20240601)
torch.set_num_threads(1)

F32, BF16, F16, I32, I64 = (torch.float32, torch.bfloat16, torch.float16,
                             torch.int32, torch.int64)
DTYPE_CODE = {F32: 0, BF16: 1, F16: 2, I32: 3, I64: 4}
BIG = 9223372036854775807  # "to the end" for slices (clamped as in Python)

# Tolerances (rtol, atol) per dtype and kind of op. The reference is exact up
# to rounding of the result, so these are the library's own error budget.
#   ew:   elementwise (one or two roundings of a few-flop formula)
#   red:  reductions, normalizations, softmax (sums of up to 1000 terms)
#   mm:   matmul (dot products of up to 1000 terms, BLAS order)
#   attn: fused attention, cross entropy (online softmax + two matmuls)
# bf16 has 8 mantissa bits (ulp 2^-8 = 0.4%), f16 has 11 (ulp 0.05%).
TOL = {
    'ew':   {F32: (1e-4, 1e-5), BF16: (2e-2, 1e-2), F16: (4e-3, 2e-3)},
    'red':  {F32: (1e-4, 1e-4), BF16: (2e-2, 2e-2), F16: (5e-3, 5e-3)},
    'mm':   {F32: (2e-4, 2e-4), BF16: (2e-2, 3e-2), F16: (5e-3, 5e-3)},
    'attn': {F32: (5e-4, 5e-4), BF16: (3e-2, 3e-2), F16: (1e-2, 1e-2)},
}

cases = []


# ---- input helpers ----------------------------------------------------------

def randn(*shape, dt=F32, scale=1.0):
    return (torch.randn(tuple(shape), dtype=torch.float64) * scale).to(dt)


def uniform(lo, hi, *shape, dt=F32):
    u = torch.rand(tuple(shape), dtype=torch.float64)
    return (u * (hi - lo) + lo).to(dt)


def away_from_zero(*shape, dt=F32):
    """|x| in [0.5, 2), random sign: safe divisors, abs without x == 0."""
    mag = uniform(0.5, 2.0, *shape, dt=torch.float64)
    sign = torch.where(torch.rand(tuple(shape)) < 0.5, -1.0, 1.0).double()
    return (mag * sign).to(dt)


def distinct(*shape, dt=F32):
    """No ties anywhere: a permutation of (k - numel/2)/8 for k < numel.
    Exact in bf16/f16 for numel <= 256 (|k - numel/2| < 256)."""
    n = 1
    for s in shape:
        n *= s
    assert n <= 256 or dt == F32
    vals = (torch.randperm(n).double() - n / 2) / 8.0
    return vals.reshape(*shape).to(dt)


# ---- views ------------------------------------------------------------------

def apply_view(t, spec):
    if not spec:
        return t
    for part in spec.split('/'):
        c = part[0]
        args = [int(a) for a in part[1:].split(',')] if len(part) > 1 else []
        if c == 'T':
            t = t.transpose(args[0], args[1])
        elif c == 'P':
            t = t.permute(*args)
        elif c == 'S':
            d, s, e, st = args
            idx = [slice(None)] * t.dim()
            idx[d] = slice(s, e, st)
            t = t[tuple(idx)]
        elif c == 'E':
            t = t.expand(*args)
        elif c == 'R':
            t = t.reshape(*args)
        elif c == 'U':
            t = t.unsqueeze(args[0])
        elif c == 'Q':
            t = t.squeeze(args[0])
        else:
            raise ValueError(part)
    return t


# ---- the generic case runner ------------------------------------------------

def fmt_attr(v):
    if isinstance(v, bool):
        return '1' if v else '0'
    if isinstance(v, (list, tuple)):
        return ','.join(str(int(x)) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def case(name, op, ins, fn, attrs=None, views=None, grads=None, kind='ew',
         upcast=True, exact=False, isview=False, tol=None, gtol=None,
         backward=True):
    """ins: stored inputs. fn(*viewed_inputs) -> tensor or tuple.
    An entry of ins that is an int j makes that input the same leaf as input
    j (attr aN=j; usually with its own view): gradients from both uses
    accumulate into grad j.
    grads: indices of inputs that require grad (default: every float input
    when backward is True). kind picks the tolerance from TOL unless tol
    (and gtol) are given explicitly."""
    attrs = dict(attrs or {})
    views = dict(views or {})
    stored = [t for t in ins if isinstance(t, torch.Tensor)]
    fdt = next((t.dtype for t in stored if t.is_floating_point()), F32)
    if grads is None:
        grads = [i for i, t in enumerate(ins) if isinstance(t, torch.Tensor)
                 and t.is_floating_point()] if backward else []
    leaves = []
    for i, t in enumerate(ins):
        if not isinstance(t, torch.Tensor):
            leaves.append(leaves[t])
            attrs['a%d' % i] = t
            continue
        if t.is_floating_point():
            cdt = torch.float64 if t.dtype == F32 else F32
            leaf = t.to(cdt) if upcast else t.clone()
            if i in grads:
                leaf.requires_grad_()
        else:
            leaf = t.clone()
        leaves.append(leaf)
    xs = [apply_view(l, views.get(i)) for i, l in enumerate(leaves)]
    outs = fn(*xs)
    multi = isinstance(outs, (tuple, list))
    if not multi:
        outs = (outs,)
    tensors = [('in%d' % i, t) for i, t in enumerate(ins)
               if isinstance(t, torch.Tensor)]
    exp = []
    for o in outs:
        if upcast and o.is_floating_point():
            exp.append(o.detach().to(fdt))
        else:
            exp.append(o.detach().clone())
    for j, e in enumerate(exp):
        tensors.append(('out%d' % j if multi else 'out', e))
    if grads:
        loss = 0
        for j, (o, e) in enumerate(zip(outs, exp)):
            if not o.is_floating_point():
                continue
            g = randn(*e.shape, dt=e.dtype)
            tensors.append(('gout%d' % j if multi else 'gout', g))
            loss = loss + (o * g.to(o.dtype)).sum()
        loss.backward()
        for i in grads:
            g = leaves[i].grad
            if g is None:
                g = torch.zeros_like(leaves[i])
            tensors.append(('grad%d' % i, g.to(ins[i].dtype)))
    rt, at = tol if tol is not None else TOL[kind][fdt]
    grt, gat = gtol if gtol is not None else (
        tol if tol is not None else TOL[kind][fdt])
    attrs.update({'rtol': rt, 'atol': at, 'grtol': grt, 'gatol': gat})
    for i, spec in views.items():
        attrs['v%d' % i] = spec
    if exact:
        attrs['exact'] = 1
    if isview:
        attrs['isview'] = 1
    astr = ';'.join('%s=%s' % (k, fmt_attr(v)) for k, v in attrs.items())
    assert not any(c[0] == name for c in cases), name
    cases.append((name, op, astr, tensors))


# ---- elementwise ------------------------------------------------------------

BIN = {'add': torch.add, 'sub': torch.sub, 'mul': torch.mul,
       'div': torch.div}


def binary_cases():
    shapes = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 5), (3, 1)),
              ((1,), (17,)), ((1000,), (1000,)), ((4, 1, 3), (1, 5, 1)),
              ((), (3, 2))]
    for op, f in BIN.items():
        for sa, sb in shapes:
            a = randn(*sa)
            b = away_from_zero(*sb) if op == 'div' else randn(*sb)
            nm = '%s_%s_%s' % (op, 'x'.join(map(str, sa)) or 's',
                               'x'.join(map(str, sb)) or 's')
            case(nm, op, [a, b], f)
        # non-contiguous: transposed a, sliced-with-step b, broadcast
        a = randn(5, 3)
        b = away_from_zero(2, 11) if op == 'div' else randn(2, 11)
        case(op + '_T_slice', op, [a, b], f,
             views={0: 'T0,1/U1', 1: 'S1,1,11,2/U0'})  # (3,1,5) (1,2,5)
        a = randn(4, 2, 3)
        b = away_from_zero(2, 4) if op == 'div' else randn(2, 4)
        case(op + '_perm_bcast', op, [a, b], f,
             views={0: 'P2,0,1', 1: 'T0,1'})  # (3,4,2) op (4,2)
        for dt in (BF16, F16):
            a = randn(3, 17, dt=dt)
            b = (away_from_zero(17, dt=dt) if op == 'div'
                 else randn(17, dt=dt))
            case('%s_%s_bcast' % (op, 'bf16' if dt == BF16 else 'f16'), op,
                 [a, b], f)
        a = randn(6, 5, dt=BF16)
        b = (away_from_zero(5, 3, dt=BF16) if op == 'div'
             else randn(5, 3, dt=BF16))
        case(op + '_bf16_views', op, [a, b], f,
             views={0: 'S0,0,6,2/T0,1', 1: ''})  # (5,3) and (5,3)


def unary_cases():
    def pos(*s, dt=F32):
        return uniform(0.1, 4.0, *s, dt=dt)
    un = {
        'neg': (torch.neg, randn),
        'exp': (torch.exp, randn),
        'log': (torch.log, pos),
        'sqrt': (torch.sqrt, pos),
        'rsqrt': (torch.rsqrt, pos),
        'abs': (torch.abs, away_from_zero),
        'tanh': (torch.tanh, lambda *s, dt=F32: randn(*s, dt=dt, scale=2.0)),
        'sigmoid': (torch.sigmoid,
                    lambda *s, dt=F32: randn(*s, dt=dt, scale=3.0)),
        'relu': (torch.relu, randn),
        'silu': (F.silu, lambda *s, dt=F32: randn(*s, dt=dt, scale=2.0)),
    }
    for op, (f, gen) in un.items():
        case(op + '_1000', op, [gen(1000)], f)
        case(op + '_1', op, [gen(1)], f)
        case(op + '_T', op, [gen(3, 17)], f, views={0: 'T0,1'})
        case(op + '_slice', op, [gen(4, 9, 2)], f,
             views={0: 'S1,1,9,3/P2,0,1'})
        case(op + '_bf16', op, [gen(5, 17, dt=BF16)], f)
        case(op + '_f16', op, [gen(17, 3, dt=F16)], f, views={0: 'T0,1'})
    for approx, nm in ((0, 'erf'), (1, 'tanh')):
        f = (lambda x: F.gelu(x)) if approx == 0 else (
            lambda x: F.gelu(x, approximate='tanh'))
        case('gelu_%s_1000' % nm, 'gelu', [randn(1000, scale=2.0)], f,
             attrs={'approx': approx})
        case('gelu_%s_wide' % nm, 'gelu', [randn(999, scale=6.0)], f,
             attrs={'approx': approx})
        case('gelu_%s_T' % nm, 'gelu', [randn(3, 17, scale=2.0)], f,
             attrs={'approx': approx}, views={0: 'T0,1'})
        case('gelu_%s_bf16' % nm, 'gelu', [randn(4, 17, dt=BF16, scale=2.0)],
             f, attrs={'approx': approx})
        case('gelu_%s_f16' % nm, 'gelu', [randn(4, 17, dt=F16, scale=2.0)],
             f, attrs={'approx': approx})
    for s in (2.5, -0.75):
        sn = str(s).replace('-', 'm').replace('.', 'p')
        case('add_scalar_%s' % sn, 'add_scalar', [randn(3, 17)],
             lambda x, s=s: x + s, attrs={'s': s})
        case('mul_scalar_%s' % sn, 'mul_scalar', [randn(3, 17)],
             lambda x, s=s: x * s, attrs={'s': s})
    case('add_scalar_T_bf16', 'add_scalar', [randn(17, 3, dt=BF16)],
         lambda x: x + 0.5, attrs={'s': 0.5}, views={0: 'T0,1'})
    case('mul_scalar_slice', 'mul_scalar', [randn(1000)],
         lambda x: x * 3.0, attrs={'s': 3.0}, views={0: 'S0,1,1000,3'})
    case('mul_scalar_f16', 'mul_scalar', [randn(33, dt=F16)],
         lambda x: x * -1.5, attrs={'s': -1.5})
    for p in (2.0, 3.0, 0.5, -1.5):
        pn = str(p).replace('-', 'm').replace('.', 'p')
        needs_pos = p != int(p) or p < 0
        gen = ((lambda *s, dt=F32: uniform(0.2, 3.0, *s, dt=dt)) if needs_pos
               else randn)
        case('pow_%s' % pn, 'pow_scalar', [gen(4, 17)],
             lambda x, p=p: torch.pow(x, p), attrs={'p': p})
        case('pow_%s_T_bf16' % pn, 'pow_scalar', [gen(17, 4, dt=BF16)],
             lambda x, p=p: torch.pow(x, p), attrs={'p': p},
             views={0: 'T0,1'})


def where_cases():
    c = (torch.rand(3, 1) < 0.5).to(I32)
    c[0, 0], c[1, 0] = 0, 1
    case('where_bcast_cond', 'where', [c, randn(1, 4), randn(3, 4)],
         lambda c, a, b: torch.where(c != 0, a, b))
    c = (torch.rand(2, 3, 4) < 0.5).to(I64)
    case('where_i64_bcast_ab', 'where', [c, randn(4), randn(3, 1)],
         lambda c, a, b: torch.where(c != 0, a, b))
    c = torch.where(torch.rand(5, 4) < 0.5, 0.0, 2.5).float()
    case('where_f32cond_T', 'where', [c, randn(4, 5), randn(5, 4)],
         lambda c, a, b: torch.where(c != 0, a, b), views={1: 'T0,1'},
         grads=[1, 2])
    c = (torch.rand(17) < 0.5).to(I32)
    case('where_bf16', 'where', [c, randn(3, 17, dt=BF16),
                                 randn(3, 17, dt=BF16)],
         lambda c, a, b: torch.where(c != 0, a, b))


def masked_fill_cases():
    m = (torch.rand(4) < 0.5).to(I32)
    m[0], m[1] = 0, 1
    case('masked_fill_bcast', 'masked_fill', [randn(3, 4), m],
         lambda x, m: x.masked_fill(m != 0, -5.0), attrs={'value': -5.0})
    m = (torch.rand(3, 5) < 0.3).to(I64)
    case('masked_fill_neginf_T', 'masked_fill', [randn(5, 3), m],
         lambda x, m: x.masked_fill(m != 0, float('-inf')),
         attrs={'value': '-inf'}, views={0: 'T0,1'})
    m = (torch.rand(2, 1, 17) < 0.5).to(I32)
    case('masked_fill_bf16', 'masked_fill', [randn(2, 3, 17, dt=BF16), m],
         lambda x, m: x.masked_fill(m != 0, 1.25), attrs={'value': 1.25})


# ---- reductions -------------------------------------------------------------

def red_cases():
    fns = {
        'sum': lambda x, d, k: x.sum(dim=d, keepdim=k),
        'mean': lambda x, d, k: x.mean(dim=d, keepdim=k),
        'amax': lambda x, d, k: x.amax(dim=d, keepdim=k),
    }
    configs = [
        ('d02', (3, 4, 5), [0, 2], None),
        ('dm1', (3, 4, 5), [-1], None),
        ('d1', (3, 4, 5), [1], None),
        ('all', (3, 4, 5), [], None),
        ('all1000', (1000,), [], None),
        ('d0_17x3', (17, 3), [0], None),
        ('dm2m1_T', (4, 5, 3), [-2, -1], 'P2,0,1'),   # (3,4,5)
        ('d1_slice', (3, 12), [1], 'S1,0,12,3'),      # (3,4)
        ('d0_1', (1, 5), [0], None),
    ]
    for op, f in fns.items():
        for nm, shape, dims, view in configs:
            for keep in (False, True):
                if nm in ('d0_1', 'd1_slice', 'dm1') and keep:
                    continue
                gen = distinct if op == 'amax' else randn

                def fn(x, dims=dims, keep=keep, f=f):
                    d = dims if dims else list(range(x.dim()))
                    return f(x, d, keep)
                case('%s_%s_k%d' % (op, nm, keep), op, [gen(*shape)], fn,
                     attrs={'dims': dims, 'keepdim': keep},
                     views={0: view} if view else None, kind='red')
        for dt in (BF16, F16):
            gen = distinct if op == 'amax' else randn
            case('%s_%s_d1' % (op, 'bf16' if dt == BF16 else 'f16'), op,
                 [gen(3, 17, 2, dt=dt)], lambda x, f=f: f(x, [1], False),
                 attrs={'dims': [1], 'keepdim': 0}, kind='red')
            case('%s_%s_all' % (op, 'bf16' if dt == BF16 else 'f16'), op,
                 [gen(5, 17, dt=dt)], lambda x, f=f: f(x, [0, 1], False),
                 attrs={'dims': [], 'keepdim': 0}, kind='red',
                 views={0: 'T0,1'})
    for keep in (False, True):
        for dim in (0, 1, -1):
            case('max_d%d_k%d' % (dim, keep), 'max', [distinct(4, 5, 3)],
                 lambda x, d=dim, k=keep: torch.max(x, d, keepdim=k).values,
                 attrs={'dim': dim, 'keepdim': keep}, kind='red')
            case('argmax_d%d_k%d' % (dim, keep), 'argmax', [distinct(4, 5, 3)],
                 lambda x, d=dim, k=keep: torch.argmax(x, d, keepdim=k),
                 attrs={'dim': dim, 'keepdim': keep}, backward=False,
                 exact=True)
    case('max_1000', 'max', [distinct(1000)],
         lambda x: torch.max(x, 0).values, attrs={'dim': 0, 'keepdim': 0},
         kind='red')
    case('argmax_1000', 'argmax', [distinct(1000)],
         lambda x: torch.argmax(x, 0), attrs={'dim': 0, 'keepdim': 0},
         backward=False, exact=True)
    case('max_T', 'max', [distinct(17, 3)],
         lambda x: torch.max(x, 1).values, attrs={'dim': 1, 'keepdim': 0},
         kind='red', views={0: 'T0,1'})
    case('argmax_T_slice', 'argmax', [distinct(17, 6)],
         lambda x: torch.argmax(x, 1), attrs={'dim': 1, 'keepdim': 0},
         views={0: 'S1,0,6,2/T0,1'}, backward=False, exact=True)
    case('max_bf16', 'max', [distinct(3, 17, dt=BF16)],
         lambda x: torch.max(x, 1).values, attrs={'dim': 1, 'keepdim': 0},
         kind='red')
    case('argmax_bf16', 'argmax', [distinct(3, 17, dt=BF16)],
         lambda x: torch.argmax(x, -1, keepdim=True),
         attrs={'dim': -1, 'keepdim': 1},
         backward=False, exact=True)
    case('argmax_f16_d0', 'argmax', [distinct(17, 3, dt=F16)],
         lambda x: torch.argmax(x, 0), attrs={'dim': 0, 'keepdim': 0},
         backward=False, exact=True)


def softmax_cases():
    for op, f in (('softmax', torch.softmax),
                  ('log_softmax', torch.log_softmax)):
        for dim in (0, -1, 1):
            case('%s_d%d' % (op, dim), op, [randn(4, 17, 3, scale=2.0)],
                 lambda x, d=dim, f=f: f(x, d), attrs={'dim': dim}, kind='red')
        case(op + '_1000', op, [randn(2, 1000, scale=3.0)],
             lambda x, f=f: f(x, -1), attrs={'dim': -1}, kind='red')
        case(op + '_T_dm1', op, [randn(17, 5, scale=2.0)],
             lambda x, f=f: f(x, -1), attrs={'dim': -1}, kind='red',
             views={0: 'T0,1'})
        case(op + '_T_d0', op, [randn(17, 5, scale=2.0)],
             lambda x, f=f: f(x, 0), attrs={'dim': 0}, kind='red',
             views={0: 'T0,1'})
        case(op + '_slice_perm', op, [randn(3, 10, 4, scale=2.0)],
             lambda x, f=f: f(x, -1), attrs={'dim': -1}, kind='red',
             views={0: 'S1,1,10,2/P2,0,1'})
        case(op + '_large', op, [randn(3, 7, scale=50.0)],
             lambda x, f=f: f(x, -1), attrs={'dim': -1}, kind='red')
        case(op + '_bf16', op, [randn(3, 33, dt=BF16, scale=2.0)],
             lambda x, f=f: f(x, -1), attrs={'dim': -1}, kind='red')
        case(op + '_f16_d0', op, [randn(17, 3, dt=F16, scale=2.0)],
             lambda x, f=f: f(x, 0), attrs={'dim': 0}, kind='red')


# ---- matmul -----------------------------------------------------------------

def matmul_cases():
    mm = torch.matmul
    cfg = [
        ('2d', (3, 5), (5, 7), None),
        ('2d_1', (1, 1), (1, 1), None),
        ('2d_odd', (17, 3), (3, 1), None),
        ('k1000', (3, 1000), (1000, 5), None),
        ('batched', (2, 3, 4, 5), (2, 3, 5, 6), None),
        ('bcast_batch', (2, 1, 3, 5), (4, 5, 7), None),
        ('bcast_batch2', (3, 5), (2, 5, 4), None),
        ('bcast_batch3', (2, 3, 4), (1, 4, 5), None),
        ('vec_mat', (5,), (5, 7), None),
        ('mat_vec', (3, 5), (5,), None),
        ('vec_vec', (17,), (17,), None),
        ('batch_vec', (2, 3, 5), (5,), None),
        ('vec_batch', (5,), (2, 5, 4), None),
    ]
    for nm, sa, sb, _ in cfg:
        case('matmul_' + nm, 'matmul', [randn(*sa), randn(*sb)], mm,
             kind='mm')
    # transposed views (used without a copy, per the header)
    case('matmul_aT', 'matmul', [randn(5, 3), randn(5, 7)], mm, kind='mm',
         views={0: 'T0,1'})
    case('matmul_bT', 'matmul', [randn(3, 5), randn(7, 5)], mm, kind='mm',
         views={1: 'T0,1'})
    case('matmul_abT', 'matmul', [randn(5, 3), randn(7, 5)], mm, kind='mm',
         views={0: 'T0,1', 1: 'T0,1'})
    case('matmul_batched_bT', 'matmul', [randn(2, 4, 5), randn(2, 6, 5)], mm,
         kind='mm', views={1: 'T1,2'})
    case('matmul_perm', 'matmul', [randn(5, 2, 3), randn(2, 5, 4)], mm,
         kind='mm', views={0: 'P1,2,0'})
    case('matmul_slice_step', 'matmul', [randn(3, 10), randn(5, 8)], mm,
         kind='mm', views={0: 'S1,0,10,2', 1: 'S1,1,8,2'})
    case('matmul_expand_b', 'matmul', [randn(3, 4, 5), randn(5, 6)], mm,
         kind='mm', views={1: 'U0/E3,5,6'})
    for dt, dn in ((BF16, 'bf16'), (F16, 'f16')):
        case('matmul_%s_2d' % dn, 'matmul',
             [randn(4, 17, dt=dt), randn(17, 6, dt=dt)], mm, kind='mm')
        case('matmul_%s_batched_T' % dn, 'matmul',
             [randn(2, 3, 9, dt=dt), randn(2, 5, 9, dt=dt)], mm, kind='mm',
             views={1: 'T1,2'})
        case('matmul_%s_bcast' % dn, 'matmul',
             [randn(2, 1, 3, 5, dt=dt), randn(4, 5, 7, dt=dt)], mm,
             kind='mm')
        case('matmul_%s_vec' % dn, 'matmul',
             [randn(33, dt=dt), randn(33, 3, dt=dt)], mm, kind='mm')
    case('matmul_bf16_k1000', 'matmul',
         [randn(2, 1000, dt=BF16), randn(1000, 3, dt=BF16)], mm,
         tol=(2e-2, 1e-1))


# ---- indexing and shape -----------------------------------------------------

def embedding_cases():
    ids = torch.tensor([[1, 3, 3, 0, 9], [3, 1, 7, 7, 7]], dtype=I64)
    case('embedding_i64', 'embedding', [randn(10, 4), ids],
         lambda w, i: F.embedding(i, w))
    case('embedding_i32', 'embedding', [randn(10, 4), ids.to(I32)],
         lambda w, i: F.embedding(i.long(), w))
    ids = torch.randint(0, 1000, (17,), dtype=I64)
    ids[5] = ids[2]
    ids[11] = ids[2]
    ids[0] = 999
    case('embedding_v1000', 'embedding', [randn(1000, 3), ids],
         lambda w, i: F.embedding(i, w))
    ids = torch.tensor([2, 2, 2, 0], dtype=I32)
    case('embedding_scalar_ids', 'embedding', [randn(3, 17), ids[0].clone()],
         lambda w, i: F.embedding(i.long(), w))
    case('embedding_1d_T', 'embedding', [randn(17, 5), ids],
         lambda w, i: F.embedding(i.long(), w), views={0: 'T0,1'})
    ids = torch.tensor([[0, 4, 4], [4, 1, 0]], dtype=I64)
    case('embedding_bf16', 'embedding', [randn(5, 33, dt=BF16), ids],
         lambda w, i: F.embedding(i, w))


def concat_split_cases():
    cat = lambda d: (lambda *xs: torch.cat(xs, d))
    case('concat3_mid', 'concat', [randn(2, 3, 4), randn(2, 1, 4),
                                   randn(2, 5, 4)], cat(1), attrs={'dim': 1})
    case('concat3_d0', 'concat', [randn(1, 3), randn(4, 3), randn(2, 3)],
         cat(0), attrs={'dim': 0})
    case('concat3_dm1_views', 'concat', [randn(4, 3), randn(3, 2),
                                         randn(3, 10)], cat(-1),
         attrs={'dim': -1}, views={0: 'T0,1', 2: 'S1,0,10,3'})
    case('concat2_1000', 'concat', [randn(1000), randn(17)], cat(0),
         attrs={'dim': 0})
    case('concat3_bf16', 'concat', [randn(2, 3, 4, dt=BF16),
                                    randn(2, 2, 4, dt=BF16),
                                    randn(2, 1, 4, dt=BF16)], cat(1),
         attrs={'dim': 1})

    def split(sizes, d):
        return lambda x: tuple(torch.split(x, sizes, d))
    case('split_mid', 'split', [randn(2, 9, 3)], split([2, 3, 4], 1),
         attrs={'dim': 1, 'sizes': [2, 3, 4]})
    case('split_last', 'split', [randn(3, 8)], split([5, 3], -1),
         attrs={'dim': -1, 'sizes': [5, 3]})
    case('split_d0_T', 'split', [randn(4, 7)], split([1, 5, 1], 0),
         attrs={'dim': 0, 'sizes': [1, 5, 1]}, views={0: 'T0,1'})
    case('split_bf16', 'split', [randn(17, 2, dt=BF16)], split([16, 1], 0),
         attrs={'dim': 0, 'sizes': [16, 1]})


def cast_copy_cases():
    def castf(dt):
        return lambda x: x.to(dt)
    x = randn(3, 17, scale=3.0)
    x[0, :4] = torch.tensor([1.00390625, 1.01171875, -2.0078125, 3.4e38])
    # ties to even in bf16 (1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6 ...)
    case('cast_f32_bf16', 'cast', [x], castf(BF16), attrs={'dt': 1},
         upcast=False, exact=True)
    case('cast_f32_f16', 'cast', [randn(3, 17, scale=3.0)], castf(F16),
         attrs={'dt': 2}, upcast=False, exact=True)
    case('cast_bf16_f32_T', 'cast', [randn(17, 3, dt=BF16)], castf(F32),
         attrs={'dt': 0}, upcast=False, exact=True, views={0: 'T0,1'})
    case('cast_f16_f32', 'cast', [randn(5, 3, dt=F16)], castf(F32),
         attrs={'dt': 0}, upcast=False, exact=True)
    case('cast_bf16_f16', 'cast', [randn(5, 3, dt=BF16)], castf(F16),
         attrs={'dt': 2}, upcast=False, exact=True)
    case('cast_f16_bf16', 'cast', [randn(5, 3, dt=F16)], castf(BF16),
         attrs={'dt': 1}, upcast=False, exact=True)
    case('cast_f32_f32', 'cast', [randn(4, 3)], castf(F32),
         attrs={'dt': 0}, upcast=False, exact=True, views={0: 'T0,1'})
    xi = randn(4, 5, scale=20.0)
    case('cast_f32_i32', 'cast', [xi], castf(I32), attrs={'dt': 3},
         upcast=False, exact=True, backward=False)
    case('cast_f32_i64_T', 'cast', [randn(4, 5, scale=20.0)], castf(I64),
         attrs={'dt': 4}, upcast=False, exact=True, backward=False,
         views={0: 'T0,1'})
    ii = torch.randint(-1000, 1000, (3, 7), dtype=I32)
    case('cast_i32_f32', 'cast', [ii], castf(F32), attrs={'dt': 0},
         upcast=False, exact=True, backward=False)
    case('cast_i32_i64', 'cast', [ii.clone()], castf(I64), attrs={'dt': 4},
         upcast=False, exact=True, backward=False)
    il = torch.randint(-100000, 100000, (17,), dtype=I64)
    case('cast_i64_f32', 'cast', [il], castf(F32), attrs={'dt': 0},
         upcast=False, exact=True, backward=False)
    case('cast_i64_bf16', 'cast', [torch.randint(-200, 200, (9,), dtype=I64)],
         castf(BF16), attrs={'dt': 1}, upcast=False, exact=True,
         backward=False)
    case('copy_T', 'copy', [randn(5, 3)], lambda x: x.clone(),
         views={0: 'T0,1'}, upcast=False, exact=True)
    case('copy_slice_perm', 'copy', [randn(2, 9, 4)], lambda x: x.clone(),
         views={0: 'S1,1,9,2/P2,0,1'}, upcast=False, exact=True)
    case('copy_bf16_expand', 'copy', [randn(3, 1, dt=BF16)],
         lambda x: x.clone(), views={0: 'E2,3,4'}, upcast=False, exact=True)
    case('copy_i64', 'copy', [torch.randint(-5, 5, (3, 4), dtype=I64)],
         lambda x: x.clone(), views={0: 'T0,1'}, upcast=False, exact=True,
         backward=False)


def view_cases():
    ident = lambda x: x
    V = [
        ('reshape', (3, 4, 5), 'R12,5', True),
        ('reshape_infer', (3, 4, 5), 'R-1,10', True),
        ('reshape_T_copy', (3, 4), 'T0,1/R12', False),
        ('reshape_to_scalar_shape', (1, 1), 'R1', True),
        ('permute', (2, 3, 4), 'P2,0,1', True),
        ('transpose', (3, 17), 'T0,1', True),
        ('transpose_neg', (2, 3, 4), 'T-1,0', True),
        ('slice_step', (4, 17), 'S1,1,17,3', True),
        ('slice_neg_start', (4, 17), 'S1,-5,%d,2' % BIG, True),
        ('slice_clamp', (4, 6), 'S0,-100,100,1', True),
        ('slice_step_d0_T', (9, 3), 'S0,0,9,4/T0,1', True),
        ('expand', (3, 1), 'E3,4', True),
        ('expand_new_dims', (3, 1), 'E2,5,3,4', True),
        ('expand_keep', (1, 4), 'E3,-1', True),
        ('unsqueeze_expand', (5,), 'U0/E4,5', True),
        ('squeeze', (3, 1, 4), 'Q1', True),
        ('squeeze_neg', (3, 4, 1), 'Q-1', True),
        ('unsqueeze', (3, 4), 'U1', True),
        ('unsqueeze_end', (3, 4), 'U-1', True),
        ('chain', (4, 6, 5), 'S1,0,6,2/P2,0,1/U0/E2,5,4,3', True),
        ('chain_reshape_copy', (4, 6, 5), 'T0,2/S0,1,5,1/R-1', False),
    ]
    for nm, shape, spec, isview in V:
        case('view_' + nm, 'id', [randn(*shape)], ident, views={0: spec},
             isview=isview, upcast=False, exact=True)
    case('view_bf16_expand', 'id', [randn(3, 1, dt=BF16)], ident,
         views={0: 'E3,5'}, isview=True, upcast=True, kind='red')


# ---- fused layers -----------------------------------------------------------

def rmsnorm_ref(eps):
    def f(x, w=None):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * w if w is not None else y
    return f


def norm_cases():
    case('rmsnorm_w', 'rmsnorm', [randn(2, 3, 17), randn(17)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6}, kind='red')
    case('rmsnorm_now', 'rmsnorm', [randn(4, 1000, scale=3.0)],
         rmsnorm_ref(1e-5), attrs={'eps': 1e-5}, kind='red')
    case('rmsnorm_T', 'rmsnorm', [randn(17, 3), uniform(0.5, 1.5, 17)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6}, kind='red',
         views={0: 'T0,1'})
    # C = 1: y = x / sqrt(x^2 + eps) ~ sign(x); dx ~ 1e-7 is the difference
    # of two O(1) terms, so its error is absolute (f32 ulp of 1)
    case('rmsnorm_c1', 'rmsnorm', [randn(5, 1), randn(1)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6, 'gabs': 1}, kind='red',
         gtol=(1e-4, 1e-5))
    case('rmsnorm_bf16', 'rmsnorm', [randn(3, 33, dt=BF16),
                                     randn(33, dt=BF16)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6}, kind='red')
    case('rmsnorm_f16_now', 'rmsnorm', [randn(3, 17, dt=F16)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6}, kind='red')
    ln = lambda eps: (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b,
                                                    eps))
    case('layernorm', 'layernorm', [randn(2, 3, 17), randn(17), randn(17)],
         ln(1e-5), attrs={'eps': 1e-5}, kind='red')
    case('layernorm_1000', 'layernorm', [randn(3, 1000, scale=2.0) + 1.5,
                                         randn(1000), randn(1000)],
         ln(1e-5), attrs={'eps': 1e-5}, kind='red')
    case('layernorm_T', 'layernorm', [randn(5, 4), randn(5), randn(5)],
         ln(1e-5), attrs={'eps': 1e-5}, kind='red', views={0: 'T0,1'})
    case('layernorm_bf16', 'layernorm', [randn(4, 33, dt=BF16),
                                         randn(33, dt=BF16),
                                         randn(33, dt=BF16)],
         ln(1e-5), attrs={'eps': 1e-5}, kind='red')


def rope_tables_ref(T, D, theta, pos0):
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    t = torch.arange(pos0, pos0 + T, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def rope_cases():
    for T, D, theta, pos0, tol in ((5, 8, 10000.0, 0, 1e-5),
                                   (17, 64, 10000.0, 3, 2e-5),
                                   (1, 4, 500000.0, 100, 2e-5),
                                   (64, 16, 10000.0, 1000, 2e-4)):
        cos, sin = rope_tables_ref(T, D, theta, pos0)
        case('rope_tables_T%d_D%d_p%d' % (T, D, pos0), 'rope_tables', [],
             lambda cos=cos, sin=sin: (cos, sin),
             attrs={'T': T, 'D': D, 'theta': theta, 'pos0': pos0},
             tol=(1e-5, tol), backward=False)
    rope = lambda x, c, s: x * c + rotate_half(x) * s
    for nm, shape, view, T, D, pos0, dt in (
            ('4d', (2, 3, 5, 8), None, 5, 8, 0, F32),
            ('3d', (3, 17, 16), None, 17, 16, 7, F32),
            ('perm', (2, 5, 3, 8), 'P0,2,1,3', 5, 8, 0, F32),
            ('2d_slice', (9, 8), 'S0,0,9,2', 5, 8, 2, F32),
            ('bf16', (1, 4, 17, 32), None, 17, 32, 0, BF16),
            ('f16', (2, 6, 16), None, 6, 16, 5, F16)):
        cos, sin = rope_tables_ref(T, D, 10000.0, pos0)
        case('rope_' + nm, 'rope', [randn(*shape, dt=dt), cos.to(dt),
                                     sin.to(dt)], rope, grads=[0],
             views={0: view} if view else None)


def attn_ref(mask_given, causal, scale):
    def f(q, k, v, mask=None):
        B, H, T, D = q.shape
        KV, S = k.shape[1], k.shape[2]
        rep = H // KV
        k2 = k.repeat_interleave(rep, dim=1)
        v2 = v.repeat_interleave(rep, dim=1)
        sc = scale if scale > 0 else 1.0 / math.sqrt(D)
        s = (q @ k2.transpose(-1, -2)) * sc
        if mask is not None:
            s = s + mask
        if causal:
            allowed = (torch.arange(S)[None, :] <=
                       torch.arange(T)[:, None] + (S - T))
            s = s.masked_fill(~allowed, float('-inf'))
        return torch.softmax(s, -1) @ v2
    return f


def attention_cases():
    def mk_mask(shape, S, dt=F32, frac=0.25):
        """Additive mask; -inf at ~frac of positions, never key 0 (every
        query row, causal or not, then sees at least one key)."""
        m = randn(*shape, scale=0.5, dt=torch.float64)
        drop = torch.rand(*shape) < frac
        drop[..., 0] = False
        m = m.masked_fill(drop, float('-inf'))
        return m.to(dt)
    cfgs = [
        # name, B, H, KV, T, S, D, causal, mask shape, scale, dt, views
        ('mha', 1, 2, 2, 5, 5, 8, False, None, 0.0, F32, None),
        ('gqa_causal', 2, 4, 2, 7, 7, 16, True, None, 0.0, F32, None),
        ('gqa_causal_S_gt_T', 1, 6, 2, 3, 9, 8, True, None, 0.0, F32, None),
        ('decode_T1', 2, 4, 1, 1, 17, 8, True, None, 0.0, F32, None),
        ('mask_11TS', 1, 2, 1, 6, 6, 8, False, (1, 1, 6, 6), 0.0, F32, None),
        ('mask_TS_causal', 2, 2, 2, 5, 8, 4, True, (5, 8), 0.0, F32, None),
        ('mask_B11S_pad', 2, 4, 2, 9, 9, 8, True, (2, 1, 1, 9), 0.0, F32,
         None),
        ('mask_BHTS', 1, 3, 3, 4, 6, 8, False, (1, 3, 4, 6), 0.0, F32, None),
        ('scale', 1, 2, 1, 4, 4, 16, False, None, 0.3, F32, None),
        ('odd_D3', 1, 1, 1, 17, 17, 3, True, None, 0.0, F32, None),
        ('mqa_64', 1, 4, 1, 64, 64, 32, True, None, 0.0, F32, None),
        ('noncausal_64x48', 1, 2, 1, 48, 64, 16, False, None, 0.0, F32,
         None),
        ('perm_views', 2, 4, 2, 6, 10, 8, True, None, 0.0, F32,
         'perm'),
        ('bf16_gqa_causal', 1, 4, 2, 16, 24, 16, True, None, 0.0, BF16,
         None),
        ('bf16_mask', 2, 2, 1, 8, 8, 8, False, (2, 1, 8, 8), 0.0, BF16,
         None),
        ('f16_causal', 1, 2, 2, 9, 9, 8, True, None, 0.0, F16, None),
    ]
    for (nm, B, H, KV, T, S, D, causal, mshape, scale, dt, views) in cfgs:
        if views == 'perm':
            # stored as (B, T, H, D) and viewed as (B, H, T, D), the usual
            # layout after a projection; k stored (B, KV, D, S) transposed
            q = randn(B, T, H, D, dt=dt)
            k = randn(B, KV, D, S, dt=dt)
            v = randn(B, S, KV, D, dt=dt)
            vw = {0: 'P0,2,1,3', 1: 'T2,3', 2: 'P0,2,1,3'}
        else:
            q = randn(B, H, T, D, dt=dt)
            k = randn(B, KV, S, D, dt=dt)
            v = randn(B, KV, S, D, dt=dt)
            vw = None
        ins = [q, k, v]
        if mshape is not None:
            ins.append(mk_mask(mshape, S, dt=dt))
        case('attn_' + nm, 'attention', ins,
             attn_ref(mshape is not None, causal, scale),
             attrs={'causal': causal, 'scale': scale}, grads=[0, 1, 2],
             views=vw, kind='attn')


def ce_cases():
    def ce(ignore, red):
        return lambda lg, t: F.cross_entropy(lg, t.long(), ignore_index=ignore,
                                              reduction=red)
    R = {'mean': 0, 'sum': 1, 'none': 2}
    for red in ('mean', 'sum', 'none'):
        lg = randn(5, 1000, scale=2.0)
        t = torch.randint(0, 1000, (5,), dtype=I64)
        case('ce_%s_v1000' % red, 'cross_entropy', [lg, t], ce(-100, red),
             attrs={'ignore': -100, 'red': R[red]}, kind='attn')
        t = torch.randint(0, 17, (6,), dtype=I64)
        t[1] = -100
        t[4] = -100
        case('ce_%s_ignore' % red, 'cross_entropy', [randn(6, 17), t],
             ce(-100, red), attrs={'ignore': -100, 'red': R[red]},
             kind='attn')
    t = torch.tensor([3, 7, 7, 0, 7, 16], dtype=I32)
    case('ce_mean_ignore_valid_class_i32', 'cross_entropy',
         [randn(6, 17), t], ce(7, 'mean'), attrs={'ignore': 7, 'red': 0},
         kind='attn')
    t = torch.randint(0, 33, (4,), dtype=I32)
    case('ce_sum_i32_T', 'cross_entropy', [randn(33, 4), t], ce(-100, 'sum'),
         attrs={'ignore': -100, 'red': 1}, views={0: 'T0,1'}, kind='attn')
    t = torch.randint(0, 10, (1,), dtype=I64)
    case('ce_mean_N1', 'cross_entropy', [randn(1, 10, scale=5.0), t],
         ce(-100, 'mean'), attrs={'ignore': -100, 'red': 0}, kind='attn')
    t = torch.randint(0, 1000, (3,), dtype=I64)
    case('ce_mean_slice', 'cross_entropy', [randn(6, 1000), t],
         ce(-100, 'mean'), attrs={'ignore': -100, 'red': 0},
         views={0: 'S0,0,6,2'}, kind='attn')
    t = torch.randint(0, 64, (5,), dtype=I64)
    t[2] = -100
    case('ce_mean_bf16', 'cross_entropy', [randn(5, 64, dt=BF16), t],
         ce(-100, 'mean'), attrs={'ignore': -100, 'red': 0}, kind='attn')
    t = torch.randint(0, 64, (5,), dtype=I64)
    case('ce_none_bf16', 'cross_entropy', [randn(5, 64, dt=BF16), t],
         ce(-100, 'none'), attrs={'ignore': -100, 'red': 2}, kind='attn')


# ---- edge cases: stride-0 views, empty and 0-d tensors, long bf16 sums,
# -inf entries, ties, special values ---------------------------------------

def edge_cases():
    case('add_expanded_view', 'add', [randn(3, 1), randn(3, 4)], torch.add,
         views={0: 'E3,4'})
    case('mul_expanded_both', 'mul', [randn(4), randn(3, 1)], torch.mul,
         views={0: 'U0/E3,4', 1: 'E3,4'})
    case('sum_expanded_view', 'sum', [randn(1, 5)],
         lambda x: x.sum(0), attrs={'dims': [0], 'keepdim': 0},
         views={0: 'E17,5'}, kind='red')
    case('exp_0d', 'exp', [randn()], torch.exp)
    case('sum_0d', 'sum', [randn()], lambda x: x.sum(),
         attrs={'dims': [], 'keepdim': 0}, kind='red')
    case('add_empty', 'add', [randn(0, 3), randn(3)], torch.add)
    case('sum_empty_d0', 'sum', [randn(0, 3)], lambda x: x.sum(0),
         attrs={'dims': [0], 'keepdim': 0}, kind='red')
    # long reductions in bf16: accumulation must be in f32
    case('sum_bf16_1000', 'sum', [uniform(0.5, 1.5, 1000, dt=BF16)],
         lambda x: x.sum(), attrs={'dims': [], 'keepdim': 0}, kind='red')
    case('mean_bf16_2x1000', 'mean', [uniform(0.5, 1.5, 2, 1000, dt=BF16)],
         lambda x: x.mean(-1), attrs={'dims': [-1], 'keepdim': 0},
         kind='red')
    case('sum_d0_1000x3', 'sum', [randn(1000, 3)], lambda x: x.sum(0),
         attrs={'dims': [0], 'keepdim': 0}, kind='red')
    case('softmax_d0_1000x3', 'softmax', [randn(1000, 3, scale=2.0)],
         lambda x: torch.softmax(x, 0), attrs={'dim': 0}, kind='red')
    case('softmax_bf16_1000', 'softmax', [randn(2, 1000, dt=BF16)],
         lambda x: torch.softmax(x, -1), attrs={'dim': -1}, kind='red')
    case('rmsnorm_bf16_1000', 'rmsnorm', [randn(2, 1000, dt=BF16),
                                          randn(1000, dt=BF16)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6}, kind='red')
    case('layernorm_bf16_1000', 'layernorm',
         [randn(2, 1000, dt=BF16) + 3.0, randn(1000, dt=BF16),
          randn(1000, dt=BF16)],
         lambda x, w, b: F.layer_norm(x, (1000,), w, b, 1e-5),
         attrs={'eps': 1e-5}, kind='red')
    # -inf entries (masked logits), never a whole row
    x = randn(4, 9, scale=2.0)
    x[0, 3] = x[1, 0] = x[1, 8] = x[3, 4] = x[3, 5] = float('-inf')
    for op, f in (('softmax', torch.softmax),
                  ('log_softmax', torch.log_softmax)):
        case(op + '_neginf', op, [x.clone()], lambda x, f=f: f(x, -1),
             attrs={'dim': -1}, kind='red')
    # amax with ties: torch splits the gradient evenly among the maxima
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, -1.0],
                      [0.0, 1.0, 2.0, 2.5]])
    case('amax_ties', 'amax', [x], lambda x: x.amax(-1),
         attrs={'dims': [-1], 'keepdim': 0}, kind='red')
    case('amax_ties_all', 'amax', [x.clone()], lambda x: x.amax(),
         attrs={'dims': [], 'keepdim': 0}, kind='red')
    # casts of special values (NaN, +-inf, overflow, subnormals, ties)
    x = torch.tensor([float('nan'), float('inf'), float('-inf'), 0.0, -0.0,
                      1e-40, -3e-39, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
                      3.3895314e38, 3.4e38, -1.0 - 2.0 ** -8])
    case('cast_f32_bf16_special', 'cast', [x], lambda x: x.to(BF16),
         attrs={'dt': 1}, upcast=False, exact=True, backward=False)
    x = torch.tensor([float('nan'), float('inf'), 65504.0, 65520.0, 70000.0,
                      -70000.0, 1e-6, 6e-8, 2e-8, 1.0 + 2.0 ** -11,
                      1.0 + 3 * 2.0 ** -11, -0.0])
    case('cast_f32_f16_special', 'cast', [x], lambda x: x.to(F16),
         attrs={'dt': 2}, upcast=False, exact=True, backward=False)
    # cross entropy with large logits (stability)
    t = torch.randint(0, 50, (4,), dtype=I64)
    case('ce_mean_large_logits', 'cross_entropy',
         [randn(4, 50, scale=60.0), t],
         lambda lg, t: F.cross_entropy(lg, t), attrs={'ignore': -100,
                                                       'red': 0},
         kind='attn')
    # attention: per-head mask with GQA, tile-unfriendly sizes
    m = randn(1, 4, 1, 11, scale=0.5)
    m[..., 3] = float('-inf')
    case('attn_gqa_mask_1H1S', 'attention',
         [randn(1, 4, 5, 8), randn(1, 2, 11, 8), randn(1, 2, 11, 8), m],
         attn_ref(True, False, 0.0), attrs={'causal': 0, 'scale': 0.0},
         grads=[0, 1, 2], kind='attn')
    case('attn_odd_33x63_D20', 'attention',
         [randn(1, 4, 33, 20), randn(1, 2, 63, 20), randn(1, 2, 63, 20)],
         attn_ref(False, True, 0.0), attrs={'causal': 1, 'scale': 0.0},
         grads=[0, 1, 2], kind='attn')
    case('attn_D64_causal_scaled', 'attention',
         [randn(2, 2, 17, 64), randn(2, 1, 17, 64), randn(2, 1, 17, 64)],
         attn_ref(False, True, 0.05), attrs={'causal': 1, 'scale': 0.05},
         grads=[0, 1, 2], kind='attn')
    case('attn_large_scores', 'attention',
         [randn(1, 2, 8, 16, scale=4.0), randn(1, 2, 8, 16, scale=4.0),
          randn(1, 2, 8, 16)],
         attn_ref(False, False, 0.0), attrs={'causal': 0, 'scale': 0.0},
         grads=[0, 1, 2], kind='attn', tol=(1e-3, 1e-3))


def more_cases():
    # the same leaf used twice: gradients of both uses accumulate
    case('mul_self_T', 'mul', [randn(4, 4), 0], torch.mul, views={1: 'T0,1'})
    case('add_self_bcast', 'add', [randn(3, 4), 0], torch.add,
         views={1: 'S0,0,1,1'})
    case('matmul_self_T', 'matmul', [randn(3, 5), 0], torch.matmul,
         views={1: 'T0,1'}, kind='mm')
    case('concat_self', 'concat', [randn(2, 3), 0, 0],
         lambda *xs: torch.cat(xs, 0), attrs={'dim': 0},
         views={1: 'S0,1,2,1'})
    case('attn_self_qkv', 'attention', [randn(1, 2, 6, 8), 0, 0],
         attn_ref(False, True, 0.0), attrs={'causal': 1, 'scale': 0.0},
         kind='attn')
    # stride-0 and sliced inputs to the fused kernels
    case('attn_kv_expanded', 'attention',
         [randn(2, 4, 5, 8), randn(2, 1, 7, 8), randn(2, 1, 7, 8)],
         attn_ref(False, False, 0.0), attrs={'causal': 0, 'scale': 0.0},
         views={1: 'E2,2,7,8', 2: 'E2,2,7,8'}, kind='attn')
    case('attn_qkv_split_views', 'attention',
         [randn(1, 3, 24, 5), 0, 0],     # (B, H, 3*D, T) -> q, k, v (B,H,T,D)
         attn_ref(False, True, 0.0), attrs={'causal': 1, 'scale': 0.0},
         views={0: 'S2,0,8,1/T2,3', 1: 'S2,8,16,1/T2,3',
                2: 'S2,16,24,1/T2,3'}, kind='attn')
    cos, sin = rope_tables_ref(5, 8, 10000.0, 0)
    case('rope_lastdim_slice', 'rope', [randn(2, 5, 24), cos.float(),
                                         sin.float()],
         lambda x, c, s: x * c + rotate_half(x) * s, grads=[0],
         views={0: 'S2,8,16,1'})
    case('rmsnorm_lastdim_slice', 'rmsnorm', [randn(3, 40), randn(17)],
         rmsnorm_ref(1e-6), attrs={'eps': 1e-6}, kind='red',
         views={0: 'S1,3,37,2'})
    # non-contiguous integer inputs
    t = torch.randint(0, 33, (4, 2), dtype=I64)
    t[1, 0] = -100
    case('ce_targets_slice', 'cross_entropy', [randn(4, 33), t],
         lambda lg, t: F.cross_entropy(lg, t), attrs={'ignore': -100,
                                                       'red': 0},
         views={1: 'T0,1/S0,0,1,1/Q0'}, kind='attn')
    ids = torch.tensor([[1, 3, 3], [0, 9, 3]], dtype=I32)
    case('embedding_ids_T', 'embedding', [randn(10, 6), ids],
         lambda w, i: F.embedding(i.long(), w), views={1: 'T0,1'})
    m = (torch.rand(4, 3) < 0.5).to(I32)
    case('masked_fill_mask_T', 'masked_fill', [randn(3, 4), m],
         lambda x, m: x.masked_fill(m != 0, 2.0), attrs={'value': 2.0},
         views={1: 'T0,1'})
    # size-1 reduction dims
    case('softmax_size1_dim', 'softmax', [randn(3, 1)],
         lambda x: torch.softmax(x, -1), attrs={'dim': -1}, kind='red')
    case('log_softmax_size1_dim', 'log_softmax', [randn(3, 1)],
         lambda x: torch.log_softmax(x, -1), attrs={'dim': -1}, kind='red')
    case('max_size1_dim', 'max', [randn(3, 1)],
         lambda x: torch.max(x, 1).values, attrs={'dim': 1, 'keepdim': 0},
         kind='red')
    case('argmax_size1_dim', 'argmax', [randn(3, 1)],
         lambda x: torch.argmax(x, 1, keepdim=True),
         attrs={'dim': 1, 'keepdim': 1}, backward=False, exact=True)


# ---- attention options (ts_attention_ex) ---------------------------------

def attn_ex_ref(causal, scale, window, softcap):
    """Hugging Face's order: scores scaled, softcapped, masked (additive,
    then causal and sliding window: kv_idx > q_idx - window), softmax."""
    def f(q, k, v, mask=None):
        B, H, T, D = q.shape
        KV, S = k.shape[1], k.shape[2]
        k2 = k.repeat_interleave(H // KV, dim=1)
        v2 = v.repeat_interleave(H // KV, dim=1)
        sc = scale if scale > 0 else 1.0 / math.sqrt(D)
        s = (q @ k2.transpose(-1, -2)) * sc
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if mask is not None:
            s = s + mask
        pos = torch.arange(T)[:, None] + (S - T)
        key = torch.arange(S)[None, :]
        allowed = torch.ones(T, S, dtype=torch.bool)
        if causal:
            allowed &= key <= pos
        if window > 0:
            allowed &= pos - key < window
        s = s.masked_fill(~allowed, float('-inf'))
        return torch.softmax(s, -1) @ v2
    return f


def attention_ex_cases():
    cfgs = [
        # name, B, H, KV, T, S, D, causal, scale, window, softcap, mask,
        # dt, qk scale (larger scores make the softcap bite)
        ('win1', 1, 2, 2, 9, 9, 8, True, 0.0, 1, 0.0, False, F32, 1.0),
        ('win3_blocks', 1, 2, 1, 70, 70, 16, True, 0.0, 3, 0.0, False, F32,
         1.0),
        ('win40_skip', 1, 2, 1, 130, 130, 16, True, 0.0, 40, 0.0, False,
         F32, 1.0),
        ('win_eq_S', 1, 2, 2, 12, 12, 8, True, 0.0, 12, 0.0, False, F32,
         1.0),
        ('win_gt_S', 2, 4, 2, 7, 7, 16, True, 0.0, 50, 0.0, False, F32, 1.0),
        ('win_T_lt_S_gqa', 2, 4, 2, 5, 40, 8, True, 0.0, 7, 0.0, False, F32,
         1.0),
        ('win_T_lt_S_blocks', 1, 4, 1, 40, 150, 16, True, 0.0, 70, 0.0,
         False, F32, 1.0),
        ('win_decode_T1', 1, 4, 2, 1, 33, 16, True, 0.0, 8, 0.0, False, F32,
         1.0),
        ('win_decode_T3_cap', 2, 4, 1, 3, 20, 8, True, 0.0, 4, 30.0, False,
         F32, 3.0),
        ('win_noncausal', 1, 2, 1, 10, 10, 8, False, 0.0, 3, 0.0, False, F32,
         1.0),
        ('win_scale', 1, 2, 2, 9, 9, 8, True, 0.2, 4, 0.0, False, F32, 1.0),
        ('win_mask', 2, 2, 1, 8, 11, 8, True, 0.0, 5, 0.0, True, F32, 1.0),
        ('cap5', 1, 2, 2, 9, 9, 16, True, 0.0, 0, 5.0, False, F32, 3.0),
        ('cap_noncausal_gqa', 2, 4, 2, 6, 10, 8, False, 0.0, 0, 2.0, False,
         F32, 3.0),
        ('cap_scale_mask', 1, 2, 1, 7, 7, 16, False, 0.0625, 0, 1.5, True,
         F32, 4.0),
        ('cap_win_blocks', 1, 2, 1, 100, 100, 8, True, 0.0, 33, 4.0, False,
         F32, 3.0),
        ('scale_gqa_T_lt_S', 1, 6, 2, 4, 9, 8, True, 0.3, 0, 0.0, False, F32,
         1.0),
        ('bf16_win_cap', 1, 4, 2, 16, 24, 16, True, 0.0, 6, 8.0, False, BF16,
         2.0),
    ]
    for (nm, B, H, KV, T, S, D, causal, scale, window, cap, mask, dt,
         amp) in cfgs:
        ins = [randn(B, H, T, D, dt=dt, scale=amp),
               randn(B, KV, S, D, dt=dt, scale=amp),
               randn(B, KV, S, D, dt=dt)]
        if mask:  # finite: a window may leave key 0 out, never a whole row
            ins.append(randn(B, 1, T, S, dt=dt, scale=0.5))
        case('attn_ex_' + nm, 'attention_ex', ins,
             attn_ex_ref(causal, scale, window, cap),
             attrs={'causal': causal, 'scale': scale, 'window': window,
                    'softcap': cap},
             grads=[0, 1, 2], kind='attn')


# ---- mixture of experts: top-k, gather, one-hot, the experts MLP -----------

def topk_cases():
    def ref(k):
        return lambda x: torch.sort(x, dim=-1, descending=True,
                                    stable=True).indices[..., :k]
    for nm, x, k, view in (
            ('k3', distinct(2, 3, 10), 3, None),
            ('k1', distinct(5, 8), 1, None),
            ('k_eq_n', distinct(4, 6), 6, None),
            ('1d', distinct(17), 4, None),
            ('bf16', distinct(3, 64, dt=BF16), 2, None),
            ('T_view', distinct(9, 4), 2, 'T0,1'),
            ('router_128', distinct(33, 128), 8, None)):
        case('topk_' + nm, 'topk', [x], ref(k), attrs={'k': k},
             views={0: view} if view else None, backward=False, exact=True)
    # ties go to the lower index
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0],
                      [5.0, -1.0, 5.0, 7.0, 7.0]])
    case('topk_ties', 'topk', [x], ref(3), attrs={'k': 3}, backward=False,
         exact=True)


def gather_cases():
    def ref(d):
        return lambda x, i: torch.gather(x, d, i.long())
    ix = torch.randint(0, 6, (4, 9), dtype=I64)  # repeats: grads add up
    case('gather_d1_repeats', 'gather', [randn(4, 6), ix], ref(1),
         attrs={'dim': 1}, grads=[0])
    case('gather_d0', 'gather', [randn(5, 3), torch.randint(0, 5, (7, 3))],
         ref(0), attrs={'dim': 0}, grads=[0])
    case('gather_3d_neg_dim_i32', 'gather',
         [randn(2, 3, 8), torch.randint(0, 8, (2, 3, 2), dtype=I32)],
         ref(-1), attrs={'dim': -1}, grads=[0])
    # index smaller than the input in the other dims
    case('gather_smaller_index', 'gather',
         [randn(4, 5, 6), torch.randint(0, 5, (2, 3, 4))], ref(1),
         attrs={'dim': 1}, grads=[0])
    case('gather_bf16', 'gather',
         [randn(3, 10, dt=BF16), torch.randint(0, 10, (3, 4))], ref(1),
         attrs={'dim': 1}, grads=[0])
    case('gather_T_view', 'gather', [randn(6, 4), torch.randint(0, 6, (4, 2))],
         ref(1), attrs={'dim': 1}, views={0: 'T0,1'}, grads=[0])
    # the MoE use: the chosen experts' probabilities
    p = torch.softmax(randn(8, 16, dt=torch.float64), -1).float()
    top = torch.topk(p, 2).indices
    case('gather_router_probs', 'gather', [p, top], ref(-1),
         attrs={'dim': -1}, grads=[0])
    case('gather_i64_values', 'gather',
         [torch.randint(-50, 50, (3, 7)), torch.randint(0, 7, (3, 3))],
         ref(1), attrs={'dim': 1}, backward=False, exact=True)


def one_hot_cases():
    def ref(n):
        return lambda i: F.one_hot(i.long(), n).float()
    case('one_hot_2d', 'one_hot', [torch.randint(0, 5, (2, 3))], ref(5),
         attrs={'n': 5}, backward=False, exact=True)
    case('one_hot_i32_1d', 'one_hot',
         [torch.randint(0, 8, (6,), dtype=I32)], ref(8), attrs={'n': 8},
         backward=False, exact=True)
    case('one_hot_n1', 'one_hot', [torch.zeros(4, dtype=I64)], ref(1),
         attrs={'n': 1}, backward=False, exact=True)


ACTS = {0: F.silu, 1: lambda t: F.gelu(t, approximate='tanh'), 2: F.gelu}


def moe_ref(act, gated):
    """A loop over the experts, each with the rows routed to it."""
    def f(x, idx, w, *ws):
        ws = [t.to(x.dtype) for t in ws]
        gate, up, down = ws if gated else [None] + ws
        out = torch.zeros_like(x)
        for e in range(up.shape[0]):
            sel = (idx.long() == e).nonzero()
            if len(sel) == 0:
                continue
            n, j = sel[:, 0], sel[:, 1]
            xe = x[n]
            u = xe @ up[e].T
            h = ACTS[act](xe @ gate[e].T) * u if gated else ACTS[act](u)
            out = out.index_add(0, n, w[n, j][:, None] * (h @ down[e].T))
        return out
    return f


def moe_cases():
    def routing(N, k, E, unused=(), none=0, idt=I64):
        """idx (N, k) over E experts, never the experts in unused; the
        first `none` tokens route nowhere (-1) in every slot, and token
        none+1 in its last slot only."""
        pool = [e for e in range(E) if e not in unused]
        idx = torch.stack([torch.tensor(pool)[torch.randperm(len(pool))[:k]]
                           for _ in range(N)])
        idx[:none] = -1
        if none < N - 1 and k > 1:
            idx[none + 1, -1] = -1
        return idx.to(idt)

    def routing_w(N, k):
        return torch.softmax(randn(N, k, dt=torch.float64), -1).float()

    cfgs = [
        # name, N, C, F, E, k, act, gated, weight dtype, unused, none, idt
        ('silu_gated_E4_k2', 12, 16, 24, 4, 2, 0, True, F32, (), 0, I64),
        ('silu_gated_E8_k2_idle_none', 20, 16, 12, 8, 2, 0, True, F32,
         (3, 6), 2, I64),
        ('gelu_tanh_gated_E6_k1', 15, 8, 20, 6, 1, 1, True, F32, (0,), 1,
         I32),
        ('gelu_ungated_E5_k2', 11, 16, 16, 5, 2, 2, False, F32, (4,), 1,
         I64),
        ('silu_gated_N1', 1, 32, 24, 8, 2, 0, True, F32, (), 0, I64),
        ('bf16_silu_gated_E4_k2', 12, 16, 24, 4, 2, 0, True, BF16, (2,), 1,
         I64),
        ('bf16_gelu_tanh_gated_E8_k1', 9, 24, 16, 8, 1, 1, True, BF16, (),
         0, I32),
        ('bf16_gelu_ungated_E4_k2', 10, 16, 8, 4, 2, 2, False, BF16, (1,),
         2, I64),
    ]
    for (nm, N, C, Fh, E, k, act, gated, wdt, unused, none, idt) in cfgs:
        x = randn(N, C)
        idx = routing(N, k, E, unused, none, idt)
        ws = ([randn(E, Fh, C, dt=wdt, scale=0.3)] if gated else []) + \
             [randn(E, Fh, C, dt=wdt, scale=0.3),
              randn(E, C, Fh, dt=wdt, scale=0.3)]
        grads = [0, 2] + ([] if wdt == BF16 else
                          list(range(3, 3 + len(ws))))
        case('moe_' + nm, 'moe_experts', [x, idx, routing_w(N, k)] + ws,
             moe_ref(act, gated), attrs={'act': act}, grads=grads,
             kind='mm')
    # strided inputs: x, idx and w transposed views, up and down stored
    # the other way round (each weight copied to contiguous inside)
    N, C, Fh, E, k = 7, 12, 10, 5, 2
    idx = routing(N, k, E, (2,), 1).T.contiguous()
    case('moe_strided_views', 'moe_experts',
         [randn(C, N), idx, routing_w(N, k).T.contiguous(),
          randn(E, Fh, C, scale=0.3), randn(E, C, Fh, scale=0.3),
          randn(E, Fh, C, scale=0.3)],
         moe_ref(1, True), attrs={'act': 1},
         views={0: 'T0,1', 1: 'T0,1', 2: 'T0,1', 4: 'T1,2', 5: 'T1,2'},
         grads=[0, 2, 3, 4, 5], kind='mm')
    # gate and up as the two halves of one fused (E, 2F, C) weight (rows
    # read in place, 2F C apart per expert); their gradients add up in it
    N, C, Fh, E, k = 9, 16, 12, 4, 2
    for wdt in (F32, BF16):
        case('moe_fused_gate_up_%s' % ('f32' if wdt == F32 else 'bf16'),
             'moe_experts',
             [randn(N, C), routing(N, k, E, (), 1), routing_w(N, k),
              randn(E, 2 * Fh, C, dt=wdt, scale=0.3), 3,
              randn(E, C, Fh, dt=wdt, scale=0.3)],
             moe_ref(0, True), attrs={'act': 0},
             views={3: 'S1,0,%d,1' % Fh, 4: 'S1,%d,%d,1' % (Fh, 2 * Fh)},
             grads=[0, 2] + ([3, 5] if wdt == F32 else []), kind='mm')
    # many rows per expert (the bf16 kernel's widen-then-BLAS path past 32
    # rows, its one-row path, and its 2..32-row path in one call), and a
    # token sent to one expert twice
    N, C, Fh, E, k = 60, 40, 36, 4, 2
    idx = torch.zeros(N, k, dtype=I64)
    idx[:, 0] = 0
    idx[:, 1] = torch.tensor([1] * 50 + [2] * 9 + [3])
    idx[5, 1] = 0
    for wdt in (F32, BF16):
        ws = [randn(E, Fh, C, dt=wdt, scale=0.2) for _ in range(2)] + \
             [randn(E, C, Fh, dt=wdt, scale=0.2)]
        case('moe_many_rows_%s' % ('f32' if wdt == F32 else 'bf16'),
             'moe_experts', [randn(N, C), idx.clone(), routing_w(N, k)] + ws,
             moe_ref(0, True), attrs={'act': 0},
             grads=[0, 2] + ([3, 4, 5] if wdt == F32 else []), kind='mm')


# ---- serialization ----------------------------------------------------------

def wstr(f, s):
    b = s.encode()
    f.write(struct.pack('<I', len(b)))
    f.write(b)


def wtensor(f, name, t):
    t = t.detach().contiguous()
    wstr(f, name)
    f.write(struct.pack('<II', DTYPE_CODE[t.dtype], t.dim()))
    for s in t.shape:
        f.write(struct.pack('<q', s))
    if t.dtype == BF16:
        data = t.view(torch.int16).numpy().tobytes()
    else:
        data = t.numpy().astype(t.numpy().dtype.newbyteorder('<')).tobytes()
    f.write(struct.pack('<Q', len(data)))
    f.write(data)


def image_cases():
    """conv2d (stride, per-side padding, dilation, groups, 1x1, depthwise,
    bf16 weights, a strided x), group norm, nearest upsampling, average
    pooling: forward and every gradient."""
    def conv(st=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1, bias=True):
        def f(x, w, *b):
            xp = F.pad(x, (pad[2], pad[3], pad[0], pad[1]))
            return F.conv2d(xp, w, b[0] if b else None, st, 0, dil, groups)
        return f

    def attrs(st=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1):
        return {'conv': [st[0], st[1], pad[0], pad[1], pad[2], pad[3],
                         dil[0], dil[1], groups]}

    for name, xs, ws, kw in [
            ('3x3_pad1', (2, 5, 9, 7), (6, 5, 3, 3),
             dict(pad=(1, 1, 1, 1))),
            ('3x3_stride2', (1, 4, 11, 10), (8, 4, 3, 3),
             dict(st=(2, 2), pad=(1, 1, 1, 1))),
            ('vae_down_pad01', (1, 3, 8, 8), (3, 3, 3, 3),
             dict(st=(2, 2), pad=(0, 1, 0, 1))),
            ('1x1', (2, 7, 5, 6), (9, 7, 1, 1), {}),
            ('5x3_dil2', (1, 3, 12, 9), (4, 3, 5, 3),
             dict(dil=(2, 1), pad=(2, 3, 1, 0))),
            ('groups2', (2, 6, 7, 7), (4, 3, 3, 3),
             dict(groups=2, pad=(1, 1, 1, 1))),
            ('depthwise', (2, 4, 6, 5), (4, 1, 3, 3),
             dict(groups=4, pad=(1, 1, 1, 1))),
            ('patch4', (2, 1, 16, 16), (8, 1, 4, 4), dict(st=(4, 4))),
            ('stride3_odd', (1, 2, 10, 13), (3, 2, 2, 4),
             dict(st=(3, 2)))]:
        case('conv2d_' + name, 'conv2d',
             [randn(*xs), randn(*ws, scale=0.3), randn(ws[0])],
             conv(**kw), attrs=attrs(**kw), kind='mm')
    case('conv2d_nobias', 'conv2d', [randn(1, 3, 6, 6), randn(5, 3, 3, 3)],
         conv(pad=(1, 1, 1, 1), bias=False),
         attrs=attrs(pad=(1, 1, 1, 1)), kind='mm')
    case('conv2d_strided_x', 'conv2d',
         [randn(5, 2, 8, 6), randn(4, 5, 3, 3), randn(4)],
         conv(pad=(1, 1, 1, 1)), attrs=attrs(pad=(1, 1, 1, 1)), kind='mm',
         views={0: 'P1,0,2,3'})
    case('conv2d_bf16_w', 'conv2d',
         [randn(1, 4, 6, 6), randn(6, 4, 3, 3, dt=BF16), randn(6)],
         lambda x, w, b: F.conv2d(x, w.to(x.dtype), b, 1, 1),
         attrs=attrs(pad=(1, 1, 1, 1)), kind='mm', upcast=False,
         tol=(1e-4, 1e-4), gtol=(2e-2, 2e-2))

    def gn(groups, eps):
        return lambda x, *wb: F.group_norm(x, groups, *wb, eps=eps)
    case('group_norm', 'group_norm',
         [randn(2, 8, 5, 3) * 2 + 1, randn(8), randn(8)], gn(4, 1e-6),
         attrs={'groups': 4, 'eps': 1e-6}, kind='red')
    case('group_norm_32', 'group_norm',
         [randn(1, 64, 9, 9), randn(64), randn(64)], gn(32, 1e-5),
         attrs={'groups': 32, 'eps': 1e-5}, kind='red')
    case('group_norm_1group_noaffine', 'group_norm', [randn(3, 6, 4)],
         gn(1, 1e-5), attrs={'groups': 1, 'eps': 1e-5}, kind='red')
    case('group_norm_bf16', 'group_norm',
         [randn(2, 4, 3, 3, dt=BF16), randn(4, dt=BF16), randn(4, dt=BF16)],
         gn(2, 1e-6), attrs={'groups': 2, 'eps': 1e-6}, kind='red')
    case('upsample_nearest_2x', 'upsample_nearest', [randn(2, 3, 4, 5)],
         lambda x: F.interpolate(x, scale_factor=2.0, mode='nearest'),
         attrs={'scale': [2, 2]})
    case('upsample_nearest_3x1', 'upsample_nearest', [randn(1, 2, 3, 4)],
         lambda x: F.interpolate(x, scale_factor=(3.0, 1.0), mode='nearest'),
         attrs={'scale': [3, 1]})
    case('avg_pool_2x2', 'avg_pool2d', [randn(2, 3, 8, 6)],
         lambda x: F.avg_pool2d(x, 2, 2), attrs={'pool': [2, 2, 2, 2]},
         kind='red')
    case('avg_pool_3x3_s2_odd', 'avg_pool2d', [randn(1, 2, 9, 7)],
         lambda x: F.avg_pool2d(x, 3, 2), attrs={'pool': [3, 3, 2, 2]},
         kind='red')
    case('avg_pool_2x3_s1', 'avg_pool2d', [randn(1, 1, 5, 6)],
         lambda x: F.avg_pool2d(x, (2, 3), 1), attrs={'pool': [2, 3, 1, 1]},
         kind='red')


def main():
    if len(sys.argv) != 2:
        sys.exit('usage: op_cases.py OUT.bin')
    binary_cases()
    unary_cases()
    where_cases()
    masked_fill_cases()
    red_cases()
    softmax_cases()
    matmul_cases()
    embedding_cases()
    concat_split_cases()
    cast_copy_cases()
    view_cases()
    norm_cases()
    rope_cases()
    attention_cases()
    ce_cases()
    edge_cases()
    more_cases()
    attention_ex_cases()
    topk_cases()
    gather_cases()
    one_hot_cases()
    moe_cases()
    image_cases()
    with open(sys.argv[1], 'wb') as f:
        f.write(b'TSCASE01')
        f.write(struct.pack('<I', len(cases)))
        for name, op, attrs, tensors in cases:
            wstr(f, name)
            wstr(f, op)
            wstr(f, attrs)
            f.write(struct.pack('<I', len(tensors)))
            for tn, t in tensors:
                wtensor(f, tn, t)
    print('op_cases.py: wrote %d cases to %s' % (len(cases), sys.argv[1]))


if __name__ == '__main__':
    main()
