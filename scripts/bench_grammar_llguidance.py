#!/usr/bin/env python3
"""Reference numbers for JSON-schema constrained decoding with llguidance.

For every schema of tests/data/json_schemas/schemas.jsonl:
  1. compile: llguidance.grammar_from("json_schema", ...) + LLMatcher(...)
     (timed together; a matcher in error state right after construction counts
     as rejected at compile time, with its error message);
  2. for each instance kind (minimal / rich, from scripts/json_instance.py):
     tokenize the instance text with the Llama 3.1 tokenizer (HF `tokenizers`,
     no special tokens), then on a fresh matcher, for every token: time the
     token-mask computation, then consume the token (a failed consume ends the
     run as "failed"; a token that is consumed although the mask left it out
     is counted apart, see mask_excluded_tokens); a final mask is computed
     after the last token (the step where the model must be allowed to stop)
     and must allow EOS, and the matcher must be accepting.
  Both llguidance option sets are run: "default" (grammar_from defaults, which
  reject unimplemented keywords such as uniqueItems) and "lenient"
  ({"lenient": true}: such keywords are ignored).

Mask time is one LLMatcher.unsafe_compute_mask_ptr() call (what
llguidance.numpy.fill_next_token_bitmask() does, minus its asserts) into a
preallocated int32 bitmask, timed with time.perf_counter_ns(); it includes the
Python call overhead (~0.1-0.3 us). One thread (RAYON_NUM_THREADS=1 is set and
nothing parallel is called).

Compile time includes lexer/parser construction but llguidance builds parts of
its lexer lazily, so the first mask of each run is also reported on its own
("first_mask").

Usage:
  pip install llguidance tokenizers numpy
  python3 scripts/bench_grammar_llguidance.py --out /tmp/llg.json
Options: --schemas PATH, --tokenizer-dir DIR (tokenizer.json[.xz] and
tokenizer_config.json), --kinds minimal,rich, --configs default,lenient,
--limit N.
"""
import argparse
import collections
import gc
import json
import lzma
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import llguidance  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import json_instance  # noqa: E402

DEFAULT_SCHEMAS = os.path.join(ROOT, "tests", "data", "json_schemas", "schemas.jsonl")
DEFAULT_TOKDIR = os.path.join(ROOT, "..", "shared", "tokenizers", "llama3_1")


def pct(xs, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary(xs, scale):
    if not xs:
        return None
    return {
        "n": len(xs),
        "p50": round(pct(xs, 50) * scale, 3),
        "p90": round(pct(xs, 90) * scale, 3),
        "p99": round(pct(xs, 99) * scale, 3),
        "mean": round(sum(xs) / len(xs) * scale, 3),
        "max": round(max(xs) * scale, 3),
    }


def load_tokenizer_json(tokdir):
    plain = os.path.join(tokdir, "tokenizer.json")
    if os.path.exists(plain):
        with open(plain, encoding="utf-8") as f:
            return f.read()
    # decompress to a temp file first (as asked), then read it back
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as tmp:
        with lzma.open(plain + ".xz") as src:
            tmp.write(src.read())
        path = tmp.name
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    finally:
        os.unlink(path)


def reason_key(msg):
    """Short bucket for an error message."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    if not lines:
        return "(empty)"
    first = lines[0]
    if first.startswith("regex parse error"):
        detail = next((ln for ln in lines if ln.startswith("error:")), "")
        return f"regex parse error: {detail[6:].strip()}"[:160]
    for cut in (" <state>", " at ", " in schema", ": {", ": (And"):
        i = first.find(cut)
        if i > 20:
            first = first[:i]
    return first[:160]


def run_config(name, options, rows, kinds, ll_tok, hf_tok, eos_id, repeat):
    """Compile every schema under one set of llguidance JSON options and drive
    the matchers along the instances; returns the summary dict."""
    n_words = (ll_tok.vocab_size + 31) // 32
    bitmask = np.zeros(n_words, dtype=np.int32)
    mask_u32 = bitmask.view(np.uint32)
    ptr, nbytes = bitmask.ctypes.data, bitmask.nbytes

    def allowed(tok):
        return (int(mask_u32[tok >> 5]) >> (tok & 31)) & 1 == 1

    def drive(m, ids):
        """Mask + consume along ids, then a final mask that must allow EOS.
        Returns (step times in s, failure dict or None, tokens accepted
        though outside the mask, matcher)."""
        times = []
        failed = None
        excluded = 0
        for step, tok in enumerate(ids + [None]):
            t1 = time.perf_counter_ns()
            m.unsafe_compute_mask_ptr(ptr, nbytes)
            times.append((time.perf_counter_ns() - t1) * 1e-9)
            if tok is None:
                if not allowed(eos_id):
                    failed = {"step": step, "reason": "EOS not in final mask"}
                break
            in_mask = allowed(tok)
            if not m.consume_token(tok):
                err = m.get_error() or "consume_token failed"
                failed = {"step": step, "reason": reason_key(err),
                          "error": " ".join(err.strip().split())[:300]}
                break
            if not in_mask:
                # llguidance accepted the token although its mask left it out:
                # where bytes are forced, the mask offers only the canonical
                # token for them (a deliberate restriction)
                excluded += 1
        return times, failed, excluded, m

    compile_s = []
    rejected = collections.Counter()
    rejected_ids = []
    per_kind = {k: {"mask_s": [], "first_mask_s": [], "tokens_per_instance": [],
                    "no_instance": [], "failed": [], "mask_excluded": [],
                    "ok": 0} for k in kinds}
    per_schema = []

    for i, row in enumerate(rows):
        sid, schema = row["id"], row["schema"]
        schema_text = json.dumps(schema)

        def compile_once():
            t0 = time.perf_counter()
            if options is None:
                g = llguidance.grammar_from("json_schema", schema_text)
            else:
                g = llguidance.LLMatcher.grammar_from_json_schema(schema_text, overrides=options)
            mm = llguidance.LLMatcher(ll_tok, g, log_level=0)
            return g, mm, time.perf_counter() - t0

        grammar, matcher, dt = compile_once()
        if not matcher.is_error() and repeat > 1:
            dt = statistics.median([dt] + [compile_once()[2] for _ in range(repeat - 1)])
        rec = {"id": sid, "compile_ms": round(dt * 1e3, 3)}
        if matcher.is_error():
            err = matcher.get_error()
            rejected[reason_key(err)] += 1
            rejected_ids.append({"id": sid, "error": " ".join(err.strip().split())[:300]})
            rec["rejected"] = True
            per_schema.append(rec)
            continue
        compile_s.append(dt)
        for kind in kinds:
            K = per_kind[kind]
            text = json_instance.instance_text(schema, rich=(kind == "rich"))
            if text is None:
                K["no_instance"].append(sid)
                rec[kind] = "no_instance"
                continue
            ids = hf_tok.encode(text, add_special_tokens=False).ids
            # the first kind reuses the freshly compiled matcher; every other
            # run gets its own fresh matcher, so that every run starts cold
            runs = []
            for r in range(repeat):
                fresh = matcher if (kind == kinds[0] and r == 0) else \
                    llguidance.LLMatcher(ll_tok, grammar, log_level=0)
                runs.append(drive(fresh, ids))
            times, failed, excluded, m = runs[0]
            if repeat > 1:
                # per-step median over the repeats (runs are deterministic, so
                # they have the same number of steps)
                n = min(len(x[0]) for x in runs)
                times = [statistics.median(x[0][j] for x in runs) for j in range(n)]
            if failed is None and not m.is_accepting():
                failed = {"step": len(ids), "reason": "matcher not accepting at end"}
            K["first_mask_s"].append(times[0])
            K["mask_s"].extend(times)
            K["tokens_per_instance"].append(len(ids))
            if excluded:
                K["mask_excluded"].append({"id": sid, "tokens": excluded})
            if failed is None:
                K["ok"] += 1
            else:
                failed.update({"id": sid, "of": len(ids),
                               "prefix": hf_tok.decode(ids[:failed["step"]])[-60:]})
                K["failed"].append(failed)
            rec[kind] = {"tokens": len(ids), "ok": failed is None,
                         "mask_us_mean": round(sum(times) / len(times) * 1e6, 2)}
        per_schema.append(rec)
        if (i + 1) % 100 == 0:
            print(f"  [{name}] {i + 1}/{len(rows)} schemas", file=sys.stderr)

    out = {
        "json_options": options or "defaults: grammar_from('json_schema', ...)",
        "schemas": len(rows),
        "compiled": len(compile_s),
        "rejected_at_compile": sum(rejected.values()),
        "rejected_reasons": dict(rejected.most_common()),
        "rejected_schemas": rejected_ids,
        "compile_ms": summary(compile_s, 1e3),
        "kinds": {},
        "per_schema": per_schema,
    }
    for kind, K in per_kind.items():
        fails = collections.Counter(reason_key(f["reason"]) for f in K["failed"])
        out["kinds"][kind] = {
            "instances_run": len(K["tokens_per_instance"]),
            "instances_ok": K["ok"],
            "no_instance": len(K["no_instance"]),
            "no_instance_ids": K["no_instance"],
            "failed": len(K["failed"]),
            "failed_reasons": dict(fails.most_common()),
            "failed_runs": K["failed"],
            "instances_with_mask_excluded_tokens": len(K["mask_excluded"]),
            "mask_excluded_tokens": sum(x["tokens"] for x in K["mask_excluded"]),
            "tokens_total": sum(K["tokens_per_instance"]),
            "mask_steps_total": len(K["mask_s"]),
            "tokens_per_instance": summary(K["tokens_per_instance"], 1),
            "mask_us": summary(K["mask_s"], 1e6),
            "first_mask_us": summary(K["first_mask_s"], 1e6),
        }
    return out


def main():
    ap = argparse.ArgumentParser(description="llguidance JSON-schema compile / mask benchmark")
    ap.add_argument("--schemas", default=DEFAULT_SCHEMAS)
    ap.add_argument("--tokenizer-dir", default=DEFAULT_TOKDIR)
    ap.add_argument("--out", required=True, help="write the JSON summary here")
    ap.add_argument("--kinds", default="minimal,rich",
                    help="instance kinds, comma separated: minimal, rich")
    ap.add_argument("--configs", default="default,lenient",
                    help="llguidance JSON option sets, comma separated: default "
                         "(grammar_from defaults) and/or lenient ({'lenient': true}: "
                         "unimplemented keywords are ignored instead of rejected)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N schemas")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per schema/instance (each on a fresh matcher); compile "
                         "time and every mask step take the median over the runs")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in ("minimal", "rich"):
            sys.exit(f"unknown kind {k}")
    configs = {"default": None, "lenient": {"lenient": True}}
    chosen = [c for c in args.configs.split(",") if c]
    for c in chosen:
        if c not in configs:
            sys.exit(f"unknown config {c}")

    with open(os.path.join(args.tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tok_cfg = json.load(f)
    tok_json = load_tokenizer_json(args.tokenizer_dir)
    hf_tok = Tokenizer.from_str(tok_json)
    eos = tok_cfg.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    eos_id = hf_tok.token_to_id(eos)
    t0 = time.perf_counter()
    ll_tok = llguidance.LLTokenizer(tok_json, eos_token=eos_id)
    tok_build_s = time.perf_counter() - t0

    rows = []
    with open(args.schemas, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    if args.limit:
        rows = rows[:args.limit]

    result = {
        "engine": "llguidance",
        "llguidance_version": llguidance.__version__,
        "llguidance_build": llguidance.get_version(),
        "tokenizers_version": getattr(sys.modules["tokenizers"], "__version__", "?"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "threads": 1,
        "repeat": args.repeat,
        "tokenizer": os.path.basename(os.path.normpath(args.tokenizer_dir)),
        "vocab_size": ll_tok.vocab_size,
        "eos_token_id": eos_id,
        "tokenizer_build_s": round(tok_build_s, 3),
        "schemas_file": os.path.relpath(os.path.abspath(args.schemas), ROOT),
        "schemas": len(rows),
        "notes": [
            "compile = grammar_from/grammar_from_json_schema + LLMatcher(); "
            "llguidance builds some lexer state lazily, see first_mask_us",
            "mask = one unsafe_compute_mask_ptr() into a preallocated bitmask, "
            "timed with perf_counter_ns (includes Python call overhead)",
            "mask steps = tokens + 1 per instance (the last step must allow EOS)",
            "with repeat > 1 every compile and every mask step is the median over "
            "that many cold runs (fresh LLMatcher each); Python GC is disabled while timing",
            "mask_excluded_tokens: tokens consume_token() accepted although the "
            "mask computed just before left them out (llguidance offers only the "
            "canonical token where bytes are forced)",
        ],
        "configs": {},
    }
    for c in chosen:
        gc.disable()
        try:
            result["configs"][c] = run_config(c, configs[c], rows, kinds, ll_tok, hf_tok,
                                              eos_id, args.repeat)
        finally:
            gc.enable()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    _print_summary(result)


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _print_summary(r):
    print(f"llguidance {r['llguidance_version']} ({r['llguidance_build']}), "
          f"tokenizer {r['tokenizer']} vocab {r['vocab_size']}, 1 thread, {r['cpu']}")
    for name, c in r["configs"].items():
        print(f"== config {name}: {c['json_options']}")
        print(f"schemas {c['schemas']}: compiled {c['compiled']}, "
              f"rejected at compile {c['rejected_at_compile']}")
        for reason, n in c["rejected_reasons"].items():
            print(f"  {n:4d}  {reason}")
        cm = c["compile_ms"]
        if cm:
            print(f"compile ms: p50 {cm['p50']}  p90 {cm['p90']}  p99 {cm['p99']}  "
                  f"mean {cm['mean']}  max {cm['max']}")
        for kind, k in c["kinds"].items():
            print(f"[{kind}] instances run {k['instances_run']}: ok {k['instances_ok']}, "
                  f"failed {k['failed']}, no instance {k['no_instance']}; "
                  f"tokens outside mask but accepted {k['mask_excluded_tokens']} "
                  f"(in {k['instances_with_mask_excluded_tokens']} instances)")
            for reason, n in k["failed_reasons"].items():
                print(f"  {n:4d}  {reason}")
            m, fm, tp = k["mask_us"], k["first_mask_us"], k["tokens_per_instance"]
            if m:
                print(f"  tokens {k['tokens_total']} (per instance p50 {tp['p50']}, "
                      f"max {tp['max']}), mask steps {k['mask_steps_total']}")
                print(f"  mask us: p50 {m['p50']}  p90 {m['p90']}  p99 {m['p99']}  "
                      f"mean {m['mean']}  max {m['max']}")
                print(f"  first mask us: p50 {fm['p50']}  p99 {fm['p99']}  max {fm['max']}")


if __name__ == "__main__":
    main()
