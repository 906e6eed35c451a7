#!/usr/bin/python3
"""hf_tiny_lm.py DIR — a whole Hugging Face model folder for `tessera run`:
a random Qwen3 with a byte-level BPE tokenizer.json of the Qwen kind (NFC,
Split regex + ByteLevel, ByteLevel decoder) whose vocabulary is printable
ASCII plus a few merges and <|endoftext|>, generation_config.json, and the
greedy continuation the PyTorch reference gives for the prompt, as text:
  DIR/tiny_lm/...            the folder
  DIR/tiny_lm.expected       the 24-token greedy continuation (stops at eos)
  DIR/tiny_gpt2/...          a random GPT-2 with the same tokenizer
  DIR/tiny_gpt2.expected     its greedy continuation of the prompt
tiny_lm also has a tokenizer_config.json with a chat template (plain
ASCII, so the tiny vocabulary covers it)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ref"))
from hf_qwen3 import write_safetensors  # noqa: E402
from nn_ref import qwen3_forward  # noqa: E402
import hf_gpt2  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PROMPT = "Hello world"


def byte_char(b):  # GPT-2's bytes_to_unicode, for the bytes used here
    return chr(b) if 33 <= b <= 126 else chr(256 + [x for x in range(256) if not (
        33 <= x <= 126 or 161 <= x <= 172 or 174 <= x <= 255)].index(b))


def main():
    root = sys.argv[1]
    d = os.path.join(root, "tiny_lm")
    os.makedirs(d, exist_ok=True)
    chars = [byte_char(b) for b in range(32, 127)] + [byte_char(10)]
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("Hell", "o"), ("Ġ", "w"), ("o", "r"),
              ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    eos = len(vocab)
    V = eos + 1
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
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    C, L, H, KV, D, Fi = 32, 2, 4, 2, 8, 64
    g = torch.Generator().manual_seed(7)
    p = {"model.embed_tokens.weight": torch.randn(V, C, generator=g)}
    for i in range(L):
        pre = "model.layers.%d." % i
        for name, shape in (("input_layernorm.weight", (C,)), ("post_attention_layernorm.weight", (C,)),
                            ("self_attn.q_norm.weight", (D,)), ("self_attn.k_norm.weight", (D,))):
            p[pre + name] = 1 + 0.1 * torch.randn(*shape, generator=g)
        for name, shape in (("self_attn.q_proj.weight", (H * D, C)), ("self_attn.k_proj.weight", (KV * D, C)),
                            ("self_attn.v_proj.weight", (KV * D, C)), ("self_attn.o_proj.weight", (C, H * D)),
                            ("mlp.gate_proj.weight", (Fi, C)), ("mlp.up_proj.weight", (Fi, C)),
                            ("mlp.down_proj.weight", (C, Fi))):
            p[pre + name] = 0.3 * torch.randn(*shape, generator=g)
    p["model.norm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    write_safetensors(os.path.join(d, "model.safetensors"), list(p.items()))
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V,
           "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KV, "head_dim": D, "intermediate_size": Fi,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "torch_dtype": "float32", "eos_token_id": eos}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    json.dump({"eos_token_id": eos, "do_sample": False}, open(os.path.join(d, "generation_config.json"), "w"))
    # the prompt by the same BPE: pieces "Hello", " world"
    def bpe(word):
        sym = list(word)
        while True:
            best = None
            for i in range(len(sym) - 1):
                if (sym[i], sym[i + 1]) in merges:
                    r = merges.index((sym[i], sym[i + 1]))
                    if best is None or r < best[0]:
                        best = (r, i)
            if best is None:
                return sym
            i = best[1]
            sym[i:i + 2] = [sym[i] + sym[i + 1]]
    ids = [vocab[s] for piece in ("Hello", "Ġworld") for s in bpe(piece)]
    cfgv = [V, C, L, H, KV, D, Fi, 1e-6, 10000.0, 1.0, 256]
    inv = {i: c for c, i in vocab.items()}
    seq = torch.tensor([ids])
    out = []
    with torch.no_grad():
        for _ in range(24):
            nxt = int(qwen3_forward(p, cfgv, seq, 0)[0, -1].argmax())
            if nxt == eos:
                break
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    text = "".join(inv[i] for i in out).replace("Ġ", " ").replace("Ċ", "\n")
    with open(os.path.join(root, "tiny_lm.expected"), "w") as f:
        f.write(text)
    with open(os.path.join(root, "tiny_lm.prompt_ids"), "w") as f:
        json.dump(ids, f)
    json.dump({"chat_template": CHAT_TEMPLATE, "eos_token": "<|endoftext|>", "bos_token": None},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    # GPT-2 with the same tokenizer: `tessera run` drives either architecture
    gd = os.path.join(root, "tiny_gpt2")
    os.makedirs(gd, exist_ok=True)
    with open(os.path.join(gd, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    spec = (V, 32, 2, 4, 256, False)
    g2 = torch.Generator().manual_seed(11)
    rnd = lambda *s, std=0.2: torch.randn(*s, generator=g2) * std  # noqa: E731
    gp = {"wte.weight": rnd(V, 32, std=0.5), "wpe.weight": rnd(256, 32)}
    for i in range(2):
        pre = "h.%d." % i
        gp[pre + "ln_1.weight"], gp[pre + "ln_1.bias"] = 1 + rnd(32), rnd(32)
        gp[pre + "attn.c_attn.weight"], gp[pre + "attn.c_attn.bias"] = rnd(32, 96), rnd(96)
        gp[pre + "attn.c_proj.weight"], gp[pre + "attn.c_proj.bias"] = rnd(32, 32), rnd(32)
        gp[pre + "ln_2.weight"], gp[pre + "ln_2.bias"] = 1 + rnd(32), rnd(32)
        gp[pre + "mlp.c_fc.weight"], gp[pre + "mlp.c_fc.bias"] = rnd(32, 128), rnd(128)
        gp[pre + "mlp.c_proj.weight"], gp[pre + "mlp.c_proj.bias"] = rnd(128, 32), rnd(32)
    gp["ln_f.weight"], gp["ln_f.bias"] = 1 + rnd(32), rnd(32)
    write_safetensors(os.path.join(gd, "model.safetensors"), list(gp.items()))
    json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
               "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 256, "n_ctx": 256,
               "n_inner": None, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
               "eos_token_id": eos}, open(os.path.join(gd, "config.json"), "w"), indent=2)
    seq, out = torch.tensor([ids]), []
    with torch.no_grad():
        for _ in range(24):
            nxt = int(hf_gpt2.forward(gp, spec, seq)[0, -1].argmax())
            if nxt == eos:
                break
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    with open(os.path.join(root, "tiny_gpt2.expected"), "w") as f:
        f.write("".join(inv[i] for i in out).replace("Ġ", " ").replace("Ċ", "\n"))


if __name__ == "__main__":
    main()
