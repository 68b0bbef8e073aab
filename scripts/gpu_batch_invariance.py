#!/usr/bin/env python3
"""Batch invariance on the GPU (DEEPINFER_BATCH_INVARIANT=1), end to end.

1. Uniqueness: one `deepinfer generate` run of a target prompt repeated
   --copies times greedy and --copies times with seeded sampling (one seed),
   shuffled among filler requests of random prompt and output lengths, so the
   copies run inside batches of every size and composition; the first copy
   computes the prompt (in chunks of the shared token budget), later copies
   find it in the prefix cache. Counts the distinct outputs of each kind of
   copy, with the mode on and off.
2. Cost: `deepinfer bench` decode tok/s at each --batches size and prefill
   tok/s of one --prefill-len prompt, with the mode on and off.

Writes a JSON report to --out.
  scripts/gpu_batch_invariance.py --deepinfer BIN --model DIR --out FILE [--label llama8b]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time


def run(cmd, env, timeout):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-3000:]}")
    return r, time.time() - t0


def uniqueness(args, env, workdir, tag, extra):
    rng = random.Random(7)
    target = [rng.randrange(3, args.vocab) for _ in range(args.target_len)]
    rows = []
    for i in range(args.copies):
        rows.append(("greedy", {"prompt_token_ids": target, "max_tokens": args.gen, "temperature": 0,
                                "ignore_eos": True}))
        rows.append(("seeded", {"prompt_token_ids": target, "max_tokens": args.gen, "temperature": 0.8,
                                "top_p": 0.95, "seed": 1234, "ignore_eos": True}))
    for i in range(args.fillers):
        n = rng.randrange(8, args.filler_max_len)
        rows.append(("filler", {"prompt_token_ids": [rng.randrange(3, args.vocab) for _ in range(n)],
                                "max_tokens": rng.randrange(1, 96), "temperature": 0, "ignore_eos": True}))
    rng.shuffle(rows)
    path = os.path.join(workdir, f"bi_{tag}.jsonl")
    out = os.path.join(workdir, f"bi_{tag}_out.jsonl")
    with open(path, "w") as f:
        for _, r in rows:
            f.write(json.dumps(r) + "\n")
    cmd = [args.deepinfer, "generate", "--device", "cuda", "--model", args.model, "--input", path, "--output", out,
           "--max-num-seqs", "256", "--max-num-batched-tokens", str(args.budget), "--max-model-len", "4096"] + extra
    r, wall = run(cmd, env, args.timeout)
    outs = [json.loads(line) for line in open(out)]
    assert len(outs) == len(rows)
    distinct = {"greedy": set(), "seeded": set()}
    cached = {"greedy": 0, "seeded": 0}
    for (kind, _), o in zip(rows, outs):
        if kind in distinct:
            distinct[kind].add(tuple(o["token_ids"]))
            cached[kind] += o["cached_prompt_tokens"] > 0
    return {"requests": len(rows), "wall_s": round(wall, 1),
            "distinct_greedy": len(distinct["greedy"]), "distinct_seeded": len(distinct["seeded"]),
            "copies_with_prefix_hits": cached}


def cost(args, env, extra):
    cmd = [args.deepinfer, "bench", "--device", "cuda", "--model", args.model, "-b", args.batches, "-p",
           str(args.bench_prompt), "-g", str(args.bench_gen), "-r", str(args.cost_repeats), "--json",
           "--max-num-batched-tokens", "8192", "--max-model-len", str(args.bench_prompt + args.bench_gen + 16)] + extra
    r, _ = run(cmd, env, args.timeout)
    decode = {f"b{p['batch']}": p["decode_tok_s"] for p in json.loads(r.stdout)}
    cmd = [args.deepinfer, "bench", "--device", "cuda", "--model", args.model, "-b", "1", "-p", str(args.prefill_len),
           "-g", "1", "-r", "3", "--json", "--max-num-batched-tokens", str(args.prefill_len), "--max-model-len",
           str(args.prefill_len + 16)] + extra
    r, _ = run(cmd, env, args.timeout)
    decode["prefill_tok_s"] = json.loads(r.stdout)[0]["prefill_tok_s"]
    return decode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="model")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--copies", type=int, default=1000)
    ap.add_argument("--fillers", type=int, default=600)
    ap.add_argument("--filler-max-len", type=int, default=800)
    ap.add_argument("--target-len", type=int, default=200)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--bench-prompt", type=int, default=512)
    ap.add_argument("--bench-gen", type=int, default=128)
    ap.add_argument("--prefill-len", type=int, default=4096)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--skip", default="", help="comma list of: unique,cost")
    ap.add_argument("--cost-repeats", type=int, default=1, help="deepinfer bench -r for the decode cost (median)")
    ap.add_argument("--modes", default="on,off",
                    help="comma list of: on, off, on-wgmma (the mode without cuBLASLt: DEEPINFER_BI_CUBLAS=0), "
                         "on-mma (mma.sync only: DEEPINFER_BI_CUBLAS=0 DEEPINFER_BI_WGMMA=0), "
                         "on-seg (attention in 256-key segments, split over blocks where the batch leaves "
                         "SMs idle: DEEPINFER_BI_ATTENTION_SEGMENT=256); any mode + '-fp8kv' (on-fp8kv, off-fp8kv) runs "
                         "with an FP8 KV cache, its cost against off-fp8kv; a mode + ':unique' or ':cost' "
                         "runs only that part")
    args = ap.parse_args()
    workdir = "/tmp/deepinfer_bi"
    os.makedirs(workdir, exist_ok=True)
    report = {"label": args.label, "model": args.model}
    modes = []
    for item in args.modes.split(","):
        mode, _, only = item.partition(":")
        modes.append(mode)
        env = dict(os.environ)
        env.pop("DEEPINFER_BATCH_INVARIANT", None)
        env.pop("DEEPINFER_BI_WGMMA", None)
        env.pop("DEEPINFER_BI_CUBLAS", None)
        env.pop("DEEPINFER_BI_ATTENTION_SEGMENT", None)
        extra = []
        base = mode
        if mode.endswith("-fp8kv"):
            extra = ["--kv-cache-dtype", "fp8"]
            base = mode[:-len("-fp8kv")]
        if mode.startswith("on"):
            env["DEEPINFER_BATCH_INVARIANT"] = "1"
        if base in ("on-wgmma", "on-mma"):
            env["DEEPINFER_BI_CUBLAS"] = "0"
        if base == "on-mma":
            env["DEEPINFER_BI_WGMMA"] = "0"
        if base == "on-seg":
            env["DEEPINFER_BI_ATTENTION_SEGMENT"] = "256"
        try:
            if "unique" not in args.skip and only in ("", "unique"):
                report[f"unique_{mode}"] = uniqueness(args, env, workdir, mode, extra)
            if "cost" not in args.skip and only in ("", "cost"):
                report[f"cost_{mode}"] = cost(args, env, extra)
        except Exception as e:  # keep what was measured
            report[f"error_{mode}"] = str(e)[-2000:]
        print(json.dumps(report), flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    for mode in modes:
        ref = "cost_off-fp8kv" if mode.endswith("-fp8kv") else "cost_off"
        if mode.startswith("on") and f"cost_{mode}" in report and ref in report:
            suffix = "" if mode == "on" else "_" + mode.replace("-", "_")
            report["cost_ratio" + suffix] = {k: report[f"cost_{mode}"][k] / report[ref][k]
                                             for k in report[f"cost_{mode}"] if report[ref].get(k)}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
