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
--device-map splits give the same text."""
import json
import os
import re
import subprocess
import sys


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


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
    r = run(exe, "run", "-m", g, "-p", "Hello world", "--device-map", "embed,0:cpu:0;1,head:cpu:1")
    assert r.returncode == 1 and "gpt2 runs on one device" in r.stderr, r.stderr
    # a split decoder gives the same text
    r = run(exe, "run", "-m", d, "-p", "Hello world", "-n", "24", "--device-map",
            "embed,0:cpu:1;1,head:cpu:0")
    assert r.returncode == 0 and r.stdout == want + "\n", (r.stdout, r.stderr)
    r = run(exe, "run", "-m", d, "-p", "Hello world", "--device-map", "embed,0:cpu:0")
    assert r.returncode == 1 and "is not placed" in r.stderr, r.stderr
    print("check_run_cli: greedy text equals the reference; stop, seed, tokenize, chat, "
          "interactive, gpt2, device_map, errors ok")


if __name__ == "__main__":
    main()
