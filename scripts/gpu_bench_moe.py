#!/usr/bin/env python3
"""MoE decode speed on the GPU machine: a Qwen3-30B-A3B-shaped model (hidden
2048, 32 query / 4 KV heads of 128, 128 experts of 768, top 8, vocab 151,936;
--layers of its 48, so the weights fit the machine's disk and memory
budget), random bf16 weights from `from_config`, decoded by DeepInfer
(`deepinfer bench`) and by transformers in the same run, at batch 1 and 256.

The roofline counts the bytes one decode step must read: every non-expert
weight, the experts the batch routes to (8 per token at batch 1; all 128 at
batch 256, where 2,048 picks cover every expert), the LM head and the KV
cache at the mean context, against the copy bandwidth measured here.

Usage (scripts/gpu_run.sh does not call it; run it directly on the GPU machine):
  scripts/gpu_bench_moe.py --deepinfer build-gpu/bin/deepinfer --out $OUT [--layers 16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import ceilings  # noqa: E402
from gpu_e2e import legacy_rope_fields, write_tokenizer  # noqa: E402


def make_config(layers):
    import transformers as tf
    return tf.Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                             num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=layers,
                             num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                             max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def step_bytes(cfg, tokens, ctx):
    h, d, hq, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    attn = h * hq * d * 2 + 2 * h * hkv * d + cfg.num_experts * h
    experts_used = min(cfg.num_experts, tokens * cfg.num_experts_per_tok)
    experts = experts_used * 3 * cfg.moe_intermediate_size * h
    lm_head = cfg.vocab_size * h
    kv = tokens * ctx * 2 * hkv * d
    return 2 * (cfg.num_hidden_layers * (attn + experts + kv) + lm_head)


def hf_decode(model, batch, prompt_len, gen):
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt_len), device="cuda")

    def run(n):
        torch.cuda.synchronize()
        t0 = time.time()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.time() - t0

    run(2)
    short, long = run(4), run(4 + gen)
    return 1000.0 * (long - short) / gen  # ms per decode step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--workdir", default="/tmp/deepinfer_moe_bench")
    args = ap.parse_args()
    import transformers as tf
    res = {"layers": args.layers, "prompt": args.prompt, "gen": args.gen}
    bw, peak = ceilings()
    res.update(copy_bandwidth_TBps=bw / 1e12)
    cfg = make_config(args.layers)
    path = os.path.join(args.workdir, "qwen3_30b_a3b_slice")
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    legacy_rope_fields(path)
    write_tokenizer(path, cfg.vocab_size)
    res["params_B"] = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"[moe] {res['params_B']:.2f} B params, created and saved in {time.time() - t0:.0f} s", flush=True)
    with torch.no_grad():
        for b, g in ((1, args.gen), (256, 16)):
            try:
                res[f"hf_ms_per_step_b{b}"] = hf_decode(model, b, args.prompt, g)
                print(f"[moe] transformers batch {b}: {res[f'hf_ms_per_step_b{b}']:.2f} ms/step", flush=True)
            except Exception as e:  # keep going: the report says what failed
                res[f"hf_error_b{b}"] = str(e)[-500:]
    del model
    torch.cuda.empty_cache()
    cmd = [args.deepinfer, "bench", "--device", "cuda", "--model", path, "-b", "1,256", "-p", str(args.prompt), "-g",
           str(args.gen), "-r", "1", "--json", "--max-num-batched-tokens", "8192", "--max-model-len",
           str(args.prompt + args.gen + 16)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    if r.returncode != 0:
        res["deepinfer_error"] = r.stderr[-2000:]
        print("[moe] deepinfer failed:", r.stderr[-2000:], flush=True)
    else:
        for p in json.loads(r.stdout):
            b = p["batch"]
            ms = 1000.0 * b / p["decode_tok_s"]
            ideal = 1000.0 * step_bytes(cfg, b, args.prompt + args.gen // 2) / bw
            res[f"ours_ms_per_step_b{b}"] = ms
            res[f"roofline_ms_b{b}"] = ideal
            res[f"roofline_fraction_b{b}"] = ideal / ms
            hf = res.get(f"hf_ms_per_step_b{b}")
            print(f"[moe] deepinfer batch {b}: {ms:.2f} ms/step = {p['decode_tok_s']:.0f} tok/s; roofline {ideal:.2f} ms "
                  f"({100 * ideal / ms:.1f}%)" + (f"; transformers {hf:.2f} ms/step ({hf / ms:.1f}x)" if hf else ""),
                  flush=True)
    json.dump(res, open(os.path.join(args.out, "bench_moe.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
