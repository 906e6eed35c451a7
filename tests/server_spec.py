#!/usr/bin/python3
"""server_spec.py TESSERA MODEL_DIR DRAFT_DIR WORK — speculative decoding in
`tessera serve` (issue 22), against servers of MODEL_DIR without
speculation, with prompt lookup (--speculative ngram) and with the draft
model DRAFT_DIR (--draft-model, a folder and the same model as a GGUF):
  - the start line names the speculation settings;
  - /metrics has the tessera:spec_decode_* families (HELP, TYPE, one sample
    each) exactly when speculation is on, the gauges agree with the
    counters, and the counters with the requests' usage;
  - a completion's usage (whole, and streamed with include_usage) and a
    chat completion's carry completion_tokens_details
    (accepted_prediction_tokens, rejected_prediction_tokens) exactly when
    speculation is on;
  - greedy completions and chat completions are the same text with and
    without speculation;
  - bad flags exit with a message naming the flag: K = 0 and 17 (2, a
    usage error, as every out-of-range value), and 1 for a draft with
    another vocabulary (a one-layer model of 512 tokens made here, with no
    tokenizer: the draft needs none) or a shorter context, a missing draft
    folder, --speculative
    draft without a draft, a draft with ngram, lookup bounds crossed,
    speculation flags without --speculative;
  - tessera.serve(...) takes the same settings as keywords (speculative,
    num_speculative_tokens, prompt_lookup_min/max, draft_model) and refuses
    bad ones with tessera.Error.
  - both kinds make proposals and get some accepted (acceptance > 0)."""
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

exe, model, draft, work = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
env = dict(os.environ, TS_NUM_THREADS="2")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


# ---- servers ----

def start(*flags):
    """a server of model with flags on any port: (process, url, its stderr
    lines so far and to come, read by a thread)"""
    p = subprocess.Popen([exe, "serve", "-m", model, "--port", "0",
                          "--disable-log-requests", *flags],
                         stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    p.reader = threading.Thread(target=lambda: lines.extend(p.stderr),
                                daemon=True)
    p.reader.start()
    t0 = time.time()
    while time.time() - t0 < 120:
        for line in list(lines):
            m = re.search(r" on (http://[0-9.]+:\d+) ", line)
            if m:
                return p, m.group(1), lines
        if p.poll() is not None and not p.reader.is_alive():
            break
        time.sleep(0.05)
    p.kill()
    raise SystemExit(f"serve {flags} did not start: {''.join(lines)}")


def start_line(lines, words):
    """the start line holding words (it may follow the listening line by a
    moment); empty when none comes within 10 s"""
    t0 = time.time()
    while time.time() - t0 < 10:
        for line in list(lines):
            if words in line:
                return line.strip()
        time.sleep(0.05)
    return ""


def stop(p):
    p.terminate()
    p.wait(timeout=60)
    p.reader.join(timeout=10)


def http(url, path, body=None):
    req = urllib.request.Request(
        url + path, data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def post(url, path, body):
    return json.loads(http(url, path, body))


def stream(url, path, body):
    """a streamed response: (the text of choice 0, the usage chunk)"""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for line in http(url, path, body).splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        for c in j["choices"]:
            text += c.get("text") or (c.get("delta") or {}).get("content") or ""
        if j.get("usage"):
            usage = j["usage"]
    return text, usage


SPEC_FAMILIES = {
    "tessera:spec_decode_acceptance_rate": "gauge",
    "tessera:spec_decode_mean_accepted_length": "gauge",
    "tessera:spec_decode_num_draft_tokens_total": "counter",
    "tessera:spec_decode_num_accepted_tokens_total": "counter",
    "tessera:spec_decode_num_emitted_tokens_total": "counter",
}


def spec_metrics(url):
    """the spec_decode families' (type, value) from /metrics"""
    text = http(url, "/metrics")
    got = {}
    for name in SPEC_FAMILIES:
        t = re.search(rf"^# TYPE {re.escape(name)} (\w+)$", text, re.M)
        h = re.search(rf"^# HELP {re.escape(name)} .+$", text, re.M)
        v = re.findall(rf'^{re.escape(name)}{{model_name="[^"]*"}} (\S+)$',
                       text, re.M)
        if t and h and len(v) == 1:
            got[name] = (t.group(1), float(v[0]))
    return got, "spec_decode" in text


# Genesis 1:1-3 and its first words again (the copy case), a plain
# continuation, and Numbers 7's offering told twice
COPY = ("In the beginning God created the heaven and the earth. And the earth "
        "was without form, and void; and darkness was upon the face of the "
        "deep. And the Spirit of God moved upon the face of the waters. And "
        "God said, Let there be light: and there was light.\n"
        "In the beginning God created the heaven")
PROMPTS = [COPY, "And it came to pass, when the king heard",
           "One kid of the goats for a sin offering:\n"
           "One kid of the goats for a sin offering:\n"
           "And for a sacrifice of peace offerings, two oxen,"]
CHAT = [{"role": "user", "content": "Who made the heaven and the earth?"}]
N = 48


def greedy(url):
    """the greedy texts (completions, one chat) and the usages"""
    texts, usages = [], []
    for p in PROMPTS:
        r = post(url, "/v1/completions", {"prompt": p, "max_tokens": N,
                                          "temperature": 0,
                                          "ignore_eos": True})
        texts.append(r["choices"][0]["text"])
        usages.append(r["usage"])
    r = post(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": N,
                                           "temperature": 0})
    texts.append(r["choices"][0]["message"]["content"])
    usages.append(r["usage"])
    return texts, usages


def details_ok(u):
    d = u.get("completion_tokens_details")
    return (isinstance(d, dict) and
            isinstance(d.get("accepted_prediction_tokens"), int) and
            isinstance(d.get("rejected_prediction_tokens"), int) and
            d["accepted_prediction_tokens"] >= 0 and
            d["rejected_prediction_tokens"] >= 0 and
            d["accepted_prediction_tokens"] <= u["completion_tokens"])


# a GGUF copy of the draft (f32: the same weights)
gguf = os.path.join(work, "draft.gguf")
r = subprocess.run([exe, "quantize", draft, gguf, "--type", "f32", "-q"],
                   capture_output=True, text=True, env=env, timeout=300)
check(r.returncode == 0 and os.path.exists(gguf),
      f"draft as GGUF: {r.stderr.strip()}")

base, base_url, base_lines = start()
ngram, ngram_url, ngram_lines = start("--speculative", "ngram")
dft, dft_url, dft_lines = start("--draft-model", draft,
                                "--num-speculative-tokens", "3")
try:
    # the start lines
    line = start_line(ngram_lines, "speculative decoding:")
    check("speculative decoding: prompt lookup (n-grams of 1..4 tokens), 4 "
          "tokens proposed a step" in line,
          f"ngram's start line names prompt lookup, 1..4, 4 tokens: {line}")
    line = start_line(dft_lines, "speculative decoding:")
    check(f"speculative decoding: draft model {draft} (2 layers" in line and
          "3 tokens proposed a step" in line,
          f"draft's start line names the draft and K=3: {line}")

    # /metrics before any request: families present, all zero
    m0, _ = spec_metrics(ngram_url)
    check(set(m0) == set(SPEC_FAMILIES) and
          all(m0[k][0] == t for k, t in SPEC_FAMILIES.items()),
          f"ngram server: /metrics has the 5 spec_decode families: {m0}")
    _, any_spec = spec_metrics(base_url)
    check(not any_spec, "no spec_decode metrics without speculation")

    # greedy outputs: equal with and without speculation
    want, bu = greedy(base_url)
    check(base_lines and not any("speculative" in x for x in base_lines),
          "no speculation line without speculation")
    check(all("completion_tokens_details" not in u for u in bu),
          "no completion_tokens_details without speculation")
    for name, url in (("ngram", ngram_url), ("draft", dft_url)):
        got, us = greedy(url)
        for i, (a, b) in enumerate(zip(got, want)):
            check(a == b, f"{name}: greedy output {i} equals the one without "
                          f"speculation ({a[:40]!r} vs {b[:40]!r})")
        check(all(details_ok(u) for u in us),
              f"{name}: usage.completion_tokens_details on every response: "
              f"{[u.get('completion_tokens_details') for u in us]}")
        # streamed, with include_usage
        text, su = stream(url, "/v1/completions",
                          {"prompt": PROMPTS[0], "max_tokens": N,
                           "temperature": 0, "ignore_eos": True})
        check(text == want[0] and su is not None and details_ok(su),
              f"{name}: streamed completion: same text, usage with details")
        ctext, cu = stream(url, "/v1/chat/completions",
                           {"messages": CHAT, "max_tokens": N,
                            "temperature": 0})
        check(ctext == want[-1] and cu is not None and details_ok(cu),
              f"{name}: streamed chat: same text, usage with details")
        us += [su, cu]
        # the counters against the requests' usage, the gauges against the
        # counters
        m, _ = spec_metrics(url)
        acc = sum(u["completion_tokens_details"]["accepted_prediction_tokens"]
                  for u in us)
        prop = acc + sum(u["completion_tokens_details"]
                         ["rejected_prediction_tokens"] for u in us)
        drafted = m["tessera:spec_decode_num_draft_tokens_total"][1]
        accepted = m["tessera:spec_decode_num_accepted_tokens_total"][1]
        emitted = m["tessera:spec_decode_num_emitted_tokens_total"][1]
        check(drafted == prop and accepted == acc,
              f"{name}: draft/accepted counters ({drafted:g}, {accepted:g}) "
              f"are the usages' sums ({prop}, {acc})")
        rate = m["tessera:spec_decode_acceptance_rate"][1]
        check(abs(rate - (accepted / drafted if drafted else 0)) < 1e-5,
              f"{name}: acceptance rate {rate} = accepted / proposed")
        mal = m["tessera:spec_decode_mean_accepted_length"][1]
        verif = emitted - accepted
        check(verif >= 0 and abs(mal - (emitted / verif if verif else 0))
              < 1e-5, f"{name}: mean accepted length {mal} = emitted / "
                      f"verifications")
        check(drafted > 0 and accepted > 0 and 0 < rate <= 1 and mal > 1,
              f"{name}: proposals made and accepted (rate {rate},"
              f" mean accepted length {mal})")
        check(acc > 0, f"{name}: accepted_prediction_tokens > 0 in the usages")
finally:
    for p in (base, ngram, dft):
        stop(p)

# the draft as a GGUF file
if os.path.exists(gguf):
    g, g_url, g_lines = start("--speculative", "draft", "--draft-model", gguf)
    try:
        line = start_line(g_lines, "speculative decoding:")
        check(f"draft model {gguf} (2 layers" in line, f"GGUF draft: {line}")
        got, us = greedy(g_url)
        check(got == want and all(details_ok(u) for u in us),
              "GGUF draft: greedy outputs unchanged, usage with details")
    finally:
        stop(g)


# ---- bad flags ----

def tiny_model(path, vocab, context=1024):
    """a one-layer Qwen3 folder, random weights, no tokenizer"""
    os.makedirs(path, exist_ok=True)
    C, F, D = 64, 128, 32
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "vocab_size": vocab, "hidden_size": C, "intermediate_size": F,
           "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": D,
           "max_position_embeddings": context, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": True, "torch_dtype": "float32"}
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    L = "model.layers.0."
    shapes = {"model.embed_tokens.weight": (vocab, C), "model.norm.weight": (C,),
              L + "input_layernorm.weight": (C,),
              L + "post_attention_layernorm.weight": (C,),
              L + "self_attn.q_proj.weight": (2 * D, C),
              L + "self_attn.k_proj.weight": (D, C),
              L + "self_attn.v_proj.weight": (D, C),
              L + "self_attn.o_proj.weight": (C, 2 * D),
              L + "self_attn.q_norm.weight": (D,),
              L + "self_attn.k_norm.weight": (D,),
              L + "mlp.gate_proj.weight": (F, C),
              L + "mlp.up_proj.weight": (F, C),
              L + "mlp.down_proj.weight": (C, F)}
    rng = np.random.default_rng(5)
    header, blobs, off = {}, [], 0
    for name, shape in shapes.items():
        a = (np.ones(shape) if len(shape) == 1 else
             rng.normal(0, 0.02, shape)).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [off, off + len(a)]}
        blobs.append(a)
        off += len(a)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


other = os.path.join(work, "other-vocab")
tiny_model(other, 512)
short = os.path.join(work, "short-context")
tiny_model(short, 4096, context=256)
missing = os.path.join(work, "no-such-draft")


def refused(flags, rc, *words):
    r = subprocess.run([exe, "serve", "-m", model, "--port", "0", *flags],
                       capture_output=True, text=True, env=env, timeout=120)
    check(r.returncode == rc and all(w in r.stderr for w in words),
          f"serve {' '.join(flags)}: exit {r.returncode} (want {rc}), "
          f"{r.stderr.strip()[:200]!r} names {words}")


refused(["--speculative", "ngram", "--num-speculative-tokens", "0"], 2,
        "--num-speculative-tokens", "1..16")
refused(["--speculative", "ngram", "--num-speculative-tokens", "17"], 2,
        "--num-speculative-tokens", "1..16")
refused(["--draft-model", other], 1, "--draft-model", other, "512", "4096")
refused(["--draft-model", missing], 1, "--draft-model", missing)
refused(["--draft-model", short], 1, "--draft-model", short, "256", "1024")
refused(["--speculative", "draft"], 1, "--speculative draft", "--draft-model")
refused(["--speculative", "ngram", "--draft-model", draft], 1,
        "--draft-model", "ngram")
refused(["--speculative", "ngram", "--prompt-lookup-min", "5",
         "--prompt-lookup-max", "3"], 1, "--prompt-lookup-min 5",
        "--prompt-lookup-max 3")
refused(["--draft-model", draft, "--prompt-lookup-max", "3"], 1,
        "--prompt-lookup-max")
refused(["--num-speculative-tokens", "3"], 1, "--num-speculative-tokens",
        "--speculative")


# ---- Python ----

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))
import tessera  # noqa: E402

with tessera.serve(model, speculative="ngram", num_speculative_tokens=4,
                   prompt_lookup_min=1, prompt_lookup_max=4,
                   no_log_requests=True) as s:
    m, _ = spec_metrics(s.url)
    r = post(s.url, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": N,
                                        "temperature": 0, "ignore_eos": True})
    check(set(m) == set(SPEC_FAMILIES) and r["choices"][0]["text"] == want[0]
          and details_ok(r["usage"]),
          "tessera.serve(speculative='ngram', ...): metrics, same greedy "
          "text, usage details")
with tessera.serve(model, draft_model=draft, no_log_requests=True) as s:
    r = post(s.url, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": N,
                                        "temperature": 0, "ignore_eos": True})
    check(r["choices"][0]["text"] == want[1] and details_ok(r["usage"]),
          "tessera.serve(draft_model=...): implies draft, same greedy text")
for kw, words in (({"speculative": "medusa"}, ("speculative", "ngram")),
                  ({"speculative": "ngram", "num_speculative_tokens": 0},
                   ("num_speculative_tokens", "1..16")),
                  ({"speculative": "ngram", "num_speculative_tokens": 17},
                   ("num_speculative_tokens", "1..16")),
                  ({"draft_model": other}, ("--draft-model", "512", "4096")),
                  ({"draft_model": missing}, ("--draft-model", missing))):
    try:
        s = tessera.serve(model, **kw)
        s.stop()
        check(False, f"tessera.serve({kw}) refused")
    except tessera.Error as e:
        check(all(w in str(e) for w in words),
              f"tessera.serve({kw}) refused: {e}")

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
