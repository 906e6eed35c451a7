"""torch_ref_models — small decoders written in plain PyTorch, as users write
them, for tests of tessera.torch.compile (test_py_torch_compile.py).

Nothing here comes from transformers or any other package: a GPT-2 block
stack in nanoGPT's style, a Qwen3-style decoder (RMSNorm, rotary, q/k norms,
grouped-query attention, SwiGLU) and a tiny module calling an op Tessera does
not map (torch.cumsum). Shapes: B batch, T time, C channels, H heads, KV
key/value heads, D head size, V vocabulary.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- GPT-2 (nanoGPT style) ----
@dataclass
class GPTConfig:
    vocab_size: int = 96
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.register_buffer("bias", torch.tril(torch.ones(cfg.block_size, cfg.block_size))
                             .view(1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.size()  # batch, time, channels
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.normal_(m.bias, mean=0.0, std=0.02)  # nonzero, so bias grads matter
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)  # (T)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = self.transformer.wpe(pos)  # (T, C)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # (B, T, V)


# ---- Qwen3 style ----
@dataclass
class Qwen3Config:
    vocab_size: int = 96
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    repeat_kv: str = "expand"  # or "repeat_interleave"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, theta):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, T):
        pos = torch.arange(T, dtype=torch.float32)  # (T)
        freqs = torch.outer(pos, self.inv_freq)  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        return emb.cos(), emb.sin()


def repeat_kv(x, n_rep, how):
    """(B, KV, T, D) -> (B, KV * n_rep, T, D), each KV head n_rep times."""
    if n_rep == 1:
        return x
    if how == "repeat_interleave":
        return torch.repeat_interleave(x, n_rep, dim=1)
    B, KV, T, D = x.shape
    return x[:, :, None, :, :].expand(B, KV, n_rep, T, D).reshape(B, KV * n_rep, T, D)


class Qwen3Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, KV, D, C = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, KV * D, bias=False)
        self.v_proj = nn.Linear(C, KV * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        H, KV, D = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        q = self.q_norm(self.q_proj(x).view(B, T, H, D)).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(self.k_proj(x).view(B, T, KV, D)).transpose(1, 2)  # (B, KV, T, D)
        v = self.v_proj(x).view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, H // KV, self.cfg.repeat_kv)
        v = repeat_kv(v, H // KV, self.cfg.repeat_kv)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
        return self.o_proj(y)


class Qwen3MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Qwen3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = Qwen3MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class Qwen3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Qwen3Layer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)  # untied
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                # not all ones, so the norm weights' gradients are not trivially symmetric
                nn.init.normal_(p, mean=1.0, std=0.1)
            else:
                nn.init.normal_(p, mean=0.0, std=0.05)

    def forward(self, input_ids):
        B, T = input_ids.shape
        x = self.embed_tokens(input_ids)  # (B, T, C)
        cos, sin = self.rotary(T)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))  # (B, T, V)


# ---- an op Tessera does not map ----
class CumsumModel(nn.Module):
    """x -> proj(cumsum(x, 1)): torch.cumsum has no Tessera lowering."""

    def __init__(self, C=8):
        super().__init__()
        self.proj = nn.Linear(C, C)

    def forward(self, x):
        y = torch.cumsum(x, dim=1)  # CUMSUM_LINE: the test finds this line by this tag
        return self.proj(y)


def gpt2(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**kw)).eval()


def qwen3(seed=0, **kw):
    torch.manual_seed(seed)
    return Qwen3(Qwen3Config(**kw)).eval()


def cumsum_model(seed=0):
    torch.manual_seed(seed)
    return CumsumModel().eval()


def batch(vocab=96, B=2, T=16, seed=1):
    """Token ids x (B, T) and next-token targets y (B, T)."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (B, T + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
