#!/usr/bin/env python3
"""Decode speed under a JSON schema vs unconstrained, same model, same run
(docs/benchmarks.md, "Structured output").

Each configuration runs `deepinfer generate` over `batch` identical-length
requests (--max-num-seqs batch) and reports the decode rate: generated tokens
after the first, over the decode window (first token of the earliest request
to the end of the last), so prefill and the schema's one-time compilation are
outside it. Medians of --repeats runs, alternating configurations.

The schema is a JSON object whose one string property must match
^[a-z ]+$: an output a random-weights model keeps extending (few tokens close
the string), so constrained and unconstrained runs decode about as many
tokens; the runs report how many they did.

  scripts/bench_structured.py --deepinfer build/deepinfer --model DIR --device cuda --batches 1 64
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "pattern": "^[a-z ]+$"}},
          "required": ["title"], "additionalProperties": False}


def run(args, batch, constrained, workdir):
    path = os.path.join(workdir, f"in_{batch}_{int(constrained)}.jsonl")
    with open(path, "w") as f:
        for i in range(batch):
            line = {"prompt": f"Request {i}: write a title for a short story about rivers.", "temperature": 0,
                    "max_tokens": args.max_tokens}
            if constrained:
                line["response_format"] = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
            else:
                line["ignore_eos"] = True
            f.write(json.dumps(line) + "\n")
    out = path + ".out"
    cmd = [args.deepinfer, "generate", "--input", path, "--output", out, "--max-num-seqs", str(batch), "-q"]
    if args.model:
        cmd += ["--model", args.model]
    if args.device:
        cmd += ["--device", args.device]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(out)]
    start = min(r["time_to_first_token_s"] for r in rows)
    end = max(r["latency_s"] for r in rows)
    tokens = sum(r["completion_tokens"] - 1 for r in rows)
    if constrained:
        for r in rows:
            if r["finish_reason"] == "stop":
                json.loads(r["text"])  # a finished output must parse
    return {"tok_s": tokens / max(end - start, 1e-9), "mean_tokens": statistics.mean(r["completion_tokens"] for r in rows),
            "stopped": sum(r["finish_reason"] == "stop" for r in rows)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", default="build/deepinfer")
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for batch in args.batches:
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for constrained in (False, True):
                    runs[constrained].append(run(args, batch, constrained, workdir))
            plain = statistics.median(r["tok_s"] for r in runs[False])
            schema = statistics.median(r["tok_s"] for r in runs[True])
            res = {"batch": batch, "plain_tok_s": plain, "schema_tok_s": schema, "overhead": 1 - schema / plain,
                   "schema_mean_tokens": statistics.mean(r["mean_tokens"] for r in runs[True]),
                   "schema_stopped": sum(r["stopped"] for r in runs[True]), "runs": {str(k): v for k, v in runs.items()}}
            results.append(res)
            print(f"[structured] batch {batch}: unconstrained {plain:.1f} tok/s, JSON schema {schema:.1f} tok/s "
                  f"({res['overhead']:+.1%} overhead); constrained outputs averaged {res['schema_mean_tokens']:.0f} "
                  f"tokens, {res['schema_stopped']} of {batch * args.repeats} ended before max_tokens", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
