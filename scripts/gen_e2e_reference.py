#!/usr/bin/env python3
"""Generates end-to-end reference data for DeepInfer from llama.cpp.

For each real model in models/ it records, for a fixed set of prompts, the
token ids llama.cpp's tokenizer produces, the last-position logits over the
whole vocabulary and a 64-token greedy continuation.  For SmolLM2 it also
records last-position logits from an independent float64 numpy forward pass
over weights dequantised with the `gguf` package, which is free of
llama.cpp's 8-bit activation quantisation and therefore tells how close a
faithful implementation must be to either reference.

Requires llama-cpp-python (scripts/install_llamacpp.sh), gguf and numpy.
Output (tests/data/e2e/): <key>.json index, <key>_logits.f16 and, for
SmolLM2, smollm2_f32_logits.f32.  The format is described in FORMAT below and
written into each JSON index.

Usage: scripts/gen_e2e_reference.py [--models-dir DIR] [--out DIR] [--only KEY]
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# llama-cpp-python vendors llama.cpp as a git submodule; its commit is the
# submodule HEAD recorded in the sdist (.git/modules/vendor/llama.cpp/HEAD).
LLAMA_CPP_COMMITS = {"0.3.36": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}

# Logits do not depend on the thread count (ggml gives each output element to
# one thread; checked bit-identical for 1 vs 2 threads), so --threads only
# changes speed.  On an oversubscribed machine 1 thread avoids ggml's
# spin-waiting barriers, which made 2 threads ~50x slower.
DEFAULT_THREADS = 2
N_CTX = 1024
N_BATCH = 512
N_CONTINUATION = 64

FORMAT = (
    "Logits files are raw little-endian arrays without header, row-major "
    "[n_prompts][vocab_size], rows in the order of 'prompts'; the row for a "
    "prompt holds the logits after evaluating all of its 'tokens' "
    "(last position). dtype is given by each file's 'dtype' entry."
)

MODELS = {
    "smollm2": {
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "chat": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        "numpy_reference": True,
    },
    "gemma3": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "chat": "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
        "numpy_reference": False,
    },
}

PARAGRAPH = (
    "The history of the bicycle is a story of gradual refinement rather than "
    "sudden invention. Early machines in the nineteenth century had no pedals "
    "at all: riders pushed themselves along with their feet, much like a child "
    "on a balance bike today. Pedals were later attached directly to the front "
    "wheel, which encouraged makers to enlarge that wheel so that a single turn "
    "of the cranks carried the rider further. The result was the high wheeler, "
    "fast but dangerous, since a sudden stop could throw the rider over the "
    "handlebars. The so-called safety bicycle solved this problem by driving "
    "the rear wheel through a chain, allowing two wheels of equal, modest size. "
    "Pneumatic tyres, introduced shortly afterwards, made the ride far more "
    "comfortable, and within a decade cycling had become a popular pastime in "
    "cities across Europe and North America. Summarise the main steps in this "
    "development in two sentences."
)

CODE = (
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "    a, b = 0, 1\n"
    "    for _ in range(n - 1):\n"
    "        a, b = b, a + b\n"
    "    return b\n"
    "\n"
    "\n"
    "def is_prime(n):\n"
)

# Short question, chat-formatted prompt, ~200-token paragraph, code,
# non-English text and numbers; the chat entry is wrapped in the model's own
# template.
PROMPTS = [
    ("question", "What is the capital of France?", False),
    ("chat", "Give me three tips for staying focused while studying.", True),
    ("paragraph", PARAGRAPH, False),
    ("code", CODE, False),
    ("non_english", "Der schnelle braune Fuchs springt über den faulen Hund, "
                    "und danach trinkt er einen Kaffee in München.", False),
    ("numbers", "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987,"
                " 1597. In 2024 the price rose from $3.14 to $27.50 (+775.8%),", False),
]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Independent numpy forward pass for GGUF "llama" architecture models.


class NumpyLlama:
    """Float64 Llama forward over dequantised GGUF weights.

    GGUF stores Q/K projections permuted so that RoPE rotates adjacent pairs
    (2i, 2i+1) of each head; that is the convention implemented here.
    """

    def __init__(self, path):
        import gguf

        reader = gguf.GGUFReader(path)

        def meta(key):
            return reader.fields[key].contents()

        arch = meta("general.architecture")
        if arch != "llama":
            raise ValueError(f"numpy reference supports llama only, got {arch}")
        self.n_layer = int(meta("llama.block_count"))
        self.n_head = int(meta("llama.attention.head_count"))
        self.n_head_kv = int(meta("llama.attention.head_count_kv"))
        self.n_embd = int(meta("llama.embedding_length"))
        self.eps = float(meta("llama.attention.layer_norm_rms_epsilon"))
        self.freq_base = float(meta("llama.rope.freq_base"))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(meta("llama.rope.dimension_count"))
        if self.n_rot != self.head_dim:
            raise ValueError("partial RoPE is not supported by this reference")

        self.w = {}
        for t in reader.tensors:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
            # GGUF shapes list the innermost dimension first; numpy rows are
            # output features, columns input features.
            self.w[t.name] = np.asarray(arr, dtype=np.float64).reshape(
                [int(d) for d in reversed(t.shape)])
        self.tied_output = "output.weight" not in self.w

    def _rms_norm(self, x, weight):
        var = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(var + self.eps) * weight

    def _rope(self, x, positions):
        # x: [T, heads, head_dim]; rotate pairs (2i, 2i+1).
        half = self.head_dim // 2
        inv_freq = self.freq_base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)
        angles = positions[:, None].astype(np.float64) * inv_freq[None, :]
        cos = np.cos(angles)[:, None, :]
        sin = np.sin(angles)[:, None, :]
        x0 = x[..., 0::2]
        x1 = x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def last_logits(self, tokens):
        w = self.w
        n = len(tokens)
        hd = self.head_dim
        group = self.n_head // self.n_head_kv
        positions = np.arange(n)
        h = w["token_embd.weight"][np.asarray(tokens)]
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            x = self._rms_norm(h, w[p + "attn_norm.weight"])
            q = (x @ w[p + "attn_q.weight"].T).reshape(n, self.n_head, hd)
            k = (x @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, hd)
            v = (x @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, hd)
            q = self._rope(q, positions)
            k = self._rope(k, positions)
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, self.n_embd)
            h = h + attn @ w[p + "attn_output.weight"].T
            x = self._rms_norm(h, w[p + "ffn_norm.weight"])
            gate = x @ w[p + "ffn_gate.weight"].T
            up = x @ w[p + "ffn_up.weight"].T
            act = gate / (1.0 + np.exp(-gate)) * up
            h = h + act @ w[p + "ffn_down.weight"].T
        x = self._rms_norm(h[-1], w["output_norm.weight"])
        out_w = w["token_embd.weight"] if self.tied_output else w["output.weight"]
        return out_w @ x


# ---------------------------------------------------------------------------
# llama.cpp


def llama_cpp_info(n_threads):
    import llama_cpp

    version = llama_cpp.__version__
    return {
        "llama_cpp_python": version,
        "llama_cpp_commit": LLAMA_CPP_COMMITS.get(version, "unknown"),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "n_threads": n_threads,
        "n_ctx": N_CTX,
        "n_batch": N_BATCH,
        "n_ubatch": N_BATCH,
        "prompt_evaluation": "whole prompt in one llama_decode batch",
        "continuation": "greedy argmax over llama.cpp logits, one token per llama_decode, "
                        "no penalties, EOS ignored",
    }


def last_logits(llm):
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)


def run_llama_cpp(path, prompts, n_threads):
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
                n_threads=n_threads, n_threads_batch=n_threads, logits_all=False,
                verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    add_bos_meta = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llm.token_bos()
    results = []
    for name, text in prompts:
        # add_bos=True lets llama.cpp decide from the model's metadata whether
        # a BOS is actually prepended; special=True parses chat-control tokens
        # as llama-cli does for prompts.
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        if len(tokens) > N_BATCH:
            raise ValueError(f"prompt {name} longer than n_batch")
        llm.reset()
        llm.eval(tokens)
        logits = last_logits(llm)
        cont, margins = [], []
        step_logits = logits
        first_eog = None
        for step in range(N_CONTINUATION):
            top2 = np.argpartition(-step_logits, 1)[:2]
            tok = int(np.argmax(step_logits))
            other = int(top2[0] if top2[0] != tok else top2[1])
            margins.append(round(float(step_logits[tok] - step_logits[other]), 5))
            cont.append(tok)
            if first_eog is None and llama_cpp.llama_vocab_is_eog(vocab, tok):
                first_eog = step
            llm.eval([tok])
            step_logits = last_logits(llm)
        results.append({
            "name": name,
            "text": text,
            "bos_added": bool(tokens and tokens[0] == bos and add_bos_meta),
            "tokens": [int(t) for t in tokens],
            "n_tokens": len(tokens),
            "logits_argmax": int(np.argmax(logits)),
            "logits_max": float(logits.max()),
            "greedy_tokens": cont,
            "greedy_text": llm.detokenize(cont, special=True).decode("utf-8", errors="replace"),
            "greedy_margins": margins,
            "first_eog_index": first_eog,
            "_logits": logits,
        })
    info = {
        "vocab_size": int(llm.n_vocab()),
        "bos_token_id": int(bos),
        "eos_token_id": int(llm.token_eos()),
        "add_bos": add_bos_meta,
    }
    llm.close()
    return info, results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=os.path.join(REPO, "models"))
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "e2e"))
    ap.add_argument("--only", choices=sorted(MODELS), default=None)
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    generator = llama_cpp_info(args.threads)

    for key, spec in MODELS.items():
        if args.only and key != args.only:
            continue
        path = os.path.join(args.models_dir, spec["file"])
        prompts = [(name, spec["chat"].format(text) if chat else text)
                   for name, text, chat in PROMPTS]
        t0 = time.time()
        info, results = run_llama_cpp(path, prompts, args.threads)
        print(f"{key}: llama.cpp done in {time.time() - t0:.1f}s", file=sys.stderr)

        logits_file = f"{key}_logits.f16"
        np.stack([r["_logits"] for r in results]).astype("<f2").tofile(
            os.path.join(args.out, logits_file))
        index = {
            "format_version": 1,
            "format": FORMAT,
            "model_file": spec["file"],
            "model_sha256": sha256_of(path),
            "generator": generator,
            **info,
            "n_prompts": len(results),
            "n_continuation": N_CONTINUATION,
            "logits": {"file": logits_file, "dtype": "float16",
                       "shape": [len(results), info["vocab_size"]]},
        }

        if spec["numpy_reference"]:
            t0 = time.time()
            ref = NumpyLlama(path)
            ref_rows = []
            for r in results:
                ref_logits = ref.last_logits(r["tokens"])
                diff = np.abs(ref_logits - r["_logits"].astype(np.float64))
                r["numpy_f64_argmax"] = int(np.argmax(ref_logits))
                r["max_abs_diff_llamacpp_vs_numpy"] = round(float(diff.max()), 6)
                r["mean_abs_diff_llamacpp_vs_numpy"] = round(float(diff.mean()), 6)
                ref_rows.append(ref_logits.astype(np.float32))
                print(f"  {r['name']:12s} n={r['n_tokens']:4d} max|diff|={diff.max():.4f} "
                      f"mean|diff|={diff.mean():.4f} argmax llama.cpp={r['logits_argmax']} "
                      f"numpy={r['numpy_f64_argmax']}", file=sys.stderr)
            ref_file = f"{key}_f32_logits.f32"
            np.stack(ref_rows).astype("<f4").tofile(os.path.join(args.out, ref_file))
            index["numpy_reference"] = {
                "file": ref_file, "dtype": "float32",
                "shape": [len(results), info["vocab_size"]],
                "method": "weights dequantised to float with gguf.quants.dequantize; "
                          "Llama forward in numpy float64 (RMSNorm eps and RoPE freq_base "
                          "from metadata, RoPE on adjacent pairs, GQA, SwiGLU, "
                          "tied output = token_embd when output.weight is absent); "
                          "stored as float32",
            }
            print(f"{key}: numpy reference done in {time.time() - t0:.1f}s", file=sys.stderr)

        for r in results:
            del r["_logits"]
        index["prompts"] = results
        with open(os.path.join(args.out, f"{key}.json"), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{key}: wrote {key}.json and {logits_file}", file=sys.stderr)


if __name__ == "__main__":
    main()
