#!/usr/bin/env python3
"""MoE decode speed on the GPU machine, for two layer shapes with random bf16
weights from `from_config`, decoded by DeepInfer (`deepinfer bench`) and by
transformers in the same run, at batch 1 and 256:

- qwen3_30b_a3b: hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
  768, top 8, vocab 151,936 (48 layers in the real model);
- deepseek_v2_lite: hidden 2048, MLA with 16 heads (nope 128 + rope 64,
  v 128, kv_lora_rank 512, no q LoRA), the first layer dense (10,944), then
  64 routed experts of 1,408, top 6, and 2 shared experts; vocab 102,400
  (27 layers in the real model).

--layers of them are built, so that creating, saving and loading the weights
fit one device call; per-layer work is that of the real model.

The roofline counts the bytes one decode step must read: every weight except
the embedding table (one row per token), the routed experts in proportion to
how many the batch can pick (top_k per token, at most all of them) and the KV
cache at the mean context (DeepSeek: the compressed latent row of
kv_lora_rank + rope dims, which is what we store), over the copy bandwidth
measured here.

Usage (scripts/gpu_run.sh's moe stage runs it for each MOE_SHAPES entry):
  scripts/gpu_bench_moe.py --deepinfer build-gpu/bin/deepinfer --out $OUT --shape deepseek_v2_lite [--layers 12]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import ceilings  # noqa: E402
from gpu_e2e import legacy_rope_fields, write_tokenizer  # noqa: E402


def make_config(shape, layers):
    import transformers as tf
    if shape == "qwen3_30b_a3b":
        return tf.Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                 moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                 norm_topk_prob=True, num_hidden_layers=layers, num_attention_heads=32,
                                 num_key_value_heads=4, head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
                                 rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if shape == "deepseek_v2_lite":
        return tf.DeepseekV2Config(vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                                   moe_intermediate_size=1408, num_hidden_layers=layers, num_attention_heads=16,
                                   num_key_value_heads=16, n_routed_experts=64, n_shared_experts=2,
                                   num_experts_per_tok=6, first_k_dense_replace=1, topk_method="greedy",
                                   n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                                   kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                   v_head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    raise SystemExit(f"unknown shape {shape}")


def experts_of(cfg):
    n = getattr(cfg, "num_experts", None) or cfg.n_routed_experts
    return n, cfg.num_experts_per_tok


def weight_bytes(model, num_experts):
    """(bytes of every weight but the embedding and routed experts, bytes of all routed experts)."""
    dense = experts = 0
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue
        routed = ".experts." in name and "shared" not in name
        if routed:
            experts += p.numel() * p.element_size()
        else:
            dense += p.numel() * p.element_size()
    return dense, experts


def kv_bytes_per_token(cfg):
    if hasattr(cfg, "kv_lora_rank"):
        return cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2


def step_bytes(weights, cfg, tokens, ctx):
    dense, experts = weights
    n, k = experts_of(cfg)
    return dense + experts * min(n, tokens * k) / n + tokens * ctx * kv_bytes_per_token(cfg)


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
    ap.add_argument("--shape", default="qwen3_30b_a3b", choices=["qwen3_30b_a3b", "deepseek_v2_lite"])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--workdir", default="/tmp/deepinfer_moe_bench")
    ap.add_argument("--ncu", default="", help="path of ncu: also write per-kernel decode times")
    ap.add_argument("--profile-batch", type=int, default=0,
                    help="also write per-kernel GPU times of a decode at this batch (nsys when installed, else ncu)")
    args = ap.parse_args()
    import transformers as tf
    res = {"shape": args.shape, "layers": args.layers, "prompt": args.prompt, "gen": args.gen}
    bw, peak = ceilings()
    res.update(copy_bandwidth_TBps=bw / 1e12)
    cfg = make_config(args.shape, args.layers)
    path = os.path.join(args.workdir, args.shape)
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
    weights = weight_bytes(model, experts_of(cfg)[0])
    res["dense_weight_GB"], res["expert_weight_GB"] = weights[0] / 1e9, weights[1] / 1e9
    print(f"[moe {args.shape}] {res['params_B']:.2f} B params, created and saved in {time.time() - t0:.0f} s", flush=True)
    with torch.no_grad():
        for b, g in ((1, args.gen), (256, 16)):
            try:
                res[f"hf_ms_per_step_b{b}"] = hf_decode(model, b, args.prompt, g)
                print(f"[moe {args.shape}] transformers batch {b}: {res[f'hf_ms_per_step_b{b}']:.2f} ms/step", flush=True)
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
        print(f"[moe {args.shape}] deepinfer failed:", r.stderr[-2000:], flush=True)
    else:
        for p in json.loads(r.stdout):
            b = p["batch"]
            ms = 1000.0 * b / p["decode_tok_s"]
            ideal = 1000.0 * step_bytes(weights, cfg, b, args.prompt + args.gen // 2) / bw
            res[f"ours_ms_per_step_b{b}"] = ms
            res[f"roofline_ms_b{b}"] = ideal
            res[f"roofline_fraction_b{b}"] = ideal / ms
            hf = res.get(f"hf_ms_per_step_b{b}")
            print(f"[moe {args.shape}] deepinfer batch {b}: {ms:.2f} ms/step = {p['decode_tok_s']:.0f} tok/s; roofline {ideal:.2f} ms "
                  f"({100 * ideal / ms:.1f}%)" + (f"; transformers {hf:.2f} ms/step ({hf / ms:.1f}x)" if hf else ""),
                  flush=True)
    json.dump(res, open(os.path.join(args.out, f"bench_moe_{args.shape}.json"), "w"), indent=1)
    if args.ncu:
        # Per-kernel device time of a 32-token prompt and 5 decode steps
        # (serialized by ncu): where a decode step of this shape goes.
        cmd = [args.ncu, "--clock-control", "none", "--cache-control", "none", "--metrics", "gpu__time_duration.sum",
               "--print-summary", "per-kernel", args.deepinfer, "generate", "--device", "cuda", "--model", path,
               "--prompt", "a" * 32, "-n", "6", "--max-model-len", "512"]
        with open(os.path.join(args.out, f"ncu_moe_{args.shape}.txt"), "w") as f:
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=150)
    if args.profile_batch:
        profile_batch(args, path)
    return 0


def profile_batch(args, path):
    """Per-kernel GPU time of `deepinfer bench` at --profile-batch (prefill
    of the prompts, then 8 decode steps): nsys's kernel summary when nsys is
    installed (real, overlapped timing), else ncu on the attention and MoE
    kernels (serialized; the first 1,600, which reach the decode steps)."""
    import shutil
    b = args.profile_batch
    bench = [args.deepinfer, "bench", "--device", "cuda", "--model", path, "-b", str(b), "-p", str(args.prompt),
             "-g", "8", "-r", "1", "--json", "--max-num-batched-tokens", "8192", "--max-model-len",
             str(args.prompt + 24)]
    out = os.path.join(args.out, f"profile_b{b}_{args.shape}.txt")
    nsys = shutil.which("nsys") or next((p for p in ["/usr/local/cuda/bin/nsys"] if os.path.exists(p)), None)
    with open(out, "w") as f:
        if nsys:
            rep = os.path.join(args.workdir, "profile")
            subprocess.run([nsys, "profile", "-f", "true", "-o", rep, "--trace", "cuda"] + bench, stdout=f,
                           stderr=subprocess.STDOUT, timeout=300)
            subprocess.run([nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "table", rep + ".nsys-rep"],
                           stdout=f, stderr=subprocess.STDOUT, timeout=200)
        else:
            ncu = args.ncu or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
            kernels = "regex:attention_kernel|moe_mma|moe_combine|moe_index|moe_route"
            subprocess.run([ncu, "--clock-control", "none", "--cache-control", "none", "--metrics",
                            "gpu__time_duration.sum", "-k", kernels, "-c", "1600", "--print-summary", "per-kernel"]
                           + bench, stdout=f, stderr=subprocess.STDOUT, timeout=400)


if __name__ == "__main__":
    sys.exit(main())
