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

--isa avx2 --llama-path DIR compares the AVX2 level on the same machine:
DeepInfer runs with DEEPINFER_CPU_ISA=avx2 (and OpenBLAS held to its AVX2
kernels by OPENBLAS_CORETYPE=Haswell) and llama.cpp is the copy built
into DIR by `LCPP_ISA=avx2 LCPP_TARGET=DIR scripts/install_llamacpp.sh` -
what an AVX2-only server would run.

Usage: scripts/bench_cpu_vs_llamacpp.py [--model M] [--threads 1 2] [--runs 3] [--isa L] [--llama-path DIR]
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


def env_with(name, value):
    env = dict(os.environ)
    if value:
        env[name] = value
    return env


def ours_env(isa):
    env = env_with("DEEPINFER_CPU_ISA", isa)
    if isa in ("avx2", "scalar"):
        # OpenBLAS (DeepInfer's f32 GEMM off AMX) picks its kernels by CPUID on its own: keep it on AVX2 too.
        env["OPENBLAS_CORETYPE"] = "Haswell"
    return env


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def ours(model, threads, runs, isa):
    out = subprocess.run([BIN, "bench", "-m", model, "--threads", str(threads),
                          "-b", "1", "-p", "128,512,1024", "-g", "128", "-r", str(runs), "--json"],
                         check=True, capture_output=True, text=True,
                         env=ours_env(isa)).stdout
    rows = json.loads(out)
    by_p = {r["prompt_len"]: r for r in rows}
    return {"prefill 128": by_p[128]["prefill_tok_s"], "prefill 512": by_p[512]["prefill_tok_s"],
            "decode 128 @ctx 128": by_p[128]["decode_tok_s"], "decode 128 @ctx 1024": by_p[1024]["decode_tok_s"]}


def llama(model, threads, runs, llama_path):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_llamacpp.py"), model, "--threads",
                        str(threads), "--runs", str(runs), "--decode-contexts", "128", "1024", "--json", f.name],
                       check=True, capture_output=True, env=env_with("PYTHONPATH", llama_path))
        rows = json.load(open(f.name))["results"]
    return {r["test"]: r["tok_per_s"] for r in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--isa", default="", help="DEEPINFER_CPU_ISA for DeepInfer (default: what the CPU has)")
    ap.add_argument("--llama-path", default="", help="PYTHONPATH holding the llama-cpp-python build to compare with")
    args = ap.parse_args()
    ours_isa = args.isa or "best level of this CPU"
    print(f"CPU: {cpu_model()}; DeepInfer kernels: {ours_isa}; llama.cpp: {args.llama_path or 'installed build'}")
    weight_bytes = gguf_tensor_bytes(args.model)
    print(f"model {os.path.basename(args.model)}: {weight_bytes / 1e6:.1f} MB of weights read per decode step")
    print("| threads | test | DeepInfer tok/s | llama.cpp tok/s | ratio | DeepInfer weight GB/s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for t in args.threads:
        a = ours(args.model, t, args.runs, args.isa)
        b = llama(args.model, t, args.runs, args.llama_path)
        for test in ("prefill 128", "prefill 512", "decode 128 @ctx 128", "decode 128 @ctx 1024"):
            gbs = f"{a[test] * weight_bytes / 1e9:.2f}" if test == "decode 128 @ctx 128" else ""
            print(f"| {t} | {test} | {a[test]:.1f} | {b[test]:.1f} | {a[test] / b[test]:.2f} | {gbs} |", flush=True)


if __name__ == "__main__":
    main()
