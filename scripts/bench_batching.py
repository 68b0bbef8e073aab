#!/usr/bin/env python3
"""Continuous batching and prefix caching on the CPU engine, measured with
`deepinfer generate --input` (the offline batch API):

1. 64 greedy requests of mixed prompt lengths (8-40 tokens), 32 output
   tokens each, prefix caching off: run together (--max-num-seqs 64) vs one at
   a time (--max-num-seqs 1); generated tokens/s, and how many outputs are
   identical. (Token-for-token identity is guaranteed with
   DEEPINFER_BATCH_INVARIANT=1 and asserted by test_engine; this measures the
   default, faster mode.)
2. A shared-prefix workload: 32 requests sharing a ~400-token document, each
   with its own question, prefix caching on vs off: prefix-cache hit rate and
   mean time to first token.

Usage: scripts/bench_batching.py [--model M] [--threads N]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("DEEPINFER_BIN", os.path.join(REPO, "build", "deepinfer"))
WORDS = ("the river carried silt from the mountains to a wide delta where farmers planted rice and "
         "traders built wooden houses on stilts above the seasonal floods").split()


def run(model, inputs, extra, threads, env_extra=None):
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(inp, "w") as f:
            for x in inputs:
                f.write(json.dumps(x) + "\n")
        env = dict(os.environ, **(env_extra or {}))
        t0 = time.time()
        p = subprocess.run([BIN, "generate", "-q", "-m", model, "--threads",
                            str(threads), "--input", inp, "--output", out, "--max-model-len", "1024"] + extra,
                           check=True, capture_output=True, text=True, env=env)
        wall = time.time() - t0
        outs = [json.loads(l) for l in open(out)]
    m = re.search(r"summary: .*", p.stderr)
    return outs, (m.group(0) if m else ""), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    prompts = []
    for i in range(64):
        n = 8 + (i * 37) % 33
        prompts.append({"prompt": f"Note {i}: " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n)),
                        "max_tokens": 32, "temperature": 0, "ignore_eos": True})
    no_cache = ["--no-enable-prefix-caching"]
    batched, s_b, w_b = run(args.model, prompts, ["--max-num-seqs", "64"] + no_cache, args.threads)
    alone, s_a, w_a = run(args.model, prompts, ["--max-num-seqs", "1"] + no_cache, args.threads)
    same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(batched, alone))
    gen = sum(len(o["token_ids"]) for o in batched)
    print("## Continuous batching: 64 requests, prompts 8-40 words, 32 greedy tokens each")
    print(f"- together (--max-num-seqs 64): {gen / w_b:.1f} generated tok/s ({w_b:.1f} s wall)  [{s_b}]")
    print(f"- one at a time (--max-num-seqs 1): {gen / w_a:.1f} generated tok/s ({w_a:.1f} s wall)  [{s_a}]")
    print(f"- speed-up {w_a / w_b:.2f}x; identical greedy outputs: {same}/64")

    doc = " ".join(WORDS[k % len(WORDS)] for k in range(400))
    shared = [{"prompt": doc + f"\nQuestion {i}: what happened in year {1900 + i}?\nAnswer:", "max_tokens": 8,
               "temperature": 0} for i in range(32)]
    on, s_on, w_on = run(args.model, shared, ["--max-num-seqs", "8"], args.threads)
    off, s_off, w_off = run(args.model, shared, ["--max-num-seqs", "8", "--no-enable-prefix-caching"], args.threads)
    ttft = lambda o: sum(x["time_to_first_token_s"] for x in o) / len(o)
    cached = sum(x["cached_prompt_tokens"] for x in on)
    total = sum(x["prompt_tokens"] for x in on)
    print("\n## Prefix caching: 32 requests sharing a ~400-token document")
    print(f"- prefix cache on: hit rate {cached / total:.1%} of prompt tokens, mean TTFT {ttft(on):.3f} s, "
          f"wall {w_on:.1f} s")
    print(f"- prefix cache off: mean TTFT {ttft(off):.3f} s, wall {w_off:.1f} s")
    print(f"- TTFT gain {ttft(off) / ttft(on):.2f}x; same outputs: "
          f"{sum(a['token_ids'] == b['token_ids'] for a, b in zip(on, off))}/32")


if __name__ == "__main__":
    main()
