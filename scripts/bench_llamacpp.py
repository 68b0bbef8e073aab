#!/usr/bin/env python3
"""Measures llama.cpp (llama-cpp-python) prefill and decode speed on a GGUF.

This is the speed peer for DeepInfer's CPU engine: run it next to DeepInfer's
own benchmark on the same machine and model.

What is measured (median of --runs runs after one untimed warm-up):
  prefill: one llama_decode call over an N-token prompt (N = 128 and 512 by
           default) in a single batch (n_batch = n_ubatch = N), starting from
           an empty KV cache; logits are produced for the last position only.
  decode:  --gen greedy tokens generated one llama_decode call each, after
           prefilling the 128-token prompt (so the context grows 128 -> 256).
           Timed is the llama_decode call of every step; the argmax over the
           logits (numpy) is excluded.
Timing is wall time around llama_decode (time.perf_counter); llama.cpp's own
perf counters (llama_perf_context) are reported alongside as a cross-check
(0 / n/a where this llama.cpp build does not fill them, seen for prefill).
Tokenisation, model loading and context creation are excluded.

Requires llama-cpp-python (scripts/install_llamacpp.sh) and numpy.
Usage: scripts/bench_llamacpp.py [MODEL.gguf] [--threads 2] [--runs 3] [--decode-contexts 128 512] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

TEXT = (
    "The history of the bicycle is a story of gradual refinement rather than "
    "sudden invention. Early machines had no pedals at all: riders pushed "
    "themselves along with their feet. Pedals were later attached directly to "
    "the front wheel, which encouraged makers to enlarge that wheel. The safety "
    "bicycle drove the rear wheel through a chain, and pneumatic tyres made the "
    "ride far more comfortable. Within a decade cycling had become a popular "
    "pastime in cities across Europe and North America. "
)


def prompt_tokens(llm, n):
    tokens = llm.tokenize(TEXT.encode(), add_bos=True, special=False)
    body = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    while len(tokens) < n:
        tokens += body
    return tokens[:n]


def perf(llm):
    import llama_cpp

    d = llama_cpp.llama_perf_context(llm.ctx)
    return {"t_p_eval_ms": d.t_p_eval_ms, "n_p_eval": d.n_p_eval,
            "t_eval_ms": d.t_eval_ms, "n_eval": d.n_eval}


def reset_perf(llm):
    import llama_cpp

    llama_cpp.llama_perf_context_reset(llm.ctx)


def last_logits(llm):
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def prefill_once(llm, tokens):
    llm.reset()
    reset_perf(llm)
    t0 = time.perf_counter()
    llm.eval(tokens)
    wall = time.perf_counter() - t0
    p = perf(llm)
    return len(tokens) / wall, p["n_p_eval"] / (p["t_p_eval_ms"] / 1e3) if p["t_p_eval_ms"] else 0.0


def decode_once(llm, prompt, n_gen):
    llm.reset()
    llm.eval(prompt)
    reset_perf(llm)
    tok = int(np.argmax(last_logits(llm)))
    wall = 0.0
    for _ in range(n_gen):
        t0 = time.perf_counter()
        llm.eval([tok])
        wall += time.perf_counter() - t0
        tok = int(np.argmax(last_logits(llm)))
    p = perf(llm)
    return n_gen / wall, p["n_eval"] / (p["t_eval_ms"] / 1e3) if p["t_eval_ms"] else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefill", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--decode-contexts", type=int, nargs="+", default=[128],
                    help="prompt lengths to decode after (decode at that context)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    max_prefill = max(args.prefill + args.decode_contexts)
    llm = Llama(model_path=args.model, n_ctx=max(max_prefill, max(args.decode_contexts) + args.gen) + 16,
                n_batch=max_prefill, n_ubatch=max_prefill, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=False, verbose=False)

    # Warm-up: faults in the weights and sizes the compute buffers (within
    # the context: the shortest decode context's prompt).
    prefill_once(llm, prompt_tokens(llm, max_prefill))
    decode_once(llm, prompt_tokens(llm, min(args.decode_contexts)), 8)

    rows = []
    for n in args.prefill:
        tokens = prompt_tokens(llm, n)
        runs = [prefill_once(llm, tokens) for _ in range(args.runs)]
        rows.append({"test": f"prefill {n}", "tokens": n,
                     "tok_per_s": statistics.median(r[0] for r in runs),
                     "tok_per_s_llama_perf": statistics.median(r[1] for r in runs),
                     "runs_tok_per_s": [round(r[0], 2) for r in runs]})
    for ctx in args.decode_contexts:
        prompt = prompt_tokens(llm, ctx)
        runs = [decode_once(llm, prompt, args.gen) for _ in range(args.runs)]
        rows.append({"test": f"decode {args.gen} @ctx {ctx}", "tokens": args.gen,
                     "tok_per_s": statistics.median(r[0] for r in runs),
                     "tok_per_s_llama_perf": statistics.median(r[1] for r in runs),
                     "runs_tok_per_s": [round(r[0], 2) for r in runs]})
    llm.close()

    result = {
        "engine": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "threads": args.threads,
        "runs": args.runs,
        "statistic": "median",
        "results": rows,
    }
    print(f"llama.cpp ({llama_cpp.__version__}) {result['model']}  threads={args.threads}  "
          f"median of {args.runs}")
    print(f"{'test':<22}{'tok/s':>10}{'tok/s (llama perf)':>20}")
    for r in rows:
        perf_col = f"{r['tok_per_s_llama_perf']:.1f}" if r["tok_per_s_llama_perf"] else "n/a"
        print(f"{r['test']:<22}{r['tok_per_s']:>10.1f}{perf_col:>20}")
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
