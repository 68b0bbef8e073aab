#!/usr/bin/env python3
"""Creates a randomly initialised bf16 checkpoint of a real architecture's shape
(transformers from_config, on the GPU) for speed runs on the GPU machine:

    scripts/make_random_model.py --shape llama8b --out /tmp/m/llama8b
    scripts/make_random_model.py --shape qwen3_30b_a3b --layers 16 --out /tmp/m/qwen3moe

llama8b is gpu_e2e.py's Llama-3-8B shape; the MoE shapes are gpu_bench_moe.py's,
with --layers of the real model's (48 for Qwen3-30B-A3B) so the weights fit the disk.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=["llama8b", "qwen3_30b_a3b", "deepseek_v2_lite"])
    ap.add_argument("--layers", type=int, default=16, help="MoE shapes: decoder layers built")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if os.path.exists(os.path.join(args.out, "config.json")):
        print(f"{args.out} exists")
        return
    if args.shape == "llama8b":
        import gpu_e2e

        gpu_e2e.build_model("llama8b", args.out)
        return
    import time

    import torch
    import transformers as tf
    from gpu_bench_moe import make_config
    from gpu_e2e import legacy_rope_fields, write_tokenizer

    cfg = make_config(args.shape, args.layers)
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    legacy_rope_fields(args.out)
    write_tokenizer(args.out, cfg.vocab_size)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"{args.shape} ({args.layers} layers): {params:.2f} B params, created in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
