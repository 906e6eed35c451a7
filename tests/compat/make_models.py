#!/usr/bin/python3
"""make_models.py OUT — the compatibility matrix's models and reference
outputs: for each case a tiny random model (seeded) in Hugging Face's exact
layout, and what tests/compat/ref_models.py computes for it.

  OUT/cases.txt            one line per case: "<case> <model_type>"
  OUT/<case>/              config.json (the published checkpoints' fields)
                           and model.safetensors (their tensor names), f32
  OUT/<case>.json          B, T, V, the greedy prompt and its 16 tokens, the
                           5 training losses and the reference's own
                           bf16-rounding shift (see below)
  OUT/<case>.ids           i64 (B, T), raw little-endian
  OUT/<case>.targets       i64 (B, T): ids shifted by one (next tokens)
  OUT/<case>.logits        f32 (B, T, V): f32 weights, f32 math
  OUT/<case>.logits_bf16   f32 (B, T, V): the matrices (2-D tensors: the
                           embeddings, projections, experts, GPT-2's wpe)
                           rounded to bf16, norms and biases f32, f32 math

No tokenizer.json: the families' npm tokenizers have 50k-262k entries,
and a vocab that covers them would make each model's embedding megabytes
and the training check slow; the vocabularies stay at 96-160 (README.md).
check_tokenizers.py runs copies grown to the real tokenizers' sizes
through the command line."""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import ref_models as R  # noqa: E402
from hf_qwen3 import write_safetensors  # noqa: E402

B, T = 2, 20
PROMPT, N_NEW = 8, 16  # greedy: ids[0, :8] then 16 tokens (24 positions)
STEPS, LR, BETAS, EPS, WD = 5, 1e-3, (0.9, 0.999), 1e-8, 0.01


def llama_like(mt, arch, V, C, L, H, KV, D, Fi, **extra):
    cfg = {"architectures": [arch], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
           "hidden_size": C, "initializer_range": 0.02, "intermediate_size": Fi,
           "max_position_embeddings": 512, "model_type": mt,
           "num_attention_heads": H, "num_hidden_layers": L,
           "num_key_value_heads": KV, "rms_norm_eps": 1e-06, "rope_scaling": None,
           "rope_theta": 10000.0, "tie_word_embeddings": False,
           "torch_dtype": "float32", "transformers_version": "4.51.0",
           "use_cache": True, "vocab_size": V}
    if D != C // H or mt in ("llama", "qwen3", "qwen3_moe", "mistral"):
        cfg["head_dim"] = D
    cfg.update(extra)
    return cfg


def configs():
    c = {}
    c["gpt2"] = {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 95, "embd_pdrop": 0.1, "eos_token_id": 95,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 64, "n_embd": 48, "n_head": 4, "n_inner": None, "n_layer": 2,
        "n_positions": 64, "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
        "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
        "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "torch_dtype": "float32",
        "transformers_version": "4.51.0", "use_cache": True, "vocab_size": 96}
    c["llama"] = llama_like("llama", "LlamaForCausalLM", 100, 64, 2, 4, 2, 16, 96,
                            mlp_bias=False, pretraining_tp=1, rope_theta=500000.0)
    # Llama with attention_bias (q, k, v and o) and mlp_bias (gate, up, down)
    c["llama_bias"] = llama_like("llama", "LlamaForCausalLM", 100, 64, 2, 4, 2, 16, 96,
                                 attention_bias=True, mlp_bias=True, pretraining_tp=1)
    # Llama 3.1's rope_scaling, original length 16 < the 20..24 positions used
    c["llama31"] = llama_like(
        "llama", "LlamaForCausalLM", 100, 64, 2, 4, 4, 16, 96, mlp_bias=False,
        pretraining_tp=1, rope_theta=500000.0, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=[2, 3],
        rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 16, "rope_type": "llama3"})
    c["qwen2"] = llama_like("qwen2", "Qwen2ForCausalLM", 120, 48, 2, 4, 2, 12, 80,
                            max_window_layers=2, rope_theta=1000000.0,
                            sliding_window=32, tie_word_embeddings=True,
                            use_sliding_window=False)
    del c["qwen2"]["attention_bias"]
    c["qwen3"] = llama_like("qwen3", "Qwen3ForCausalLM", 128, 48, 2, 4, 2, 16, 80,
                            max_window_layers=2, rope_theta=1000000.0,
                            sliding_window=None, tie_word_embeddings=True,
                            use_sliding_window=False)
    # Qwen3's long-context recipe, rope_scaling "yarn" (factor 4 over an
    # original 16 positions: max_position_embeddings = 4 x 16, as the
    # published recipe keeps them consistent)
    c["qwen3_yarn"] = llama_like("qwen3", "Qwen3ForCausalLM", 128, 48, 2, 4, 2, 16, 80,
                                 max_window_layers=2, rope_theta=10000.0,
                                 sliding_window=None, tie_word_embeddings=True,
                                 use_sliding_window=False, max_position_embeddings=64,
                                 rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 16})
    # the window (6) is shorter than the sequences (20, 24)
    c["mistral"] = llama_like("mistral", "MistralForCausalLM", 100, 48, 2, 4, 2, 12, 96,
                              sliding_window=6, rope_theta=1000000.0)
    del c["mistral"]["attention_bias"]
    gem = dict(attention_bias=False, bos_token_id=2, eos_token_id=1, pad_token_id=0,
               hidden_activation="gelu_pytorch_tanh", cache_implementation="hybrid",
               head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
               tie_word_embeddings=True)
    # 3 layers: sliding, global, sliding; soft-caps small enough to bend
    c["gemma2"] = llama_like("gemma2", "Gemma2ForCausalLM", 128, 48, 3, 4, 2, 16, 96,
                             attn_logit_softcapping=4.0, final_logit_softcapping=6.0,
                             hidden_act="gelu_pytorch_tanh", rope_theta=10000.0, **gem)
    # 7 layers with the published pattern 6: five local, one global, one local
    c["gemma3"] = llama_like("gemma3_text", "Gemma3ForCausalLM", 128, 32, 7, 2, 1, 16, 64,
                             attn_logit_softcapping=None, final_logit_softcapping=None,
                             hidden_act="gelu_pytorch_tanh", rope_theta=1000000.0,
                             rope_local_base_freq=10000.0, sliding_window_pattern=6,
                             rope_scaling={"factor": 8.0, "rope_type": "linear"}, **gem)
    c["gemma3"].pop("hidden_act")
    phi = dict(embd_pdrop=0.0, resid_pdrop=0.0, pad_token_id=32, bos_token_id=1,
               eos_token_id=32, sliding_window=2047, rms_norm_eps=1e-05)
    c["phi3"] = llama_like("phi3", "Phi3ForCausalLM", 100, 48, 2, 4, 2, 12, 64,
                           original_max_position_embeddings=512, **phi)
    # longrope: original length 6 < the greedy prompt (8) and T (20), so
    # the long factors are used everywhere; factor 48 / 6 = 8
    rng = np.random.RandomState(5)
    c["phi3_longrope"] = llama_like(
        "phi3", "Phi3ForCausalLM", 100, 48, 2, 4, 2, 12, 64,
        max_position_embeddings=48, original_max_position_embeddings=6,
        rope_scaling={"long_factor": [round(float(x), 4) for x in 1 + 3 * rng.rand(6)],
                      "short_factor": [round(float(x), 4) for x in 1 + 0.2 * rng.rand(6)],
                      "type": "longrope"}, **phi)
    c["qwen3_moe"] = llama_like(
        "qwen3_moe", "Qwen3MoeForCausalLM", 128, 32, 3, 4, 2, 8, 64,
        decoder_sparse_step=1, max_window_layers=3, mlp_only_layers=[1],
        moe_intermediate_size=24, norm_topk_prob=True, num_experts=8,
        num_experts_per_tok=2, output_router_logits=False, rope_theta=1000000.0,
        router_aux_loss_coef=0.05, sliding_window=None, use_sliding_window=False)
    c["mixtral"] = llama_like(
        "mixtral", "MixtralForCausalLM", 100, 32, 2, 4, 2, 8, 48,
        num_local_experts=4, num_experts_per_tok=2, output_router_logits=False,
        rope_theta=1000000.0, router_aux_loss_coef=0.02, sliding_window=6,
        rms_norm_eps=1e-05)
    del c["mixtral"]["attention_bias"]
    return c


def make_params(cfg, g):
    """Random weights under the checkpoint's names, in state_dict order."""
    d = R.describe(cfg)
    rnd = lambda *s, std=0.1: torch.randn(*s, generator=g) * std  # noqa: E731
    nw = (lambda n: rnd(n)) if d["norm"] == "rms_1p" else (lambda n: 1 + rnd(n))
    V, C, L, H, KV, D, Fi = (d[k] for k in ("vocab", "hidden", "layers", "heads",
                                            "kv_heads", "head_dim", "intermediate"))
    p = {}
    if d["model_type"] == "gpt2":
        p["transformer.wte.weight"] = rnd(V, C, std=0.2)
        p["transformer.wpe.weight"] = rnd(cfg["n_positions"], C, std=0.2)
        for i in range(L):
            pre = "transformer.h.%d." % i
            for ln in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
                shape = {"ln_1": (C,), "ln_2": (C,), "attn.c_attn": (C, 3 * C),
                         "attn.c_proj": (C, C), "mlp.c_fc": (C, Fi), "mlp.c_proj": (Fi, C)}[ln]
                if ln.startswith("ln"):
                    p[pre + ln + ".weight"], p[pre + ln + ".bias"] = 1 + rnd(C), rnd(C)
                else:  # Conv1D: weight (in, out)
                    p[pre + ln + ".weight"] = rnd(*shape, std=0.2)
                    p[pre + ln + ".bias"] = rnd(shape[1])
        p["transformer.ln_f.weight"], p["transformer.ln_f.bias"] = 1 + rnd(C), rnd(C)
        return p
    mt = d["model_type"]
    p["model.embed_tokens.weight"] = rnd(V, C, std=0.2)
    for i in range(L):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = nw(C)
        if mt == "phi3":
            p[pre + "self_attn.qkv_proj.weight"] = rnd((H + 2 * KV) * D, C)
        else:
            for n, rows in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
                p[pre + "self_attn.%s.weight" % n] = rnd(rows, C)
                if d["qkv_bias"]:
                    p[pre + "self_attn.%s.bias" % n] = rnd(rows)
        p[pre + "self_attn.o_proj.weight"] = rnd(C, H * D)
        if d.get("o_bias"):
            p[pre + "self_attn.o_proj.bias"] = rnd(C)
        if d["qk_norm"]:
            p[pre + "self_attn.q_norm.weight"] = nw(D)
            p[pre + "self_attn.k_norm.weight"] = nw(D)
        p[pre + "post_attention_layernorm.weight"] = nw(C)
        if d["sandwich"]:
            p[pre + "pre_feedforward_layernorm.weight"] = nw(C)
            p[pre + "post_feedforward_layernorm.weight"] = nw(C)
        if d["moe"][i]:
            E, Fm = d["n_experts"], d["moe_intermediate"]
            if mt == "mixtral":
                p[pre + "block_sparse_moe.gate.weight"] = rnd(E, C, std=0.5)
                for e in range(E):
                    q = pre + "block_sparse_moe.experts.%d." % e
                    p[q + "w1.weight"] = rnd(Fm, C)
                    p[q + "w2.weight"] = rnd(C, Fm)
                    p[q + "w3.weight"] = rnd(Fm, C)
            else:
                p[pre + "mlp.gate.weight"] = rnd(E, C, std=0.5)
                for e in range(E):
                    q = pre + "mlp.experts.%d." % e
                    p[q + "gate_proj.weight"] = rnd(Fm, C)
                    p[q + "up_proj.weight"] = rnd(Fm, C)
                    p[q + "down_proj.weight"] = rnd(C, Fm)
        elif mt == "phi3":
            p[pre + "mlp.gate_up_proj.weight"] = rnd(2 * Fi, C)
            p[pre + "mlp.down_proj.weight"] = rnd(C, Fi)
        else:
            p[pre + "mlp.gate_proj.weight"] = rnd(Fi, C)
            p[pre + "mlp.up_proj.weight"] = rnd(Fi, C)
            p[pre + "mlp.down_proj.weight"] = rnd(C, Fi)
            if d.get("mlp_bias"):
                for n, rows in (("gate_proj", Fi), ("up_proj", Fi), ("down_proj", C)):
                    p[pre + "mlp.%s.bias" % n] = rnd(rows)
    p["model.norm.weight"] = nw(C)
    if not d["tie"]:
        p["lm_head.weight"] = rnd(V, C, std=0.2)
    return p


def bf16_matrices(p):
    return {k: (v.to(torch.bfloat16).float() if v.dim() >= 2 else v) for k, v in p.items()}


def router_gap(cfg, p, ids, routers=None):
    """The smallest gap, over tokens and MoE layers, between the k-th and
    the (k+1)-th routing probability: how far routing is from a tie."""
    if routers is None:
        with torch.no_grad():
            routers = R.forward(cfg, p, ids)[1]
    if not routers:
        return None
    k = R.describe(cfg)["top_k"]
    gap = float("inf")
    for r in routers:
        s = torch.softmax(r, dim=-1).sort(dim=-1, descending=True).values
        gap = min(gap, float((s[:, k - 1] - s[:, k]).min()))
    return gap


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def train(cfg, p, ids, targets):
    """STEPS steps of torch.optim.AdamW on every parameter (one group, as
    HF's Trainer without a no-decay split); the loss before each step."""
    q = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    opt = torch.optim.AdamW(list(q.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    out = []
    for _ in range(STEPS):
        opt.zero_grad()
        total, ce, aux = R.loss(cfg, q, ids, targets)
        gap = router_gap(cfg, q, ids)
        out.append((float(total), float(ce), float(aux), gap))
        total.backward()
        opt.step()
    return out


def make(root, name, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    p = make_params(cfg, g)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(d, "model.safetensors"), list(p.items()))
    V = R.describe(cfg)["vocab"]
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.cat([ids[:, 1:], torch.randint(0, V, (B, 1), generator=g)], dim=1)
    with torch.no_grad():
        logits = R.forward(cfg, p, ids)[0].float()
        logits_bf = R.forward(cfg, bf16_matrices(p), ids)[0].float()
    prompt = [int(t) for t in ids[0, :PROMPT]]
    toks, gap = R.greedy(cfg, p, prompt, N_NEW)
    losses = train(cfg, p, ids, targets)
    base = os.path.join(root, name)
    ids.numpy().astype("<i8").tofile(base + ".ids")
    targets.numpy().astype("<i8").tofile(base + ".targets")
    logits.numpy().astype("<f4").tofile(base + ".logits")
    logits_bf.numpy().astype("<f4").tofile(base + ".logits_bf16")
    ref = {"case": name, "model_type": cfg["model_type"], "B": B, "T": T, "V": V,
           "layers": R.describe(cfg)["layers"],
           "prompt": prompt, "greedy": toks, "greedy_min_gap": gap,
           "train_lr": LR, "train_betas": list(BETAS), "train_eps": EPS,
           "train_weight_decay": WD,
           "train_losses": [l[0] for l in losses],
           "train_ce": [l[1] for l in losses], "train_aux": [l[2] for l in losses],
           "bf16_shift": rel(logits_bf, logits),
           "router_min_gap": (None if losses[0][3] is None else
                              min(l[3] for l in losses)),
           "router_min_gap_bf16": router_gap(cfg, bf16_matrices(p), ids),
           "logits_absmax": float(logits.abs().max())}
    with open(base + ".json", "w") as f:
        json.dump(ref, f, indent=1)
    return ref


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_models.py OUT")
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    torch.set_num_threads(1)  # deterministic sums
    lines = []
    for i, (name, cfg) in enumerate(configs().items()):
        # the first seed whose decisions sit clear of ties: a greedy step
        # (best vs second logit) or an expert choice (k-th vs k+1-th routing
        # probability, f32 and bf16 weights, every training step) decided by
        # less could flip on rounding alone
        for attempt in range(50):
            ref = make(root, name, cfg, 4242 + 17 * i + 1000 * attempt)
            gaps = [ref[k] for k in ("router_min_gap", "router_min_gap_bf16")
                    if ref[k] is not None]
            if ref["greedy_min_gap"] >= 1e-3 and (not gaps or min(gaps) >= 2e-5):
                break
        else:
            sys.exit("%s: no seed clear of ties" % name)
        lines.append("%s %s\n" % (name, cfg["model_type"]))
        print("%-14s %-12s loss %.4f -> %.4f  bf16 shift %.2e  gap %.2e  router gap %s" %
              (name, cfg["model_type"], ref["train_losses"][0], ref["train_losses"][-1],
               ref["bf16_shift"], ref["greedy_min_gap"], ref["router_min_gap"]))
    with open(os.path.join(root, "cases.txt"), "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main()
