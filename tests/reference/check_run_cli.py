#!/usr/bin/python3
"""check_run_cli.py TESSERA DIR — `tessera run` end to end on the folder
hf_tiny_lm.py wrote: greedy text equals the PyTorch reference's (eager,
--compile, and with generation_config.json's greedy default), bf16-kept
weights run, a stop string cuts the text before it, a seeded sampling run
repeats itself, and
`tessera tokenize` encodes and decodes the prompt; bad options exit 2.
Chat: --chat/--system render the model's chat template exactly as jinja2
does (as transformers' apply_chat_template) and generate what the plain
prompt of that text generates; -i reads turns from stdin, keeps the
conversation (reusing its cached prefix) and survives a bad turn. GPT-2
runs through the same command and matches its PyTorch reference;
--device-map splits give the same text. Model folders: a file, a GGUF
file, a missing path or a folder missing files given to -m get errors
that say what to give; a NaN weight is refused by name (and loads with
--no-check-weights); unused tensors and layers beyond config.json's are
warned about and change nothing."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True,
                          timeout=300)


def main():
    exe, root = sys.argv[1], sys.argv[2]
    d = os.path.join(root, "tiny_lm")
    want = open(os.path.join(root, "tiny_lm.expected")).read()
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n", (r.stdout, want)
    assert "tokens/s" in r.stderr, r.stderr
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--compile")
    assert r.returncode == 0 and r.stdout == want + "\n", (r.stdout, r.stderr)
    # weights kept in bf16 (rounded from f32): runs, generates up to 24 tokens
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--dtype", "bf16")
    assert r.returncode == 0 and 1 < len(r.stdout) <= 24 * 8 + 1, (r.stdout, r.stderr)
    r = run(exe, "run", "-m", d, "-p", "x", "--dtype", "f64")
    assert r.returncode == 2, r.stderr
    stop = want[2:5]
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--stop", stop)
    assert r.returncode == 0 and r.stdout == want[:want.index(stop)] + "\n", (r.stdout, stop)
    a = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "16", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", "5")
    b = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "16", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", "5")
    assert a.returncode == 0 and a.stdout == b.stdout, (a.stdout, b.stdout)
    ids = json.load(open(os.path.join(root, "tiny_lm.prompt_ids")))
    r = run(exe, "tokenize", "-m", d, "Hello world")
    assert r.returncode == 0 and json.loads(r.stdout) == ids, r.stdout
    r = run(exe, "tokenize", "-m", d, "--decode", ",".join(map(str, ids)))
    assert r.returncode == 0 and r.stdout == "Hello world\n", r.stdout
    r = run(exe, "run", "-m", d, "-p", "x", "--top-p", "0")
    assert r.returncode == 2 and "bad or incomplete option" in r.stderr, r.stderr
    r = run(exe, "run", "-m", os.path.join(root, "nowhere"), "-p", "x")
    assert r.returncode == 1 and "nowhere" in r.stderr, r.stderr
    # chat mode: the template rendered by jinja2 as transformers does
    import jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    tpl = json.load(open(os.path.join(d, "tokenizer_config.json")))["chat_template"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
    rendered = env.from_string(tpl).render(messages=msgs, add_generation_prompt=True,
                                           eos_token="<|endoftext|>")
    r = run(exe, "run", "-m", d, "-p", "Hello world", "--system", "Be brief.", "-n", "12",
            "--verbose-prompt")
    assert r.returncode == 0, r.stderr
    shown = r.stderr.split("prompt text: ", 1)[1].split("\nprompt ids: ", 1)[0]
    assert shown == rendered, (shown, rendered)
    plain = run(exe, "run", "-m", d, "-p", rendered, "-n", "12")
    assert plain.returncode == 0 and r.stdout == plain.stdout, (r.stdout, plain.stdout)
    # interactive: two turns from stdin, the second prompt holds the first
    # exchange and reuses its cache; a bad turn is reported and skipped
    long_turn = "x" * 300
    r = subprocess.run([exe, "run", "-m", d, "-i", "--chat", "-n", "6", "--ctx-size", "120",
                        "--verbose-prompt"], input="Hello world\n" + long_turn + "\nAgain\n",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    prompts = re.findall(r"prompt text: (.*?)\nprompt ids:", r.stderr, re.S)
    assert len(prompts) == 3 and prompts[0].startswith("user: Hello world\nassistant:"), prompts
    assert "does not fit the context" in r.stderr, r.stderr
    assert prompts[2].startswith(prompts[0]) and prompts[2].endswith("user: Again\nassistant:"), prompts
    reused = re.findall(r"\((\d+) reused from the cache\)", r.stderr)
    assert int(reused[-1]) > 0, r.stderr
    # GPT-2 through the same command
    g = os.path.join(root, "tiny_gpt2")
    want_g = open(os.path.join(root, "tiny_gpt2.expected")).read()
    r = run(exe, "run", "-m", g, "-p", "Hello world", "-n", "24", "--temperature", "0")
    assert r.returncode == 0 and r.stdout == want_g + "\n", (r.stdout, want_g, r.stderr)
    # ... split over two devices (one decoder: GPT-2 too), the same text
    r = run(exe, "run", "-m", g, "-p", "Hello world", "-n", "24", "--temperature", "0",
            "--device-map", "embed,0:cpu:0;1,head:cpu:1")
    assert r.returncode == 0 and r.stdout == want_g + "\n", (r.stdout, want_g, r.stderr)
    # a split decoder gives the same text
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--device-map",
            "embed,0:cpu:1;1,head:cpu:0")
    assert r.returncode == 0 and r.stdout == want + "\n", (r.stdout, r.stderr)
    r = run(exe, "run", "-m", d, "-p", "Hello world", "--device-map", "embed,0:cpu:0")
    assert r.returncode == 1 and "is not placed" in r.stderr, r.stderr
    check_model_folder_errors(exe, root, d, want)
    print("check_run_cli: greedy text equals the reference; stop, seed, tokenize, chat, "
          "interactive, gpt2, device_map, errors, model folder checks ok")


def read_safetensors(path):
    """[(name, dtype, shape, bytes)] in the file's order"""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    body = data[8 + n:]
    items = [(k, v) for k, v in hdr.items() if k != "__metadata__"]
    items.sort(key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in items]


def write_safetensors(path, tensors):
    hdr, off = {}, 0
    for name, dt, shape, b in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors))


def variant(src, dst, tensors=None, skip=()):
    """a copy of the model folder src at dst with other tensors"""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f not in skip and f != "model.safetensors":
            shutil.copy(os.path.join(src, f), dst)
    if tensors is not None:
        write_safetensors(os.path.join(dst, "model.safetensors"), tensors)
    elif "model.safetensors" not in skip:
        shutil.copy(os.path.join(src, "model.safetensors"), dst)
    return dst


def check_model_folder_errors(exe, root, d, want):
    """-m mistakes get errors that say what to give (exit 1, no crash);
    NaN weights are refused by name (and load with --no-check-weights);
    unused tensors and layers are warned about and change nothing"""
    def refused(m, *needles, rc=1):
        r = run(exe, "run", "-m", m, "-p", "Hello world", "-n", "4")
        assert r.returncode == rc, (m, r.returncode, r.stderr)
        for n in needles:
            assert n in r.stderr, (m, n, r.stderr)
        assert "line -1" not in r.stderr, r.stderr
        return r

    folder = "-m takes a model folder: "
    refused(os.path.join(d, "config.json"), folder, "got a file",
            "did you mean its folder " + os.path.realpath(d) + "?")
    refused(os.path.join(d, "model.safetensors"), folder, "got a file",
            "did you mean its folder " + os.path.realpath(d) + "?")
    with tempfile.TemporaryDirectory() as tmp:
        gguf = os.path.join(tmp, "model.gguf")
        with open(gguf, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
        # a GGUF is a model by itself; this one has no metadata
        refused(gguf, 'model.gguf: no metadata key "general.architecture"')
        refused(os.path.join(tmp, "missing"), "missing: no such folder")
        for m, said in ((gguf, 'no metadata key "tokenizer.ggml.model"'),
                        (os.path.join(tmp, "missing"), "missing: no such folder")):
            r = run(exe, "tokenize", "-m", m, "hi")
            assert r.returncode == 1 and said in r.stderr, r.stderr
            assert "line -1" not in r.stderr, r.stderr
        # serve and route check the folder the same way before loading
        for args, said in ((("serve", "-m", gguf, "--port", "1"), 'no metadata key "general.architecture"'),
                           (("serve", "-m", os.path.join(tmp, "missing"), "--port", "1"),
                            "missing: no such folder"),
                           (("route", "--server", "http://127.0.0.1:1", "-m",
                             os.path.join(tmp, "missing"), "--listen", "127.0.0.1:1"),
                            "missing: no such folder")):
            r = run(exe, *args)
            assert r.returncode != 0 and said in r.stderr, (args, r.stderr)
            assert "line -1" not in r.stderr, r.stderr
        # a tokenizer with an id past config.json's vocab_size: refused
        # before any token can index past the embedding
        other = variant(d, os.path.join(tmp, "other_tok"))
        tj = json.load(open(os.path.join(other, "tokenizer.json")))
        vocab = json.load(open(os.path.join(other, "config.json")))["vocab_size"]
        tj["added_tokens"].append({"id": vocab, "content": "<extra>", "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": True})
        json.dump(tj, open(os.path.join(other, "tokenizer.json"), "w"))
        refused(other, '"<extra>" has id %d, outside the model\'s vocab_size %d' % (vocab, vocab),
                "does not belong to this model")
        r = run(exe, "serve", "-m", other, "--port", "1")
        assert r.returncode != 0 and "does not belong to this model" in r.stderr, r.stderr
        half = variant(d, os.path.join(tmp, "half"), skip=("tokenizer.json",))
        refused(half, "half: not a model folder: no tokenizer.json (looked for config.json, "
                "model.safetensors | model.safetensors.index.json, tokenizer.json; the "
                "folder holds config.json, generation_config.json, model.safetensors, "
                "tokenizer_config.json)")
        t = read_safetensors(os.path.join(d, "model.safetensors"))
        # a NaN in one tensor: refused naming it; --no-check-weights loads it
        poisoned = []
        for name, dt, shape, b in t:
            if name == "model.layers.1.mlp.up_proj.weight":
                b = b[:4 * 3] + struct.pack("<f", float("nan")) + b[4 * 4:]
            poisoned.append((name, dt, shape, b))
        nan = variant(d, os.path.join(tmp, "nan"), poisoned)
        refused(nan, 'tensor "model.layers.1.mlp.up_proj.weight" holds NaN at flat index 3 '
                "(of 2048 f32 values)", "--no-check-weights")
        r = run(exe, "run", "-m", nan, "-p", "Hello world", "-n", "4", "--no-check-weights")
        assert r.returncode == 0, r.stderr
        # an unknown tensor and a layer beyond num_hidden_layers: a warning,
        # and the same greedy text
        layer1 = [x for x in t if x[0].startswith("model.layers.1.")]
        extra = t + [("lm_head.extra.weight", "F32", [32], layer1[0][3][:128])] + \
            [(n.replace("layers.1.", "layers.2."), dt, sh, b) for n, dt, sh, b in layer1]
        more = variant(d, os.path.join(tmp, "more"), extra)
        r = run(exe, "run", "-m", more, "-p", "Hello world", "-n", "24", "--temperature", "0")
        assert r.returncode == 0 and r.stdout == want + "\n", (r.stdout, r.stderr)
        assert ("tessera: warning: Some weights of the checkpoint at %s were not used: "
                "lm_head.extra.weight, model.layers.2." % more) in r.stderr, r.stderr
        assert ("(%d in all); the checkpoint has layers up to 2, config.json's "
                "num_hidden_layers is 2" % (1 + len(layer1))) in r.stderr, r.stderr
        r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "4")
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


if __name__ == "__main__":
    main()
