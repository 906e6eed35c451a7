#!/usr/bin/python3
"""hf_gguf_models.py DIR — two random decoders in Hugging Face's layout whose
matrices are all whole rows of 256 (hidden 256, head_dim 64), so that every
GGUF block format (q8_0, q4_0, q4_k, q5_k, q6_k) applies to every matrix
without a fallback, for tests/gguf_models.py:
  DIR/qwen3_256/   Qwen3: 2 layers, 4 heads, 2 KV heads, intermediate 512,
                   tied embeddings, q/k norms
  DIR/llama_256/   Llama: 2 layers, 4 heads, 2 KV heads, intermediate 768,
                   untied LM head (its q/k rows are permuted in a GGUF)
Each folder: config.json, model.safetensors (f32), generation_config.json,
tokenizer_config.json (a plain-ASCII chat template) and a byte-level BPE
tokenizer.json of the Qwen kind: the 256 byte symbols, 63 merges learned
from the text below and <|endoftext|>, 320 tokens in all."""
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from hf_qwen3 import write_safetensors  # noqa: E402

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] | trim }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
TEXT = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, "
        "and the fox runs into the forest. In the beginning there was the word, "
        "and the word was with the writer; the writer wrote the words down. "
        "There are three thousand and thirty three trees in the forest there.")
N_MERGES = 63

CASES = {
    # name: model_type, C, L, H, KV, D, F, theta, tie
    "qwen3_256": ("qwen3", 256, 2, 4, 2, 64, 512, 1e6, True),
    "llama_256": ("llama", 256, 2, 4, 2, 64, 768, 5e5, False),
}


def bytes_to_unicode():  # GPT-2's byte symbols
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_merges(text, n):
    """Plain BPE over the words of text (ties to the smallest pair)."""
    sym = bytes_to_unicode()
    words = {}
    for w in re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", text):
        key = tuple(sym[b] for b in w.encode())
        words[key] = words.get(key, 0) + 1
    merges = []
    for _ in range(n):
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    return merges


def tokenizer():
    sym = bytes_to_unicode()
    vocab = {sym[b]: i for i, b in enumerate(sorted(sym))}
    merges = train_merges(TEXT, N_MERGES)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    eos = len(vocab)
    assert sorted(vocab.values()) == list(range(eos)), "a merge made a token twice"
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
    return tok, eos + 1


def make(root, name, spec, seed, tok, V):
    mt, C, L, H, KV, D, Fi, theta, tie = spec
    eos = V - 1
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, std=0.06: torch.randn(*s, generator=g) * std  # noqa: E731
    p = {"model.embed_tokens.weight": rnd(V, C, std=0.5)}
    for i in range(L):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = 1 + rnd(C, std=0.1)
        p[pre + "self_attn.q_proj.weight"] = rnd(H * D, C)
        p[pre + "self_attn.k_proj.weight"] = rnd(KV * D, C)
        p[pre + "self_attn.v_proj.weight"] = rnd(KV * D, C)
        p[pre + "self_attn.o_proj.weight"] = rnd(C, H * D)
        if mt == "qwen3":
            p[pre + "self_attn.q_norm.weight"] = 1 + rnd(D, std=0.1)
            p[pre + "self_attn.k_norm.weight"] = 1 + rnd(D, std=0.1)
        p[pre + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.1)
        p[pre + "mlp.gate_proj.weight"] = rnd(Fi, C)
        p[pre + "mlp.up_proj.weight"] = rnd(Fi, C)
        p[pre + "mlp.down_proj.weight"] = rnd(C, Fi)
    p["model.norm.weight"] = 1 + rnd(C, std=0.1)
    if not tie:
        p["lm_head.weight"] = rnd(V, C, std=0.5)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    arch = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[mt]
    cfg = {"architectures": [arch], "model_type": mt, "vocab_size": V, "hidden_size": C,
           "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
           "head_dim": D, "intermediate_size": Fi, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-6, "rope_theta": theta, "tie_word_embeddings": tie,
           "torch_dtype": "float32", "hidden_act": "silu", "attention_bias": False,
           "bos_token_id": eos, "eos_token_id": eos}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(d, "model.safetensors"), list(p.items()))
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    json.dump({"chat_template": CHAT_TEMPLATE, "eos_token": "<|endoftext|>", "bos_token": None},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    json.dump({"eos_token_id": eos, "do_sample": False},
              open(os.path.join(d, "generation_config.json"), "w"))


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    tok, V = tokenizer()
    for i, (name, spec) in enumerate(CASES.items()):
        make(root, name, spec, 4242 + i, tok, V)
    print("%s: %s, vocabulary %d" % (root, ", ".join(CASES), V))


if __name__ == "__main__":
    main()
