"""test_py_torch_compile — PyTorch modules compiled onto Tessera
(tessera.torch.compile, issue 20), held against torch eager on the plain
torch models of torch_ref_models.py (GPT-2, Qwen3-style):

  forward   logits within 1e-5 of eager, relative to the logits' scale
  train     every parameter's .grad (and an input's) within 1e-4 of eager's
  AdamW     20 steps of an unchanged torch training loop: losses within 1e-4,
            final parameters close
  shapes    a new batch shape recaptures; the old one still runs
  errors    an unmapped op (torch.cumsum) names itself and the model's
            file:line; fallback=True runs it in PyTorch and matches eager

Each on "cpu" and, where the machine has one, "vulkan:0".

    PYTHONPATH=python TESSERA_LIBRARY=build/libtessera.so python3 tests/python/test_py_torch_compile.py
"""

import collections
import copy
import os
import sys
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
import torch_ref_models as M  # noqa: E402

torch.set_num_threads(2)
DEVICES = ["cpu"] + (["vulkan:0"] if "vulkan:0" in tessera.devices() else [])
MODELS = {
    "gpt2": M.gpt2,
    "qwen3": M.qwen3,
    "qwen3 repeat_interleave": lambda: M.qwen3(repeat_kv="repeat_interleave"),
}
FWD_TOL, GRAD_TOL, LOSS_TOL = 1e-5, 1e-4, 1e-4


def max_diff(a, b):
    return (a.detach() - b.detach()).abs().max().item()


def lm_loss(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def train_losses(model, fwd, steps=20, seed=0):
    """An ordinary torch loop: AdamW, lr 1e-3, on a fixed batch (so the loss
    falls and every step's update matters for the next)."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = M.batch()
    losses = []
    for _ in range(steps):
        loss = lm_loss(fwd(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


class CompileCase(unittest.TestCase):
    def assertClose(self, got, ref, tol, what):
        scale = max(1.0, ref.detach().abs().max().item())
        d = max_diff(got, ref)
        self.assertEqual(tuple(got.shape), tuple(ref.shape), what)
        self.assertLessEqual(d, tol * scale, f"{what}: max |diff| {d:.3g} > {tol:g} x scale {scale:.3g}")


class TestForward(CompileCase):
    def test_logits_match_eager(self):
        for dev in DEVICES:
            for name, make in MODELS.items():
                with self.subTest(model=name, device=dev):
                    m = make()
                    x, _ = M.batch()
                    cm = tt.compile(m, device=dev)
                    out = cm(x)
                    self.assertIsInstance(out, torch.Tensor)
                    self.assertEqual(out.dtype, torch.float32)
                    with torch.no_grad():
                        ref = m(x)
                    self.assertClose(out, ref, FWD_TOL, f"{name} logits on {dev}")
                    self.assertClose(cm(x), ref, FWD_TOL, f"{name} logits on {dev}, second call")

    def test_parameter_updates_are_seen(self):
        # the parameters are handed over once; in-place changes show at the next call
        for dev in DEVICES:
            for name in ("gpt2", "qwen3"):
                with self.subTest(model=name, device=dev):
                    self.check_update_seen(MODELS[name](), dev)

    def check_update_seen(self, m, dev):
        x, _ = M.batch()
        cm = tt.compile(m, device=dev)
        before = cm(x).clone()
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1.5)
            ref = m(x)
        self.assertGreater(max_diff(before, ref), 1e-2)
        self.assertClose(cm(x), ref, FWD_TOL, f"{type(m).__name__} after an in-place update on {dev}")

    def test_new_batch_shape_recaptures(self):
        for dev in DEVICES:
            for name in ("gpt2", "qwen3"):
                with self.subTest(model=name, device=dev):
                    m = MODELS[name]()
                    cm = tt.compile(m, device=dev)
                    for B, T in ((2, 16), (3, 8), (1, 5), (2, 16)):
                        x, _ = M.batch(B=B, T=T, seed=B * 100 + T)
                        with torch.no_grad():
                            ref = m(x)
                        self.assertClose(cm(x), ref, FWD_TOL, f"{name} at B={B}, T={T} on {dev}")

    def test_output_structure(self):
        torch.manual_seed(0)
        m = _Structured().eval()
        x, h = torch.randn(5, 8), torch.randn(2, 5, 8)
        got, ref = tt.compile(m)(x, h), m(x, h)
        self.assertIsInstance(got, dict)
        self.assertEqual(sorted(got), ["y", "z"])
        self.assertIsInstance(got["z"], tuple)
        self.assertEqual(len(got["z"]), 2)
        self.assertClose(got["y"], ref["y"], FWD_TOL, "y")
        self.assertClose(got["z"][0], ref["z"][0], FWD_TOL, "z[0]")
        self.assertClose(got["z"][1], ref["z"][1], FWD_TOL, "z[1]")

    def test_output_tuple_and_list(self):
        torch.manual_seed(0)
        m = _Pairs().eval()
        x = torch.randn(5, 8)
        got, ref = tt.compile(m)(x), m(x)
        self.assertIsInstance(got, list)
        self.assertIsInstance(got[1], tuple)
        self.assertClose(got[0], ref[0], FWD_TOL, "[0]")
        self.assertClose(got[1][0], ref[1][0], FWD_TOL, "[1][0]")

    def test_output_namedtuple(self):
        torch.manual_seed(0)
        m = _Named().eval()
        x = torch.randn(5, 8)
        got, ref = tt.compile(m)(x), m(x)
        self.assertIsInstance(got, _NT)
        self.assertClose(got.lin, ref.lin, FWD_TOL, "lin")
        self.assertClose(got.act, ref.act, FWD_TOL, "act")


class TestTrain(CompileCase):
    def test_grads_match_eager(self):
        for dev in DEVICES:
            for name, make in MODELS.items():
                with self.subTest(model=name, device=dev):
                    m = make()
                    x, y = M.batch()
                    cm = tt.compile(m, device=dev, train=True)
                    out = cm(x)
                    self.assertTrue(out.requires_grad)
                    loss = lm_loss(out, y)
                    loss.backward()
                    got = {n: p.grad.clone() for n, p in m.named_parameters()}
                    m.zero_grad()
                    ref_loss = lm_loss(m(x), y)
                    ref_loss.backward()
                    self.assertAlmostEqual(loss.item(), ref_loss.item(), delta=LOSS_TOL)
                    bad = []
                    for n, p in m.named_parameters():
                        if got[n] is None:
                            bad.append(f"{n}: no grad")
                            continue
                        d = max_diff(got[n], p.grad)
                        if d > GRAD_TOL:
                            scale = p.grad.abs().max().item()
                            bad.append(f"{n}: max |diff| {d:.3g} (grad scale {scale:.3g})")
                    self.assertEqual(bad, [], f"{name} on {dev}: grads off eager's")

    def test_tied_weight_gets_both_grads(self):
        # GPT-2's wte and lm_head are one Parameter: its grad is the sum of
        # the embedding's and the head's
        for dev in DEVICES:
            with self.subTest(device=dev):
                m = M.gpt2()
                self.assertIs(m.transformer.wte.weight, m.lm_head.weight)
                x, y = M.batch()
                lm_loss(tt.compile(m, device=dev, train=True)(x), y).backward()
                got = m.lm_head.weight.grad.clone()
                m.zero_grad()
                lm_loss(m(x), y).backward()
                self.assertClose(got, m.lm_head.weight.grad, GRAD_TOL, f"tied wte/lm_head grad on {dev}")

    def test_input_grads(self):
        # a block over float inputs that require grad: the input's grad too
        for dev in DEVICES:
            with self.subTest(device=dev):
                torch.manual_seed(0)
                blk = M.Block(M.GPTConfig()).eval()
                x = torch.randn(2, 16, 64, requires_grad=True)
                out = tt.compile(blk, device=dev, train=True)(x)
                (out * out).mean().backward()
                gx = x.grad.clone()
                got = {n: p.grad.clone() for n, p in blk.named_parameters()}
                x.grad = None
                blk.zero_grad()
                ref = blk(x)
                (ref * ref).mean().backward()
                self.assertClose(out, ref, FWD_TOL, "block output")
                self.assertClose(gx, x.grad, GRAD_TOL, "input grad")
                for n, p in blk.named_parameters():
                    self.assertClose(got[n], p.grad, GRAD_TOL, n)

    def test_no_grad_call_carries_no_graph(self):
        m = M.qwen3()
        x, _ = M.batch()
        cm = tt.compile(m, train=True)
        with torch.no_grad():
            out = cm(x)
        self.assertFalse(out.requires_grad)
        self.assertClose(out, m(x), FWD_TOL, "no_grad logits")

    def test_adamw_loop_matches_eager(self):
        for dev in DEVICES:
            for name in ("gpt2", "qwen3"):
                with self.subTest(model=name, device=dev):
                    ref = MODELS[name]()
                    mine = copy.deepcopy(ref)
                    cm = tt.compile(mine, device=dev, train=True)
                    got = train_losses(mine, cm)
                    want = train_losses(ref, ref)
                    self.assertLess(want[-1], want[0] - 0.1)  # the loop learns
                    diffs = [abs(a - b) for a, b in zip(got, want)]
                    self.assertLessEqual(max(diffs), LOSS_TOL,
                                         f"{name} on {dev}: step {diffs.index(max(diffs))}: "
                                         f"{got} vs {want}")
                    for (n, p), q in zip(mine.named_parameters(), ref.parameters()):
                        self.assertClose(p, q, 1e-4, f"{name} on {dev}: {n} after 20 steps")


class TestUnsupported(CompileCase):
    def cumsum_line(self):
        path = os.path.abspath(M.__file__)
        with open(path) as f:
            for i, line in enumerate(f, 1):
                if "CUMSUM_LINE" in line and "torch.cumsum" in line:
                    return os.path.basename(path), i
        raise AssertionError("no CUMSUM_LINE in torch_ref_models.py")

    def test_unmapped_op_names_itself(self):
        m = M.cumsum_model()
        x = torch.randn(2, 5, 8)
        with self.assertRaises(tt.UnsupportedOp) as cm:
            tt.compile(m)(x)
        e = cm.exception
        self.assertIsInstance(e, tessera.Error)
        self.assertTrue(issubclass(tt.UnsupportedOp, tessera.Error))
        msg = str(e)
        self.assertIn("aten.cumsum", msg)
        fname, line = self.cumsum_line()
        self.assertIn(f"{fname}:{line}", msg)

    def test_fallback_matches_eager(self):
        for dev in DEVICES:
            with self.subTest(device=dev):
                m = M.cumsum_model()
                x = torch.randn(2, 5, 8)
                out = tt.compile(m, device=dev, fallback=True)(x)
                with torch.no_grad():
                    ref = m(x)
                self.assertClose(out, ref, FWD_TOL, f"fallback on {dev}")

    def test_fallback_trains(self):
        m = M.cumsum_model()
        x = torch.randn(2, 5, 8, requires_grad=True)
        out = tt.compile(m, train=True, fallback=True)(x)
        (out * out).sum().backward()
        gx, gw = x.grad.clone(), m.proj.weight.grad.clone()
        x.grad = None
        m.zero_grad()
        ref = m(x)
        (ref * ref).sum().backward()
        self.assertClose(gw, m.proj.weight.grad, GRAD_TOL, "proj.weight grad")
        self.assertClose(gx, x.grad, GRAD_TOL, "input grad through cumsum")

    def test_not_a_module(self):
        with self.assertRaises(tessera.Error):
            tt.compile(lambda x: x)


# ---- small modules for the output-structure tests ----
class _Structured(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 3)

    def forward(self, x, h):
        return {"y": self.a(x) * 2, "z": (F.silu(self.b(h)), self.a(h).softmax(-1))}


class _Pairs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, x):
        return [self.a(x), (self.a(x).relu(),)]


_NT = collections.namedtuple("_NT", "lin act")


class _Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, x):
        return _NT(self.a(x), self.a(x).relu())



class TestEdgeCases(unittest.TestCase):
    """Regressions from review: each once gave a wrong answer silently."""

    def test_output_order_and_inputs_as_outputs(self):
        class M(nn.Module):
            def forward(self, a, b):
                c, d = a * 2, b * 3
                return d, c, a, c

        a, b = torch.randn(3, 4), torch.randn(3, 4)
        got = tessera.torch.compile(M())(a, b)
        for g, w in zip(got, M()(a, b)):
            self.assertLess((g - w).abs().max().item(), 1e-6)

    def test_backward_through_two_outputs(self):
        torch.manual_seed(0)
        lin = nn.Linear(6, 6)

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = lin

            def forward(self, x):
                h = self.lin(x)
                return h.relu(), h

        x = torch.randn(4, 6)
        r, h = tessera.torch.compile(M(), train=True)(x)
        (r.sum() + (h * h).sum()).backward()
        got = lin.weight.grad.clone()
        lin.zero_grad()
        r, h = M()(x)
        (r.sum() + (h * h).sum()).backward()
        self.assertLess((got - lin.weight.grad).abs().max().item(), 1e-5)

    def test_inplace_through_a_view_is_refused_or_right(self):
        class M(nn.Module):
            def forward(self, a):
                y = a * 2
                y.view(-1).add_(1)
                return y

        a = torch.randn(3, 4)
        with self.assertRaises(tessera.torch.UnsupportedOp):
            tessera.torch.compile(M())(a)
        got = tessera.torch.compile(M(), fallback=True)(a)
        self.assertLess((got - M()(a)).abs().max().item(), 1e-6)
        class U(nn.Module):
            def forward(self, x):
                return x.add_(1)

        before = a.clone()  # an input the module updates: refused, the caller's tensor untouched
        with self.assertRaises(tessera.torch.UnsupportedOp):
            tessera.torch.compile(U())(a)
        self.assertTrue(torch.equal(a, before))

    def test_learned_attention_bias_gets_its_gradient(self):
        torch.manual_seed(0)

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.bias = nn.Parameter(torch.randn(1, 2, 5, 5))

            def forward(self, q, k, v):
                s = q @ k.transpose(-2, -1) * 0.3 + self.bias
                return s.softmax(-1) @ v

        m = M()
        q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
        tessera.torch.compile(m, train=True)(q, k, v).sum().backward()
        got = m.bias.grad.clone()
        m.bias.grad = None
        m(q, k, v).sum().backward()
        self.assertLess((got - m.bias.grad).abs().max().item(), 1e-5)

if __name__ == "__main__":
    unittest.main(verbosity=2)
