"""ref_models.py — one plain-PyTorch reference for every causal-LM family of
the compatibility matrix (tests/compat/), written from Hugging Face
Transformers' modeling code. Each piece names the HF function or class it
follows. Everything is computed in f32 from a config.json dict and a dict
of tensors under the checkpoint's own names, so the same code runs the
forward (logits), greedy decoding and training (autograd through it).

The family-specific choices are gathered in describe(cfg), the same
description Tessera's ts_model_config carries (include/tessera_io.h):
norm kind, positions and rope scaling, attention options, sliding layers,
MLP kind, experts, softcaps."""
import math

import torch
import torch.nn.functional as F

LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral", "phi3", "qwen3_moe", "mixtral")
GEMMA = ("gemma2", "gemma3_text")


def rope_type(cfg):
    rs = cfg.get("rope_scaling")
    if not rs:
        return "default"
    # configuration_utils / rope_config_validation: "type" is the old name
    return rs.get("rope_type", rs.get("type", "default"))


def describe(cfg):
    """The decoder description of a config.json (what ts_config_load fills)."""
    mt = cfg["model_type"]
    d = {"model_type": mt}
    if mt == "gpt2":
        C, H = cfg["n_embd"], cfg["n_head"]
        d.update(vocab=cfg["vocab_size"], hidden=C, layers=cfg["n_layer"], heads=H,
                 kv_heads=H, head_dim=C // H,
                 intermediate=cfg.get("n_inner") or 4 * C,
                 eps=cfg["layer_norm_epsilon"], norm="layer", pos="learned",
                 tie=True, act="gelu_tanh")
        return d
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    d.update(vocab=cfg["vocab_size"], hidden=C, layers=cfg["num_hidden_layers"],
             heads=H, kv_heads=cfg.get("num_key_value_heads") or H,
             head_dim=cfg.get("head_dim") or C // H,
             intermediate=cfg["intermediate_size"], eps=cfg["rms_norm_eps"],
             norm="rms_1p" if mt in GEMMA else "rms", pos="rope",
             rope_theta=cfg.get("rope_theta", 10000.0),
             tie=cfg.get("tie_word_embeddings", mt in GEMMA),
             act="gelu_tanh" if mt in GEMMA else "silu")
    d["qk_norm"] = mt in ("qwen3", "qwen3_moe", "gemma3_text")
    d["qkv_bias"] = mt == "qwen2" or bool(cfg.get("attention_bias"))
    # LlamaAttention (and Qwen3's, Gemma's): o_proj bias=attention_bias too;
    # Qwen2Attention keeps o_proj bias-free. LlamaMLP: bias=mlp_bias on all
    d["o_bias"] = mt != "qwen2" and bool(cfg.get("attention_bias"))
    d["mlp_bias"] = bool(cfg.get("mlp_bias"))
    d["sandwich"] = mt in GEMMA
    d["embed_scale"] = mt in GEMMA
    # Gemma2Attention / Gemma3Attention: scaling = query_pre_attn_scalar**-0.5
    d["scaling"] = (cfg["query_pre_attn_scalar"] ** -0.5 if mt in GEMMA
                    else d["head_dim"] ** -0.5)
    d["attn_softcap"] = cfg.get("attn_logit_softcapping") if mt == "gemma2" else None
    d["final_softcap"] = cfg.get("final_logit_softcapping") if mt in GEMMA else None
    # which layers slide
    L, w = d["layers"], cfg.get("sliding_window")
    if mt == "gemma2":  # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)
        sl = [i % 2 == 0 for i in range(L)]
    elif mt == "gemma3_text":  # Gemma3DecoderLayer: bool((layer_idx + 1) % pattern)
        p = cfg.get("sliding_window_pattern", 6)
        sl = [(i + 1) % p != 0 for i in range(L)]
    elif mt in ("mistral", "mixtral", "phi3"):  # every layer when set
        sl = [w is not None] * L
    elif mt in ("qwen2", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window"):
        sl = [i >= cfg.get("max_window_layers", L) for i in range(L)]
    else:
        sl = [False] * L
    d["window"] = w
    d["sliding"] = sl
    # mixture of experts
    d["moe"] = [False] * L
    if mt == "qwen3_moe":
        # Qwen3MoeDecoderLayer: sparse unless in mlp_only_layers, and every
        # decoder_sparse_step-th layer
        step = cfg.get("decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers", [])
        d["moe"] = [i not in only and cfg["num_experts"] > 0 and (i + 1) % step == 0
                    for i in range(L)]
        d.update(n_experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                 moe_intermediate=cfg["moe_intermediate_size"],
                 norm_topk=cfg.get("norm_topk_prob", False),
                 aux_coef=cfg.get("router_aux_loss_coef", 0.001))
    if mt == "mixtral":
        d["moe"] = [True] * L
        d.update(n_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                 moe_intermediate=cfg["intermediate_size"], norm_topk=True,
                 aux_coef=cfg.get("router_aux_loss_coef", 0.001))
    return d


# ---- norms ----------------------------------------------------------------

def rms_norm(x, w, eps):
    """LlamaRMSNorm.forward (also Qwen2/Qwen3/Mistral/Phi3/Mixtral/Qwen3Moe):
    x * rsqrt(mean(x^2) + eps) in f32, times w."""
    x = x.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gemma_rms_norm(x, w, eps):
    """Gemma2RMSNorm / Gemma3RMSNorm.forward: the same in f32, times (1 + w)."""
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * (1.0 + w.float())


def norm(d, x, p, name):
    if d["norm"] == "layer":  # GPT2Block's nn.LayerNorm(eps=layer_norm_epsilon)
        return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], d["eps"])
    if d["norm"] == "rms_1p":
        return gemma_rms_norm(x, p[name + ".weight"], d["eps"])
    return rms_norm(x, p[name + ".weight"], d["eps"])


# ---- rotary positions (modeling_rope_utils.py) ----------------------------

def inv_freq_default(D, base):
    """_compute_default_rope_parameters."""
    return 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))


def rope_params(cfg, d, seq_len, local=False):
    """(inv_freq (D/2,), attention_scaling) of one layer for a forward whose
    highest position + 1 is seq_len. local: a Gemma 3 sliding layer, which
    uses the default rope at rope_local_base_freq (Gemma3TextModel's
    rotary_emb_local)."""
    D = d["head_dim"]
    if local:
        return inv_freq_default(D, cfg["rope_local_base_freq"]), 1.0
    base, rt, rs = d["rope_theta"], rope_type(cfg), cfg.get("rope_scaling") or {}
    if rt == "default":
        return inv_freq_default(D, base), 1.0
    if rt == "linear":  # _compute_linear_scaling_rope_parameters
        return inv_freq_default(D, base) / rs["factor"], 1.0
    if rt == "llama3":  # _compute_llama3_parameters
        inv = inv_freq_default(D, base)
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        mid = ~(wl < high_wl) * ~(wl > low_wl)
        return torch.where(mid, smoothed, out), 1.0
    if rt == "longrope":
        # _compute_longrope_parameters with Phi-3's top-level
        # original_max_position_embeddings: factor = max / original; the
        # attention factor sqrt(1 + log(factor) / log(original)); the long
        # factors once the sequence is longer than the original length
        # (dynamic_rope_update -> _longrope_frequency_update)
        orig = cfg.get("original_max_position_embeddings") or rs.get(
            "original_max_position_embeddings")
        factor = cfg["max_position_embeddings"] / orig
        att = rs.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = torch.tensor(rs["long_factor"] if seq_len > orig else rs["short_factor"],
                           dtype=torch.float32)
        shape = torch.arange(0, D, 2, dtype=torch.int64).float() / D
        return 1.0 / (ext * base ** shape), att
    if rt == "yarn":
        # _compute_yarn_parameters: NTK-by-parts between the extrapolated
        # (1 / pos_freqs) and interpolated (1 / (factor pos_freqs))
        # frequencies, ramped over the dimensions between the correction
        # range of beta_fast and beta_slow rotations at the original
        # length; attention factor get_mscale(factor) = 0.1 ln(factor) + 1
        factor = rs["factor"]
        orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        att = rs.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

        def corr_dim(rot):
            return (D * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), D - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(D // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        pos_freqs = base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
        inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
        return inv, att
    raise ValueError("rope type %s has no reference" % rt)


def rotate_half(x):
    """modeling_llama.rotate_half."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(inv, att, pos0, T):
    """LlamaRotaryEmbedding.forward: emb = cat(freqs, freqs); cos/sin times
    attention_scaling."""
    pos = torch.arange(pos0, pos0 + T, dtype=torch.int64).float()
    emb = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)
    return emb.cos() * att, emb.sin() * att


# ---- attention -------------------------------------------------------------

def attn_mask(T, window):
    """Causal, and with a window only keys with q_idx - kv_idx < window
    (masking_utils.sliding_window_overlay; Mistral's and Gemma's sliding
    masks). Additive, (T, T)."""
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    keep = k <= q
    if window:
        keep = keep & (q - k < window)
    return torch.zeros(T, T).masked_fill(~keep, float("-inf"))


def attention(cfg, d, p, pre, h, i):
    """LlamaAttention.forward + eager_attention_forward (repeat_kv for GQA,
    softmax in f32); Qwen2's q/k/v biases; Qwen3's q_norm/k_norm per head
    before rope; Phi3Attention's fused qkv_proj; Gemma2's score soft-capping
    (tanh(s / c) * c before the mask) and query_pre_attn_scalar scaling;
    GPT2Attention's fused Conv1D c_attn/c_proj with biases."""
    B, T, _ = h.shape
    H, KV, D = d["heads"], d["kv_heads"], d["head_dim"]
    if d["model_type"] == "gpt2":
        qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = qkv.split(H * D, dim=2)
    elif d["model_type"] == "phi3":
        qkv = h @ p[pre + "self_attn.qkv_proj.weight"].T
        q, k, v = qkv[..., :H * D], qkv[..., H * D:(H + KV) * D], qkv[..., (H + KV) * D:]
    else:
        def proj(n):
            y = h @ p[pre + "self_attn.%s.weight" % n].T
            b = p.get(pre + "self_attn.%s.bias" % n)
            return y if b is None else y + b
        q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
    q = q.view(B, T, H, D)
    k = k.view(B, T, KV, D)
    v = v.view(B, T, KV, D).transpose(1, 2)
    if d.get("qk_norm"):
        q = norm(d, q, p, pre + "self_attn.q_norm")
        k = norm(d, k, p, pre + "self_attn.k_norm")
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    if d["pos"] == "rope":
        local = d["model_type"] == "gemma3_text" and d["sliding"][i]
        inv, att = rope_params(cfg, d, T, local)
        cos, sin = rope_cos_sin(inv, att, 0, T)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv
    v = v.repeat_interleave(H // KV, dim=1)
    s = (q @ k.transpose(2, 3)) * d.get("scaling", D ** -0.5)
    if d.get("attn_softcap"):
        c = d["attn_softcap"]
        s = torch.tanh(s / c) * c
    s = s + attn_mask(T, d["window"] if d.get("sliding", [False] * (i + 1))[i] else None)
    a = torch.softmax(s.float(), dim=-1) @ v
    a = a.transpose(1, 2).reshape(B, T, H * D)
    if d["model_type"] == "gpt2":
        return a @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
    o = a @ p[pre + "self_attn.o_proj.weight"].T
    return o + p[pre + "self_attn.o_proj.bias"] if d.get("o_bias") else o


# ---- MLPs -----------------------------------------------------------------

def act(d, x):
    # ACT2FN: "silu"; "gelu_pytorch_tanh" and GPT-2's "gelu_new" are the tanh GELU
    return F.silu(x) if d["act"] == "silu" else F.gelu(x, approximate="tanh")


def gated(d, x, wg, wu, wd):
    """LlamaMLP / Gemma2MLP: down(act(gate(x)) * up(x))."""
    return (act(d, x @ wg.T) * (x @ wu.T)) @ wd.T


def mlp(d, p, pre, h):
    mt = d["model_type"]
    if mt == "gpt2":  # GPT2MLP: c_proj(act(c_fc(x))), Conv1D (in, out)
        f = act(d, h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
        return f @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    if mt == "phi3":  # Phi3MLP: gate, up = gate_up_proj(x).chunk(2): gate first
        gu = h @ p[pre + "mlp.gate_up_proj.weight"].T
        g, u = gu.chunk(2, dim=-1)
        return (u * act(d, g)) @ p[pre + "mlp.down_proj.weight"].T
    if d.get("mlp_bias"):  # LlamaMLP with mlp_bias: nn.Linear(bias=True)
        b = lambda n: p[pre + "mlp.%s.bias" % n]  # noqa: E731
        g = h @ p[pre + "mlp.gate_proj.weight"].T + b("gate_proj")
        u = h @ p[pre + "mlp.up_proj.weight"].T + b("up_proj")
        return (act(d, g) * u) @ p[pre + "mlp.down_proj.weight"].T + b("down_proj")
    return gated(d, h, p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"],
                 p[pre + "mlp.down_proj.weight"])


def moe(d, p, pre, h):
    """Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock.forward: router logits,
    softmax in f32, top-k, renormalized when norm_topk_prob (Mixtral always),
    the weighted sum of the chosen experts' SwiGLU MLPs. Returns the output
    and the router logits (B*T, E)."""
    B, T, C = h.shape
    x = h.reshape(B * T, C)
    if d["model_type"] == "mixtral":
        gate = p[pre + "block_sparse_moe.gate.weight"]
        ex = lambda e, w: p[pre + "block_sparse_moe.experts.%d.%s.weight" % (e, w)]  # noqa: E731
        names = ("w1", "w3", "w2")  # w2(act(w1(x)) * w3(x))
    else:
        gate = p[pre + "mlp.gate.weight"]
        ex = lambda e, w: p[pre + "mlp.experts.%d.%s.weight" % (e, w)]  # noqa: E731
        names = ("gate_proj", "up_proj", "down_proj")
    logits = x @ gate.T
    w = torch.softmax(logits, dim=1, dtype=torch.float)
    w, sel = torch.topk(w, d["top_k"], dim=-1)
    if d["norm_topk"]:
        w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    # every expert runs, on no rows when it got no token, as the loop over
    # range(num_experts) of the release code (transformers 4.51): its
    # weights get a zero gradient (not None), so AdamW still decays them
    for e in range(d["n_experts"]):
        rows, slot = torch.where(sel == e)
        y = gated(d, x[rows], ex(e, names[0]), ex(e, names[1]), ex(e, names[2]))
        out = out.index_add(0, rows, y * w[rows, slot, None])
    return out.view(B, T, C), logits


def load_balancing_loss(router_logits, E, k):
    """load_balancing_loss_func (modeling_mixtral / modeling_qwen3_moe) with
    no attention mask: the layers' router logits concatenated, softmax,
    top-k one-hot; E * sum(mean tokens per expert (k, E) * mean router
    probability per expert (E))."""
    cat = torch.cat(router_logits, dim=0)
    rw = torch.softmax(cat, dim=-1)
    _, sel = torch.topk(rw, k, dim=-1)
    mask = F.one_hot(sel, E)
    tokens_per_expert = mask.float().mean(dim=0)
    prob_per_expert = rw.mean(dim=0)
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E


# ---- the model -------------------------------------------------------------

def forward(cfg, p, ids):
    """Logits (B, T, V) f32 of ids (B, T) at positions 0.., and the router
    logits of the MoE layers (empty for dense families).
    GPT2LMHeadModel / LlamaForCausalLM / Gemma2ForCausalLM /
    Gemma3ForCausalLM / Phi3ForCausalLM / Qwen3MoeForCausalLM /
    MixtralForCausalLM .forward."""
    d = describe(cfg)
    B, T = ids.shape
    routers = []
    if d["model_type"] == "gpt2":
        x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][torch.arange(T)]
        for i in range(d["layers"]):
            pre = "transformer.h.%d." % i
            x = x + attention(cfg, d, p, pre, norm(d, x, p, pre + "ln_1"), i)
            x = x + mlp(d, p, pre, norm(d, x, p, pre + "ln_2"))
        x = norm(d, x, p, "transformer.ln_f")
        return x @ p["transformer.wte.weight"].T, routers
    emb = p["model.embed_tokens.weight"]
    x = emb[ids]
    if d["embed_scale"]:  # Gemma2Model's normalizer / Gemma3TextScaledWordEmbedding
        x = x * torch.tensor(d["hidden"] ** 0.5, dtype=torch.float32)
    for i in range(d["layers"]):
        pre = "model.layers.%d." % i
        a = attention(cfg, d, p, pre, norm(d, x, p, pre + "input_layernorm"), i)
        if d["sandwich"]:  # Gemma2DecoderLayer: post_attention_layernorm on the output
            x = x + norm(d, a, p, pre + "post_attention_layernorm")
            h = norm(d, x, p, pre + "pre_feedforward_layernorm")
        else:
            x = x + a
            h = norm(d, x, p, pre + "post_attention_layernorm")
        if d["moe"][i]:
            m, r = moe(d, p, pre, h)
            routers.append(r)
        else:
            m = mlp(d, p, pre, h)
        x = x + (norm(d, m, p, pre + "post_feedforward_layernorm") if d["sandwich"] else m)
    x = norm(d, x, p, "model.norm")
    logits = x @ (emb if d["tie"] else p["lm_head.weight"]).T
    if d.get("final_softcap"):  # Gemma2ForCausalLM: tanh(logits / c) * c
        c = d["final_softcap"]
        logits = torch.tanh(logits / c) * c
    return logits, routers


def loss(cfg, p, ids, targets):
    """(total, cross-entropy, aux): mean next-token cross-entropy of the
    logits against targets (already aligned), plus router_aux_loss_coef *
    load_balancing_loss for MoE families (Qwen3MoeForCausalLM /
    MixtralForCausalLM with output_router_logits=True)."""
    d = describe(cfg)
    logits, routers = forward(cfg, p, ids)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    if not routers:
        return ce, ce, torch.zeros(())
    aux = load_balancing_loss(routers, d["n_experts"], d["top_k"])
    return ce + d["aux_coef"] * aux, ce, aux


def greedy(cfg, p, prompt, n_new):
    """n_new argmax tokens after prompt (list), each from a full recompute;
    also the smallest gap between the best and second-best logit."""
    seq, out, gap = list(prompt), [], float("inf")
    with torch.no_grad():
        for _ in range(n_new):
            lg = forward(cfg, p, torch.tensor([seq]))[0][0, -1]
            top = torch.topk(lg, 2).values
            gap = min(gap, float(top[0] - top[1]))
            nxt = int(lg.argmax())
            out.append(nxt)
            seq.append(nxt)
    return out, gap
