#!/usr/bin/env python3
"""Tokenizer speed, Hugging Face side (the C++ side is bench/bench_tokenizer.cpp).

  python3 scripts/bench_tokenizer_hf.py --make-corpus /tmp/tok_corpus.jsonl   # writes the shared corpus
  RAYON_NUM_THREADS=1 python3 scripts/bench_tokenizer_hf.py --corpus /tmp/tok_corpus.jsonl \
      --tokenizer /tmp/tok/qwen3.json ...

Corpus: JSON lines {"text": ...}, each a ~2-8 KB document made of the reference
texts of scripts/gen_tokenizer_reference.py (prose in many scripts, code, numbers,
whitespace, emoji), shuffled and replicated to ~6 MB. Both sides encode one
document per call, without special tokens, on one thread, and report MB/s of
UTF-8 input; the load time of each tokenizer.json is reported as well.
"""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make_corpus(path, target_bytes=6_000_000):
    from gen_tokenizer_reference import texts
    items = [t for t in texts() if t]
    rng = random.Random(7)
    docs, total = [], 0
    while total < target_bytes:
        doc = "\n".join(rng.choice(items) for _ in range(rng.randint(10, 40)))
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    print(f"corpus: {len(docs)} documents, {total / 1e6:.2f} MB -> {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-corpus")
    ap.add_argument("--corpus")
    ap.add_argument("--tokenizer", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    if a.make_corpus:
        make_corpus(a.make_corpus)
        return
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer
    docs = [json.loads(l)["text"] for l in open(a.corpus, encoding="utf-8")]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    for path in a.tokenizer:
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        load = time.perf_counter() - t0
        best = float("inf")
        ntok = 0
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            ntok = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
            best = min(best, time.perf_counter() - t0)
        print(f"hf {os.path.basename(path)}: load {load * 1000:.0f} ms, encode {nbytes / best / 1e6:.2f} MB/s "
              f"({ntok} tokens, {nbytes / 1e6:.2f} MB, best of {a.repeat})")


if __name__ == "__main__":
    main()
