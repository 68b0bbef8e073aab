#!/usr/bin/env python3
"""SWA bounded replay on a model with sliding-window layers (docs/benchmarks.md,
"KV tiers"): for prompts of several lengths L sharing nothing, a cold run
fills a --kv-cache-dir; a new process then serves the same prompt from it.
The hit loads the full-attention layers up to s = L - (W + r) (block-rounded)
and replays the windowed layers from s, so its time to first token should
not grow with L while the cold run's does. The replay is an approximation:
the first token's logprob and the greedy tokens are compared with the cold
run's. Stored bytes per sequence are read from the tier's files and set
beside what keeping the windowed layers' state would take (the seed's count:
windowed layers x (W + r) x bytes per token).

Every run is batch-invariant, so the cold and hit runs differ only by the
replay, not by kernel shapes.

  scripts/bench_swa_replay.py --deepinfer build/deepinfer --model models/gemma-3-270m-q4_k_m.gguf \\
      --lengths 1024,2048,4096 --window 512 --layers 18 --windowed-layers 15 --kv-bytes-per-layer-token 1024
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(exe, model, workdir, prompt, cache, max_tokens, threads):
    path = os.path.join(workdir, "in.jsonl")
    out = os.path.join(workdir, "out.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}) + "\n")
    env = dict(os.environ, DEEPINFER_BATCH_INVARIANT="1")
    cmd = [exe, "generate", "--model", model, "--input", path, "--output", out, "--kv-cache-dir", cache,
           "--max-model-len", "16384", "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(open(out).readline())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", default="build/deepinfer")
    ap.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--rollback", type=int, default=6)
    ap.add_argument("--windowed-layers", type=int, default=15)
    ap.add_argument("--kv-bytes-per-layer-token", type=int, default=1024, help="K+V bytes of one layer and token")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    section = "Section {i}: the {w} fox number {i} jumps over the lazy dog near the river bank."
    words = ["quick", "brown", "grey", "red", "small", "old", "young", "clever"]
    rows = []
    for n, target in enumerate(int(x) for x in args.lengths.split(",")):
        # About 18 tokens per section; each length its own words, so no run shares a prefix.
        doc = " ".join(section.format(i=i, w=words[n % len(words)] + str(n)) for i in range(target // 18))
        prompt = doc + " Which section mentions number 7? Answer:"
        work = tempfile.mkdtemp(prefix="swa-replay-")
        cache = os.path.join(work, "cache")
        try:
            cold = run(args.deepinfer, args.model, work, prompt, cache, args.max_tokens, args.threads)
            stored = sum(os.path.getsize(f) for f in glob.glob(os.path.join(cache, "*", "*.kvb")))
            hit = run(args.deepinfer, args.model, work, prompt, cache, args.max_tokens, args.threads)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        L = cold["prompt_tokens"]
        agree = 0
        for a, b in zip(cold["token_ids"], hit["token_ids"]):
            if a != b:
                break
            agree += 1
        row = {"prompt_tokens": L, "cached_tokens": hit["cached_prompt_tokens"],
               "replayed_tokens": L - hit["cached_prompt_tokens"],
               "ttft_cold_s": cold["time_to_first_token_s"], "ttft_hit_s": hit["time_to_first_token_s"],
               "first_logprob_cold": cold["logprobs"][0]["logprob"], "first_logprob_hit": hit["logprobs"][0]["logprob"],
               "first_token_same": cold["token_ids"][0] == hit["token_ids"][0],
               "greedy_tokens_agreeing": agree, "of_tokens": len(cold["token_ids"]),
               "stored_bytes": stored,
               "windowed_state_bytes_seed_count": args.windowed_layers * (args.window + args.rollback) *
               args.kv_bytes_per_layer_token}
        rows.append(row)
        print(f"L={L}: cached {row['cached_tokens']} (replayed {row['replayed_tokens']}); TTFT cold "
              f"{row['ttft_cold_s']:.3f} s, hit {row['ttft_hit_s']:.3f} s; first-token logprob "
              f"{row['first_logprob_cold']:.4f} vs {row['first_logprob_hit']:.4f} "
              f"(|diff| {abs(row['first_logprob_cold'] - row['first_logprob_hit']):.4f}); greedy tokens equal for "
              f"{agree}/{row['of_tokens']}; stored {stored / 1024:.0f} KiB (windowed state, seed's count: "
              f"{row['windowed_state_bytes_seed_count'] / 1024:.0f} KiB)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
