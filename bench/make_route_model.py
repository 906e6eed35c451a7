#!/usr/bin/python3
"""make_route_model.py OUT_DIR — a small random Qwen3 model folder for the
router benchmarks (bench/route_bench.mjs), loadable by `tessera serve -m
OUT_DIR`: config.json, model.safetensors (f32), tokenizer.json,
tokenizer_config.json (chat template), generation_config.json.

The tokenizer is tests/reference/hf_tiny_lm.py's: byte-level BPE of the
Qwen kind whose vocabulary is printable ASCII, newline, a few merges and
<|endoftext|>, so a prompt costs about one token per character. The model
is sized so that prompts of a few thousand tokens are cheap but not free:
hidden 128, 4 layers, 4 heads, 2 KV heads, head_dim 32, intermediate 384,
max_position_embeddings 4096. Fixed seed: the same folder every time."""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
from hf_qwen3 import write_safetensors  # noqa: E402
from hf_tiny_lm import CHAT_TEMPLATE, QWEN_SPLIT, byte_char  # noqa: E402

C, L, H, KV, D, FI, MAXPOS = 128, 4, 4, 2, 32, 384, 4096
SEED = 1234


def tokenizer():
    """hf_tiny_lm's tokenizer.json (same vocabulary, merges, pipeline)."""
    chars = [byte_char(b) for b in range(32, 127)] + [byte_char(10)]
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("Hell", "o"), ("Ġ", "w"), ("o", "r"),
              ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    eos = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [list(m) for m in merges]},
    }
    return tok, eos, eos + 1


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_route_model.py OUT_DIR")
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    tok, eos, V = tokenizer()
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    g = torch.Generator().manual_seed(SEED)
    p = {"model.embed_tokens.weight": torch.randn(V, C, generator=g)}
    for i in range(L):
        pre = "model.layers.%d." % i
        for name, shape in (("input_layernorm.weight", (C,)), ("post_attention_layernorm.weight", (C,)),
                            ("self_attn.q_norm.weight", (D,)), ("self_attn.k_norm.weight", (D,))):
            p[pre + name] = 1 + 0.1 * torch.randn(*shape, generator=g)
        for name, shape in (("self_attn.q_proj.weight", (H * D, C)), ("self_attn.k_proj.weight", (KV * D, C)),
                            ("self_attn.v_proj.weight", (KV * D, C)), ("self_attn.o_proj.weight", (C, H * D)),
                            ("mlp.gate_proj.weight", (FI, C)), ("mlp.up_proj.weight", (FI, C)),
                            ("mlp.down_proj.weight", (C, FI))):
            p[pre + name] = torch.randn(*shape, generator=g) / shape[1] ** 0.5
    p["model.norm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    write_safetensors(os.path.join(d, "model.safetensors"), list(p.items()))
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V,
           "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KV, "head_dim": D, "intermediate_size": FI,
           "max_position_embeddings": MAXPOS, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "torch_dtype": "float32", "eos_token_id": eos}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "do_sample": False}, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHAT_TEMPLATE, "eos_token": "<|endoftext|>", "bos_token": None}, f)
    print("make_route_model: wrote %s (Qwen3 C=%d L=%d H=%d KV=%d D=%d F=%d V=%d, maxpos %d)"
          % (d, C, L, H, KV, D, FI, V, MAXPOS))


if __name__ == "__main__":
    main()
