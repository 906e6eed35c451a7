#!/usr/bin/python3
"""cli_help.py TESSERA SOURCE_DIR — every command's --help against what the
command parses, from two sides: each flag --help lists (every alias) is
accepted by the command (`tessera CMD FLAG VALUE --help` reaches the help
and exits 0), and each flag named in the command's source files
(src/cli/*.c, read here independently of the binary) appears in its
--help. Also: unknown flags and commands get the nearest known one;
--version names the version, the commit, the backends, the CPU paths built,
the level in use and the machine's features
(those of this machine as /proc/cpuinfo has them); `tokenize --decode`
takes the JSON array `tokenize` prints. Standard library only."""
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

exe, src = sys.argv[1], sys.argv[2]
failures = []


def run(*args, env_extra=None):
    env = dict(os.environ, TS_NUM_THREADS="1")
    env.pop("TS_CPU_ISA", None)
    env.update(env_extra or {})
    return subprocess.run([exe, *args], capture_output=True, text=True,
                          timeout=60, env=env)


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL", what)


top = run("--help")
check(top.returncode == 0, "tessera --help exits 0")
commands = re.findall(r"^  ([a-z][a-z-]+) ", top.stdout, re.M)
check(len(commands) == 17 and "chat" in commands and "diffuse" in commands,
      f"commands {commands}")

# command -> (flag names, {flag: (placeholder, default)})
OPT = re.compile(r"^  (-[-\w]+(?:, -[-\w]+)*)(?: (\S+))?(?:\s|$)")
helps, opts = {}, {}
for cmd in commands:
    r = run(cmd, "--help")
    check(r.returncode == 0 and r.stdout.startswith(f"usage: tessera {cmd}"),
          f"{cmd} --help: rc {r.returncode} {r.stderr}")
    helps[cmd] = r.stdout
    text = re.sub(r"\n {20,}", " ", r.stdout)  # the wrapped help lines
    opts[cmd] = {}
    for line in text.splitlines():
        m = OPT.match(line)
        if m:
            d = re.search(r"\(default: (.*)\)$", line)
            for name in m.group(1).split(", "):
                opts[cmd][name] = (m.group(2), d.group(1) if d else None)
    check("--help" in opts[cmd] and "--threads" in opts[cmd],
          f"{cmd} --help lists --help and --threads")

tmp = tempfile.mkdtemp()
empty_json = os.path.join(tmp, "empty.json")
open(empty_json, "w").write("{}")


def sample(placeholder, default):
    """a value the option takes"""
    if placeholder is None:
        return []
    if placeholder.endswith(".json"):
        return [empty_json]
    if "|" in placeholder:
        return [placeholder.split("|")[0]]
    num = re.search(r"(?<![\w.])(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.])",
                    default or "")
    if placeholder.isupper() and len(placeholder) <= 7 and \
            placeholder not in ("DIR", "TEXT", "STR", "KEY", "NAME", "MAP",
                                "ADDR", "URL", "ORIGINS"):
        return [num.group(1) if num else "64"]
    if default and " " not in default:
        return [default]
    return ["x"]


# each listed flag is accepted, with a value of its kind
cases = [[cmd, flag, *sample(ph, default), "--help"] for cmd in commands
         for flag, (ph, default) in opts[cmd].items()
         if flag not in ("-h", "--help")]
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    for args, r in zip(cases, pool.map(lambda a: run(*a), cases)):
        check(r.returncode == 0 and r.stdout.startswith(
            f"usage: tessera {args[0]}"),
            f"{' '.join(args)}: rc {r.returncode}: {r.stderr.strip()}")

# each flag the source names appears in the help of its commands
FILES = {"run.c": ["run", "chat", "tokenize"], "serve.c": ["serve"],
         "route.c": ["route"], "models_cli.c": ["info", "logits"],
         "demo.c": ["demo"], "devices_cli.c": ["devices"],
         "quantize_cli.c": ["quantize", "convert"], "diffuse.c": ["diffuse"],
         "train_cli.c": ["tokenizer-train", "prepare-data", "train", "bench",
                         "plot-loss"],
         "main.c": commands}
STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
for f, cmds in FILES.items():
    code = open(os.path.join(src, "src", "cli", f)).read()
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)  # comments aside
    flags = set()
    for s in STRING.findall(code):
        flags.update(FLAG.findall(s))
    known = set().union(*(opts[c] for c in cmds)) | {"--version"}
    shown = "".join(helps[c] for c in cmds) + top.stdout
    for fl in sorted(flags):
        check(fl in known or re.search(rf"(?<![\w-]){re.escape(fl)}(?![\w-])",
                                       shown),
              f"{f} names {fl}, which no help of {cmds} lists")
    check(len(flags) > 0 or f == "devices_cli.c", f"flags read from {f}")

# unknown flags and commands: the nearest known one
r = run("run", "--temprature", "0.5")
check(r.returncode == 2 and 'unknown option "--temprature"; did you mean '
      '"--temperature"?' in r.stderr, f"run --temprature: {r.stderr}")
r = run("serve", "--max-num-seq", "4")
check(r.returncode == 2 and 'did you mean "--max-num-seqs"?' in r.stderr,
      f"serve --max-num-seq: {r.stderr}")
r = run("serv")
check(r.returncode == 2 and 'unknown command "serv"; did you mean "serve"?'
      in r.stderr, f"serv: {r.stderr}")
r = run("frobnicate")
check(r.returncode == 2 and "did you mean" not in r.stderr and
      'unknown command "frobnicate"' in r.stderr, f"frobnicate: {r.stderr}")
r = run("run", "--top-p", "0")
check(r.returncode == 2 and '--top-p "0": want a number in (0, 1]' in
      r.stderr, f"run --top-p 0: {r.stderr}")
r = run("info", "--ids")
check(r.returncode == 2 and 'unknown option "--ids"' in r.stderr,
      f"info --ids: {r.stderr}")
r = run("serve", "--pooling", "max")
check(r.returncode == 2 and '--pooling "max": want one of last, mean' in
      r.stderr, f"serve --pooling max: {r.stderr}")
r = run("run", "--seed=x")
check(r.returncode == 2 and '--seed "x"' in r.stderr, f"--seed=x {r.stderr}")

# --version: the version, the commit, the backends and the CPU paths
r = run("--version")
lines = r.stdout.splitlines()
check(r.returncode == 0 and len(lines) >= 4, f"--version: {r.stdout}")
check(re.match(r"tessera \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,}|unknown)\)$",
               lines[0]) is not None, f"--version line 1: {lines[0]}")
check(re.match(r"backends: cpu(, vulkan)?$", lines[1]) is not None,
      f"--version backends: {lines[1]}")
check(lines[2].startswith("cpu paths built: sse2 avx2 avx512 avx512_bf16"),
      f"built for: {lines[2]}")
cpu = open("/proc/cpuinfo").read().split("\nflags", 1)[1].split("\n")[0]
have = set(cpu.split(":", 1)[1].split())
# the level in use and the machine's highest, from cpuinfo's flags
best = "sse2"
if {"avx2", "fma", "f16c"} <= have:
    best = "avx2"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= have:
        best = "avx512"
        if {"avx512_vnni", "avx512_bf16"} <= have:
            best = "avx512_bf16"
            if {"amx_tile", "amx_bf16", "amx_int8"} <= have:
                best = "amx"
check(lines[3] == f"cpu path in use: {best} (this machine's highest: {best})",
      f"--version level: {lines[3]} (cpuinfo says {best})")
mine = set(lines[4].split(":", 1)[1].split())
for isa in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni"):
    check((isa in have) == (isa in mine),
          f"--version says {isa} {'is' if isa in have else 'is not'} "
          f"here: {lines[4]}")
r = run("--version", env_extra={"TS_CPU_ISA": "sse2"})
check("cpu path in use: sse2" in r.stdout and "TS_CPU_ISA set" in r.stdout,
      f"--version under TS_CPU_ISA=sse2: {r.stdout}")

# tokenize --decode takes tokenize's own output
model = os.path.join(src, "models", "kjv-qwen3")
text = "In the beginning God created"
r = run("tokenize", "-m", model, text)
check(r.returncode == 0 and r.stdout.startswith("["), f"tokenize {r.stderr}")
ids = r.stdout.strip()
for form in (ids, ids.strip("[]").replace(" ", ""), " " + ids + "\n"):
    d = run("tokenize", "-m", model, "--decode", form)
    check(d.returncode == 0 and d.stdout == text + "\n",
          f"--decode {form!r}: {d.stdout!r} {d.stderr}")
for bad in ("[1, 2", "1,,2", "[1] 2", "x", "-1"):
    d = run("tokenize", "-m", model, "--decode", "--", bad)
    check(d.returncode == 2 and "--decode wants ids" in d.stderr,
          f"--decode {bad!r}: rc {d.returncode} {d.stderr}")

print(f"cli_help: {len(commands)} commands, "
      f"{sum(len(o) for o in opts.values())} flags; "
      f"{'all passed' if not failures else f'{len(failures)} failed'}")
sys.exit(1 if failures else 0)
