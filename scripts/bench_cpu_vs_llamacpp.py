#!/usr/bin/env python3
"""DeepInfer's CPU engine vs llama.cpp on the same GGUF, in one run.

For each thread count: `deepinfer bench` (batch 1, prompts of 128, 512 and
1,024 tokens, 128 generated tokens each) and scripts/bench_llamacpp.py (the
same shapes), one after the other so both see the same machine load. Prints a
markdown table: prefill of 128 and 512 tokens, decode after the 128- and
1,024-token prompts, the ratio, and for decode at context 128 the achieved
weight-read bandwidth (bytes of weights read per step = the GGUF's tensor
data, each tensor read once per token; the tied embedding serves as the output
matrix), to compare with build/bench_quants' streaming-read figure.

Usage: scripts/bench_cpu_vs_llamacpp.py [--model M] [--threads 1 2] [--runs 3]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DEEPINFER_BIN", os.path.join(REPO, "build", "deepinfer"))


def gguf_tensor_bytes(path):
    from gguf import GGUFReader
    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def ours(model, threads, runs):
    out = subprocess.run([BIN, "bench", "-m", model, "--threads", str(threads),
                          "-b", "1", "-p", "128,512,1024", "-g", "128", "-r", str(runs), "--json"],
                         check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    by_p = {r["prompt_len"]: r for r in rows}
    return {"prefill 128": by_p[128]["prefill_tok_s"], "prefill 512": by_p[512]["prefill_tok_s"],
            "decode 128 @ctx 128": by_p[128]["decode_tok_s"], "decode 128 @ctx 1024": by_p[1024]["decode_tok_s"]}


def llama(model, threads, runs):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_llamacpp.py"), model, "--threads",
                        str(threads), "--runs", str(runs), "--decode-contexts", "128", "1024", "--json", f.name],
                       check=True, capture_output=True)
        rows = json.load(open(f.name))["results"]
    return {r["test"]: r["tok_per_s"] for r in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    weight_bytes = gguf_tensor_bytes(args.model)
    print(f"model {os.path.basename(args.model)}: {weight_bytes / 1e6:.1f} MB of weights read per decode step")
    print("| threads | test | DeepInfer tok/s | llama.cpp tok/s | ratio | DeepInfer weight GB/s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for t in args.threads:
        a = ours(args.model, t, args.runs)
        b = llama(args.model, t, args.runs)
        for test in ("prefill 128", "prefill 512", "decode 128 @ctx 128", "decode 128 @ctx 1024"):
            gbs = f"{a[test] * weight_bytes / 1e9:.2f}" if test == "decode 128 @ctx 128" else ""
            print(f"| {t} | {test} | {a[test]:.1f} | {b[test]:.1f} | {a[test] / b[test]:.2f} | {gbs} |", flush=True)


if __name__ == "__main__":
    main()
