#!/usr/bin/env python3
"""Tokenizer start-up on a GGUF: DeepInfer against llama.cpp, same files, same run.

What is timed (wall clock, each load in a fresh process, the two sides
interleaved, median of --runs):
  deepinfer: build/bench_tokenizer --tokenizer FILE (no corpus): GgufFile::open
             plus Tokenizer::from_gguf, which is what the engine's "tokenizer
             ... loaded in X s" line covers.
  llama.cpp: llama_model_load_from_file(FILE) with vocab_only = true through
             llama-cpp-python's C API: GGUF metadata parse plus llama_vocab's
             load (the tensors are not read).
Process start, library loading and Python imports are outside both timings.
Both sides tokenize one sentence afterwards, printed as a sanity check.

Requires llama-cpp-python (scripts/install_llamacpp.sh) and a built
bench_tokenizer. --corpus is passed on to bench_tokenizer builds older than its
load-only mode, which needed one (then a one-line corpus is enough).

Usage: scripts/bench_tokenizer_load.py [FILE.gguf ...] [--runs 3] [--bench build/bench_tokenizer] [--corpus FILE]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = [os.path.join(REPO, "models", f)
                  for f in ("gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf")]
SENTENCE = "Hello world, this is a test."

# Runs in a child process: one vocab-only load, then prints "ms n_tokens ids...".
LLAMA_CHILD = r"""
import ctypes, sys, time
import llama_cpp as L
path = sys.argv[1].encode()
L.llama_backend_init()
params = L.llama_model_default_params()
params.vocab_only = True
t0 = time.perf_counter()
model = L.llama_model_load_from_file(path, params)
ms = (time.perf_counter() - t0) * 1000
assert model, "llama.cpp could not load the file"
vocab = L.llama_model_get_vocab(model)
text = sys.argv[2].encode()
ids = (L.llama_token * 64)()
n = L.llama_tokenize(vocab, text, len(text), ids, 64, False, False)
print(f"{ms:.1f} {L.llama_vocab_n_tokens(vocab)} " + " ".join(str(ids[i]) for i in range(n)))
L.llama_model_free(model)
"""


def deepinfer_load(bench, corpus, path):
    cmd = [bench, "--tokenizer", path] + (["--corpus", corpus, "--repeat", "1"] if corpus else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(re.search(r"load ([0-9.]+) ms", out).group(1)), out.strip()


def llamacpp_load(path):
    out = subprocess.run([sys.executable, "-c", LLAMA_CHILD, path, SENTENCE], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), int(out[1]), out[2:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bench", default=os.path.join(REPO, "build", "bench_tokenizer"))
    ap.add_argument("--corpus")
    ap.add_argument("--no-llamacpp", action="store_true", help="time DeepInfer only")
    a = ap.parse_args()
    for path in a.models:
        ours, theirs = [], []
        for _ in range(a.runs):
            ms, line = deepinfer_load(a.bench, a.corpus, path)
            ours.append(ms)
            if not a.no_llamacpp:
                ms, n_tokens, ids = llamacpp_load(path)
                theirs.append(ms)
        name = os.path.basename(path)
        print(f"{name}: deepinfer load median {statistics.median(ours):.1f} ms of {ours} ({line})")
        if theirs:
            print(f"{name}: llama.cpp vocab_only load median {statistics.median(theirs):.1f} ms of {theirs} "
                  f"({n_tokens} tokens; '{SENTENCE}' -> {' '.join(ids)})")


if __name__ == "__main__":
    main()
