#!/usr/bin/python3
"""bench_table.py — gathers what bench.sh ran (llama-bench's JSON records and,
when the caller passed TESSERA_BENCH_CMD, Tessera's JSON lines) into one JSON
file and prints the table: prefill and decode tokens/s per format and thread
count, llama.cpp beside Tessera.

  bench_table.py RAWDIR OUT.json --formats "bf16 q8_0" --threads "1 2"
                 --models DIR --stem qwen3-0.6b-random [--version-file F]
                 [--tessera-cmd CMD] [--load-before L] [--load-after L]

RAWDIR holds llama-<format>-t<threads>.json (llama-bench -o json) and, per
run of the caller's command, tessera-<format>-t<threads>.out (its stdout,
last line a JSON object with prefill_tps and decode_tps) or .failed.
"""
import argparse
import json
import os
import platform
import sys


def llama_figures(path):
    """{"prefill": record, "decode": record} from a llama-bench JSON array"""
    with open(path) as f:
        records = json.load(f)
    out = {}
    for r in records:
        if r["n_prompt"] > 0 and r["n_gen"] == 0:
            out["prefill"] = r
        elif r["n_gen"] > 0 and r["n_prompt"] == 0:
            out["decode"] = r
    if set(out) != {"prefill", "decode"}:
        raise SystemExit(f"{path}: no prefill and decode records")
    return out


def tessera_figures(raw, fmt, t):
    """the caller's command's result, or why there is none"""
    failed = os.path.join(raw, f"tessera-{fmt}-t{t}.failed")
    out = os.path.join(raw, f"tessera-{fmt}-t{t}.out")
    log = os.path.join(raw, f"tessera-{fmt}-t{t}.log")
    if os.path.exists(failed):
        tail = open(log).read().strip().splitlines()[-5:] if os.path.exists(log) else []
        return {"status": open(failed).read().strip(), "stderr_tail": tail}
    if not os.path.exists(out):
        return {"status": "not run: no TESSERA_BENCH_CMD given"}
    lines = [ln for ln in open(out).read().splitlines() if ln.strip()]
    try:
        fig = json.loads(lines[-1])
        float(fig["prefill_tps"]), float(fig["decode_tps"])
    except (IndexError, ValueError, KeyError, TypeError):
        return {"status": "bad output: its last line is not "
                          '{"prefill_tps": ..., "decode_tps": ...}',
                "stdout_tail": lines[-5:]}
    fig["status"] = "ok"
    return fig


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--formats", required=True)
    ap.add_argument("--threads", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--stem", required=True)
    ap.add_argument("--version-file")
    ap.add_argument("--tessera-cmd", default="")
    ap.add_argument("--load-before", default="")
    ap.add_argument("--load-after", default="")
    a = ap.parse_args()

    runs = []
    for fmt in a.formats.split():
        model = os.path.join(a.models, f"{a.stem}-{fmt}.gguf")
        for t in (int(x) for x in a.threads.split()):
            ll = llama_figures(os.path.join(a.raw, f"llama-{fmt}-t{t}.json"))
            p, d = ll["prefill"], ll["decode"]
            load = os.path.join(a.raw, f"load-{fmt}-t{t}")
            runs.append({
                "format": fmt, "model": os.path.abspath(model),
                "file_bytes": os.path.getsize(model), "threads": t,
                "load_1min_before": open(load).read().strip() if os.path.exists(load) else None,
                "n_prompt": p["n_prompt"], "n_gen": d["n_gen"],
                "llama_cpp": {"prefill_tps": p["avg_ts"], "prefill_tps_sd": p["stddev_ts"],
                              "prefill_tps_best": max(p.get("samples_ts") or [p["avg_ts"]]),
                              "decode_tps": d["avg_ts"], "decode_tps_sd": d["stddev_ts"],
                              "decode_tps_best": max(d.get("samples_ts") or [d["avg_ts"]]),
                              "records": [p, d]},
                "tessera": tessera_figures(a.raw, fmt, t),
            })
    version = open(a.version_file).read().strip().splitlines() if (
        a.version_file and os.path.exists(a.version_file)) else []
    doc = {
        "what": "llama-bench prefill/decode tokens/s on the random Qwen3-0.6B GGUFs; "
                "Tessera's from the caller's TESSERA_BENCH_CMD when given",
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "load_before": a.load_before, "load_after": a.load_after},
        "llama_cpp_build": version,
        "tessera_bench_cmd": a.tessera_cmd or None,
        "runs": runs,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")

    print(f"{'format':7s} {'size MiB':>8s} {'thr':>3s} {'load':>5s} | "
          f"{'llama.cpp pp' + str(runs[0]['n_prompt']):>23s} "
          f"{'tg' + str(runs[0]['n_gen']):>21s} | {'tessera pp':>10s} {'tg':>8s}")
    for r in runs:
        ll, ts = r["llama_cpp"], r["tessera"]
        if ts["status"] == "ok":
            tess = f"{ts['prefill_tps']:10.2f} {ts['decode_tps']:8.2f}"
        else:
            tess = f"{ts['status'].split(':')[0]:>19s}"
        print(f"{r['format']:7s} {r['file_bytes'] / 2**20:8.1f} {r['threads']:3d} "
              f"{r['load_1min_before'] or '?':>5s} | "
              f"{ll['prefill_tps']:9.2f} ±{ll['prefill_tps_sd']:6.2f} ({ll['prefill_tps_best']:6.1f}) "
              f"{ll['decode_tps']:7.2f} ±{ll['decode_tps_sd']:6.2f} ({ll['decode_tps_best']:5.1f}) | {tess}")
    print("tokens/s, mean ± sd (best) over the repetitions; load: the 1-minute load "
          f"average before the run, on {os.cpu_count()} cores; JSON: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
