#!/usr/bin/env python3
"""Speculative decoding benchmark: output tokens/s with and without drafting.

For each model, workload and batch size, runs `deepinfer generate` on the
same greedy requests with every configuration (no speculation, n-gram and
suffix drafting with fixed K and with the dynamic verify length) and reports
generated tokens/s (median of --repeats runs), the mean accepted length per
verification (accepted drafts + the token sampled after them), the mean drafts
verified per verification, and the share of requests whose output equals the
run without speculation.

Workloads:
  grounded  the answer repeats spans of the prompt: edit a given function,
            quote sentences of a given document;
  chat      open-ended questions.

  scripts/bench_spec.py --deepinfer build/deepinfer --device cpu --batches 1 4
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

# name -> (--speculative-config, extra flags)
CONFIGS = {
    "none": (None, []),
    "ngram-k5": ({"method": "ngram", "num_speculative_tokens": 5, "dynamic": False}, []),
    "ngram-dyn": ({"method": "ngram", "num_speculative_tokens": 5, "dynamic": True}, []),
    "suffix-k5": ({"method": "suffix", "num_speculative_tokens": 5, "dynamic": False}, []),
    "suffix-dyn": ({"method": "suffix", "num_speculative_tokens": 5, "dynamic": True}, []),
    # Drafting on the engine thread only (the default spreads a large batch over threads).
    "suffix-dyn-1t": ({"method": "suffix", "num_speculative_tokens": 5, "dynamic": True, "drafting_threads": 1}, []),
    # Verify steps without CUDA graphs, to see what the graphs buy.
    "ngram-k5-eager": ({"method": "ngram", "num_speculative_tokens": 5, "dynamic": False}, ["--enforce-eager"]),
}

WORDS = ("alpha beta gamma delta omega river stone cloud lamp paper engine bridge garden signal "
         "window copper harbor lantern meadow pocket summit timber valley").split()


def code_prompt(rng):
    name = rng.choice(WORDS) + "_" + rng.choice(WORDS)
    var = rng.choice(["total", "count", "acc", "value", "result"])
    lines = [f"def {name}(items, limit):", f"    {var} = 0"]
    for i in range(rng.randint(6, 10)):
        w = rng.choice(WORDS)
        lines.append(f"    if items[{i}] > limit:  # {w}")
        lines.append(f"        {var} += items[{i}] * {rng.randint(2, 9)}")
    lines.append(f"    return {var}")
    code = "\n".join(lines)
    new = var + "_sum"
    return (f"Here is a Python function:\n```python\n{code}\n```\nRename the variable `{var}` to `{new}` "
            f"and write out the complete updated function.")


def quote_prompt(rng):
    sentences = []
    for _ in range(rng.randint(8, 12)):
        a, b, c = rng.sample(WORDS, 3)
        sentences.append(f"The {a} near the {b} was painted {rng.choice(['red', 'blue', 'green'])} "
                         f"by the {c} keeper in {rng.randint(1800, 2020)}.")
    doc = " ".join(sentences)
    key = rng.choice(WORDS)
    return (f"Document:\n{doc}\n\nCopy, word for word, every sentence of the document. "
            f"Then say which ones mention the {key}.")


def chat_prompt(rng):
    a, b = rng.sample(WORDS, 2)
    return rng.choice([f"Write a short story about a {a} that finds a {b}.",
                       f"Explain to a child how a {a} works.",
                       f"Give me five ideas for a weekend trip to a {a} {b}.",
                       f"What are the pros and cons of living near a {a}?"])


def workload(kind, n, max_tokens, seed, plain=False):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if kind == "grounded":
            text = code_prompt(rng) if i % 2 == 0 else quote_prompt(rng)
        else:
            text = chat_prompt(rng)
        # A model without a chat template gets the request as plain text.
        body = {"prompt": text + "\n\n"} if plain else {"messages": [{"role": "user", "content": text}]}
        out.append({**body, "max_tokens": max_tokens, "temperature": 0})
    return out


def run_one(args, model, inputs_path, batch, config):
    out_path = inputs_path + ".out.jsonl"
    cmd = [args.deepinfer, "generate", "--input", inputs_path, "--output", out_path, "--max-num-seqs", str(batch),
           "--device", args.device, "-q"]
    if model:
        cmd += ["--model", model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    spec, flags = config
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    cmd += flags + args.extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    m = re.search(r"([0-9.]+) generated tok/s", p.stderr)
    if not m:
        sys.exit(f"no summary line in:\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(out_path)]
    t = re.search(r"steps: (\d+) \((\d+) as graphs(?:, (\d+) with sequences padded to the longest)?\), "
                  r"device busy ([0-9.]+) ms,\s+idle ([0-9.]+) ms", p.stderr)
    timeline = {"steps": int(t.group(1)), "graph_steps": int(t.group(2)), "padded_steps": int(t.group(3) or 0),
                "busy_ms": float(t.group(4)), "idle_ms": float(t.group(5))} if t else {}
    w = re.search(r"speculated in (\d+) of (\d+) windows \((\d+) steps without", p.stderr)
    if w and t:
        timeline["windows"] = (int(w.group(1)), int(w.group(2)))
        timeline["unswitched_steps"] = int(w.group(3))
    c = re.search(r"(\d+) graphs captured in ([0-9.]+) ms", p.stderr)
    if c and t:
        timeline["captures"] = (int(c.group(1)), float(c.group(2)))
    k = re.search(r"step time \(ms\) at 1\.\.\d+ tokens:([0-9. ]+); drafting overhead ([0-9.]+) ms", p.stderr)
    if k and t:
        timeline["small_step_ms"] = [float(x) for x in k.group(1).split()]
        timeline["drafting_overhead_ms"] = float(k.group(2))
    # What the proposers drafted against what the verify-length choice kept,
    # and the step-time curve's measured bins (tokens -> ms) it chose with.
    d = re.search(r"(\d+) drafts proposed, (\d+) verified, (\d+) accepted", p.stderr)
    if d and t:
        timeline["proposed"], timeline["verified"], timeline["accepted"] = (int(x) for x in d.groups())
    pts = re.search(r"measured step times \(tokens:ms\):([0-9.: ]+)", p.stderr)
    if pts and t:
        timeline["measured_step_ms"] = [[int(a), float(b)] for a, b in (x.split(":") for x in pts.group(1).split())]
    return float(m.group(1)), rows, timeline


def idle_text(t):
    """Steps, graph share and device idle share of the last run."""
    if not t:
        return ""
    busy, idle = t["busy_ms"], t["idle_ms"]
    text = (f"steps {t['steps']} ({t['graph_steps']} graphs, {t.get('padded_steps', 0)} padded), device idle {idle / max(busy + idle, 1e-9):.0%}, "
            f"{(busy + idle) / max(t['steps'], 1):.2f} ms/step")
    if "captures" in t:
        text += f", {t['captures'][0]} captures {t['captures'][1]:.0f} ms"
    if "windows" in t:
        text += f", speculated in {t['windows'][0]}/{t['windows'][1]} windows"
        if t.get("unswitched_steps"):
            text += f" + {t['unswitched_steps']} steps unswitched"
    if "small_step_ms" in t:
        text += (f", curve {'/'.join(f'{x:.2f}' for x in t['small_step_ms'])} ms"
                 f" + {t['drafting_overhead_ms']:.2f} drafting")
    if t.get("proposed"):
        text += f", verified {t['verified'] / t['proposed']:.0%} of {t['proposed']} drafted"
    if t.get("measured_step_ms"):
        text += ", measured " + " ".join(f"{n}:{ms:.2f}" for n, ms in t["measured_step_ms"])
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deepinfer", default="build/deepinfer")
    ap.add_argument("--models", nargs="*", default=[""], help="model paths ('' = built-in default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--workloads", nargs="*", default=["grounded", "chat"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--configs", nargs="*", default=[c for c in CONFIGS if not c.endswith("-eager")])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-requests", type=int, default=1,
                    help="at least this many requests per run, --batches of them at once (a batch-1 run of one "
                         "request is mostly one-time work: graph captures, the first measurements)")
    ap.add_argument("--plain", action="store_true", help="plain prompts instead of chat messages")
    ap.add_argument("--draft-model", help="adds draft-k5 and draft-dyn: speculation with this draft model")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("extra", nargs="*", help="more flags for deepinfer generate (after --)")
    args = ap.parse_args()
    if args.draft_model:
        for name, dynamic in (("draft-k5", False), ("draft-dyn", True)):
            CONFIGS[name] = ({"method": "draft_model", "num_speculative_tokens": 5, "dynamic": dynamic,
                              "model": args.draft_model}, [])
            if name not in args.configs:
                args.configs.append(name)
    results = []
    tmp = tempfile.mkdtemp(prefix="bench_spec_")
    for model in args.models:
        for kind in args.workloads:
            for batch in args.batches:
                inputs = workload(kind, max(batch, args.min_requests), args.max_tokens, seed=batch, plain=args.plain)
                path = os.path.join(tmp, f"{kind}_{batch}.jsonl")
                with open(path, "w") as f:
                    for row in inputs:
                        f.write(json.dumps(row) + "\n")
                baseline_texts = None
                for name in args.configs:
                    rates, rows, timeline = [], None, {}
                    for _ in range(args.repeats):
                        rate, rows, timeline = run_one(args, model, path, batch, CONFIGS[name])
                        rates.append(rate)
                    texts = [r["text"] for r in rows]
                    if name == "none":
                        baseline_texts = texts
                    ver = sum(r.get("verifications", 0) for r in rows)
                    drafts = sum(r.get("verified_draft_tokens", 0) for r in rows)
                    acc = sum(r.get("accepted_draft_tokens", 0) for r in rows)
                    same = (sum(a == b for a, b in zip(texts, baseline_texts)) / len(texts)
                            if baseline_texts else float("nan"))
                    res = {"model": os.path.basename(model) or "default", "workload": kind, "batch": batch,
                           "config": name, "tok_s": statistics.median(rates), "runs": rates,
                           "accepted_len": (acc + ver) / ver if ver else 0.0,
                           "verified_per_step": drafts / ver if ver else 0.0,
                           "same_as_none": same, "timeline": timeline,
                           "generated": sum(r["completion_tokens"] for r in rows)}
                    results.append(res)
                    base = next((r["tok_s"] for r in results if r["model"] == res["model"] and
                                 r["workload"] == kind and r["batch"] == batch and r["config"] == "none"), None)
                    speedup = res["tok_s"] / base if base else float("nan")
                    print(f"{res['model']:>28} {kind:>8} b={batch:<4} {name:>10}: {res['tok_s']:9.1f} tok/s "
                          f"({speedup:4.2f}x)  accepted len {res['accepted_len']:4.2f}  verified/step "
                          f"{res['verified_per_step']:4.2f}  same as none {same:.0%}  {idle_text(timeline)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
