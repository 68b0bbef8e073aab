#!/usr/bin/env python3
"""GPU benchmarks of DeepInfer's CUDA backend, each figure a ratio measured in
the same run (docs/benchmarks.md, "CUDA (H200)").

  1. Ceilings: device-to-device copy bandwidth (bytes read + written) and the
     cuBLAS bf16 matrix rate (8192^3, random data), both through PyTorch.
  2. Batch-1 decode on a Llama-3-8B-shaped bf16 model (made by gpu_e2e.py):
     ms/token from `deepinfer generate` (steady-state tok/s after the first
     token) and the fraction of the HBM roofline = (weight bytes read per step
     + KV bytes read per step) / copy bandwidth / measured time.
  3. The peer: transformers with a static KV cache and torch.compile, same
     model, same GPU, same prompt/output lengths.
  4. Optional: 256 concurrent requests (tok/s) and an 8,192-token prefill as a
     fraction of the measured cuBLAS peak.

Usage: scripts/gpu_bench.py --deepinfer build/deepinfer --model /tmp/deepinfer_e2e/llama8b --out $OUT
Writes bench.json into --out and bench.md into --workdir.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch


def timed_cuda(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def ceilings():
    n = 4 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    t = timed_cuda(lambda: b.copy_(a), 10)
    bw = 2 * n / t
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    t = timed_cuda(lambda: x @ y, 10)
    flops = 2 * m ** 3 / t
    del x, y
    torch.cuda.empty_cache()
    return bw, flops


def model_bytes(cfg):
    h, f, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // hq
    per_layer = h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * f
    matmul_params = L * per_layer + v * h  # + lm_head; the embedding reads one row per token
    kv_bytes_per_token = L * 2 * hkv * d * 2
    return matmul_params, 2 * matmul_params, kv_bytes_per_token, (L, hq * d)


def run_generate(exe, model, extra, timeout):
    cmd = [exe, "generate", "--device", "cuda", "--model", model] + extra
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-3000:]}")
    return r, time.time() - t0


def deepinfer_decode_b1(exe, model, prompt_len, gen, reps):
    prompt = "a" * prompt_len  # the synthetic byte-level tokenizer gives one token per byte
    rates = []
    for _ in range(reps):
        r, _ = run_generate(exe, model, ["--prompt", prompt, "-n", str(gen), "--max-model-len", "4096",
                                         "--kv-cache-memory", str(4 << 30), "--no-enable-prefix-caching"], 600)
        m = re.search(r"then ([0-9.]+) tok/s", r.stderr)
        if not m:
            raise RuntimeError("no decode rate in the log:\n" + r.stderr[-2000:])
        rates.append(float(m.group(1)))
    return 1000.0 / statistics.median(rates), rates


def torch_compile_decode_b1(model_dir, prompt_len, gen):
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    # generate() compiles the decoding forward itself when the cache is static
    # (and marks CUDA-graph steps correctly, which a hand-compiled forward does not).
    model.generation_config.cache_implementation = "static"
    try:
        from transformers import CompileConfig
        model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    except ImportError:
        pass
    ids = torch.full((1, prompt_len), 97, dtype=torch.long, device="cuda")

    def gen_n(n):
        torch.cuda.synchronize()
        t0 = time.time()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.time() - t0

    t_compile = time.time()
    gen_n(gen)
    gen_n(gen)
    t_compile = time.time() - t_compile
    short = statistics.median(gen_n(16) for _ in range(3))
    long = statistics.median(gen_n(gen) for _ in range(3))
    ms = 1000.0 * (long - short) / (gen - 16)
    del model
    torch.cuda.empty_cache()
    return ms, t_compile


def deepinfer_batch(exe, model, workdir, n_req, prompt_len, gen, vocab, timeout, kv_dtype="auto", budget="8192"):
    g = torch.Generator().manual_seed(5)
    path = os.path.join(workdir, "batch.jsonl")
    with open(path, "w") as f:
        for _ in range(n_req):
            ids = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
            f.write(json.dumps({"prompt_token_ids": ids, "max_tokens": gen, "ignore_eos": True,
                                "temperature": 0}) + "\n")
    out = os.path.join(workdir, "batch_out.jsonl")
    kv_gb = 90
    # budget "default": no --max-num-batched-tokens, the engine picks the device's;
    # "cost:PATH": budget 8192 with prompt chunks sized by the cost model in PATH.
    if budget == "default":
        budget_flags = []
    elif budget.startswith("cost:"):
        budget_flags = ["--max-num-batched-tokens", "8192", "--cost-model", budget[len("cost:"):]]
    else:
        budget_flags = ["--max-num-batched-tokens", str(budget)]
    r, wall = run_generate(exe, model, ["--input", path, "--output", out, "--max-num-seqs", str(n_req)] + budget_flags +
                           ["--max-model-len", "4096", "--kv-cache-memory", str(kv_gb << 30),
                            "--no-enable-prefix-caching", "--kv-cache-dtype", kv_dtype],
                           timeout)
    m = re.search(r"([0-9.]+) generated tok/s", r.stderr)
    return (float(m.group(1)) if m else n_req * gen / wall), wall


def deepinfer_prefill(exe, model, n, reps, timeout):
    """Time to first token of one n-token prompt, in one process after a
    warm-up (`deepinfer bench`: median of reps; the first rep also pays
    cuBLAS's first use of these shapes)."""
    cmd = [exe, "bench", "--device", "cuda", "--model", model, "-b", "1", "-p", str(n), "-g", "1", "-r", str(reps),
           "--json", "--max-num-batched-tokens", str(n), "--max-model-len", str(n + 16)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-3000:]}")
    p = json.loads(r.stdout)[0]
    return n / p["prefill_tok_s"], p


def deepinfer_pipeline(exe, model, batches, prompt_len, gen, timeout):
    """`deepinfer bench` with the pipelined step loop on and off: decode tok/s
    and the device's idle time between consecutive decode steps (from CUDA
    events around every step), per batch size."""
    out = {}
    for mode in ("1", "0"):
        env = dict(os.environ, DEEPINFER_ZERO_OVERHEAD_SCHEDULING=mode)
        cmd = [exe, "bench", "--device", "cuda", "--model", model, "-b", ",".join(map(str, batches)),
               "-p", str(prompt_len), "-g", str(gen), "-r", "1", "--json", "--max-num-batched-tokens", "8192",
               "--max-model-len", str(prompt_len + gen + 16)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-3000:]}")
        for p in json.loads(r.stdout):
            busy, idle, steps = p["decode_device_busy_ms"], p["decode_device_idle_ms"], max(p["decode_steps"], 1)
            out[f"{'on' if mode == '1' else 'off'}_b{p['batch']}"] = {
                "decode_tok_s": p["decode_tok_s"], "steps": p["decode_steps"], "graph_steps": p["graph_steps"],
                "step_ms": busy / steps, "idle_us_per_step": 1000 * idle / steps,
                "idle_fraction": idle / (busy + idle) if busy + idle > 0 else 0, "idle_max_ms": p["decode_idle_max_ms"]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of: peer,batch,prefill,pipeline,small")
    ap.add_argument("--batch-requests", type=int, default=256)
    ap.add_argument("--batch-prompt", type=int, default=1000)
    ap.add_argument("--batch-gen", type=int, default=1000)
    ap.add_argument("--batch-timeout", type=int, default=240)
    ap.add_argument("--batch-kv-dtypes", default="auto,fp8", help="--kv-cache-dtype values of the batch runs")
    ap.add_argument("--batch-budgets", default="8192",
                    help="--max-num-batched-tokens values of the bf16-KV batch runs; 'default' passes none; "
                         "'cost' fits a chunked-prefill cost model first (bench --fit-cost-model) and uses it")
    ap.add_argument("--workdir", default="/tmp/deepinfer_bench", help="inputs and outputs of the runs")
    ap.add_argument("--peer-timeout", type=int, default=300)
    ap.add_argument("--pipeline-timeout", type=int, default=240)
    ap.add_argument("--small-model", default="", help="a small model to measure per-step overhead with")
    ap.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_only:
        print(json.dumps(torch_compile_decode_b1(args.model, args.prompt_len, args.gen)))
        return 0
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.workdir, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(0)}
    cfg = json.load(open(os.path.join(args.model, "config.json")))

    def save():
        json.dump(res, open(os.path.join(args.out, "bench.json"), "w"), indent=1)

    bw, peak = ceilings()
    res.update(copy_bandwidth_TBps=bw / 1e12, cublas_bf16_TFLOPs=peak / 1e12)
    print(f"[bench] copy bandwidth {bw / 1e12:.2f} TB/s, cuBLAS bf16 {peak / 1e12:.0f} TFLOP/s", flush=True)
    save()
    params, weight_bytes, kv_per_token, (L, qdim) = model_bytes(cfg)
    try:
        ms, rates = deepinfer_decode_b1(args.deepinfer, args.model, args.prompt_len, args.gen, args.reps)
        avg_ctx = args.prompt_len + args.gen / 2
        step_bytes = weight_bytes + kv_per_token * avg_ctx
        floor_ms = 1000.0 * step_bytes / bw
        res.update(decode_b1_ms_per_token=ms, decode_b1_tok_s_runs=rates, bytes_per_step=step_bytes,
                   roofline_ms=floor_ms, roofline_fraction=floor_ms / ms)
        print(f"[bench] deepinfer batch-1 decode {ms:.2f} ms/token; roofline {floor_ms:.2f} ms "
              f"({100 * floor_ms / ms:.1f}%)", flush=True)
    except Exception as e:
        res["decode_b1_error"] = str(e)[-2000:]
        print("[bench] decode failed:", str(e)[-2000:], flush=True)
    save()
    if args.small_model and "small" not in skip:
        # A model whose weights take microseconds to read: its ms/token is the
        # engine's per-step overhead (launches, host work, copies).
        try:
            ms_small, _ = deepinfer_decode_b1(args.deepinfer, args.small_model, args.prompt_len, args.gen, 1)
            res.update(small_model_decode_ms_per_token=ms_small)
            print(f"[bench] small model ({os.path.basename(args.small_model)}) batch-1 decode {ms_small:.2f} ms/token",
                  flush=True)
        except Exception as e:
            res["small_model_error"] = str(e)[-1000:]
        save()
    if "peer" not in skip:
        try:
            # In a child process, so that its CUDA graphs and caches are gone before our runs.
            r = subprocess.run([sys.executable, __file__, "--peer-only", "--deepinfer", args.deepinfer, "--model",
                                args.model, "--out", args.out, "--prompt-len", str(args.prompt_len), "--gen",
                                str(args.gen)], capture_output=True, text=True, timeout=args.peer_timeout)
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-2000:])
            ms_peer, compile_s = json.loads(r.stdout.strip().splitlines()[-1])
            res.update(torch_compile_ms_per_token=ms_peer, torch_compile_warmup_s=compile_s)
            if "decode_b1_ms_per_token" in res:
                res["speedup_vs_torch_compile"] = ms_peer / res["decode_b1_ms_per_token"]
            print(f"[bench] transformers StaticCache + torch.compile: {ms_peer:.2f} ms/token", flush=True)
        except Exception as e:
            res["torch_compile_error"] = str(e)[-2000:]
            print("[bench] torch.compile peer failed:", str(e)[-1500:], flush=True)
        save()
    if "prefill" not in skip:
        try:
            n = 8192
            ttft, runs = deepinfer_prefill(args.deepinfer, args.model, n, 3, 300)
            flops = 2 * params * n + 4 * L * qdim * n * n / 2
            res.update(prefill_8k_s=ttft, prefill_8k_runs=runs, prefill_8k_TFLOPs=flops / ttft / 1e12,
                       prefill_8k_fraction_of_cublas=flops / ttft / peak)
            print(f"[bench] 8k prefill {ttft:.3f} s = {flops / ttft / 1e12:.0f} TFLOP/s "
                  f"({100 * flops / ttft / peak:.1f}% of cuBLAS)", flush=True)
        except Exception as e:
            res["prefill_error"] = str(e)[-2000:]
            print("[bench] prefill failed:", str(e)[-1500:], flush=True)
        save()
    if "pipeline" not in skip:
        try:
            res["pipeline"] = deepinfer_pipeline(args.deepinfer, args.model, [1, 32, 256], 128, 128,
                                                 args.pipeline_timeout)
            for k, v in res["pipeline"].items():
                print(f"[bench] pipeline {k}: {v['decode_tok_s']:.0f} tok/s, step {v['step_ms']:.2f} ms, idle "
                      f"{v['idle_us_per_step']:.1f} us/step ({100 * v['idle_fraction']:.2f}%), max {v['idle_max_ms']:.3f} ms, "
                      f"graphs {v['graph_steps']}/{v['steps']}", flush=True)
        except Exception as e:
            res["pipeline_error"] = str(e)[-2000:]
            print("[bench] pipeline failed:", str(e)[-1500:], flush=True)
        save()
    budgets = args.batch_budgets.split(",")
    if "cost" in budgets and "batch" not in skip:
        path = os.path.join(args.workdir, "cost_model.json")
        try:
            t0 = time.time()
            cmd = [args.deepinfer, "bench", "--device", "cuda", "--model", args.model, "--fit-cost-model", path,
                   "--fit-max-chunk", "8192", "-b", "1", "-p", "16", "-g", "1", "-r", "1"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-3000:]}")
            res["cost_model_fit_s"] = time.time() - t0
            print(f"[bench] cost model fitted in {res['cost_model_fit_s']:.1f} s:",
                  [l for l in r.stderr.splitlines() if l.startswith("cost model")], flush=True)
            budgets[budgets.index("cost")] = "cost:" + path
        except Exception as e:
            res["cost_model_error"] = str(e)[-2000:]
            budgets.remove("cost")
    runs = [] if "batch" in skip else [(kv, b) for kv in args.batch_kv_dtypes.split(",")
                                         for b in (budgets if kv == "auto" else ["8192"])]
    for kv_dtype, budget in runs:
        name = "cost_model" if budget.startswith("cost:") else budget
        suffix = ("" if kv_dtype == "auto" else "_kv_" + kv_dtype) + ("" if budget == "8192" else "_budget_" + name)
        try:
            tps, wall = deepinfer_batch(args.deepinfer, args.model, args.workdir, args.batch_requests, args.batch_prompt,
                                        args.batch_gen, cfg["vocab_size"], args.batch_timeout, kv_dtype, budget)
            res.update(batch_requests=args.batch_requests, batch_prompt=args.batch_prompt, batch_gen=args.batch_gen)
            res["batch_output_tok_s" + suffix] = tps
            res["batch_wall_s" + suffix] = wall
            print(f"[bench] {args.batch_requests} requests x {args.batch_prompt}/{args.batch_gen}, KV {kv_dtype}, "
                  f"token budget {budget}: {tps:.0f} output tok/s ({wall:.0f} s)", flush=True)
        except Exception as e:
            res["batch_error" + suffix] = str(e)[-2000:]
            print(f"[bench] batch (KV {kv_dtype}, budget {budget}) failed:", str(e)[-1500:], flush=True)
        save()
    with open(os.path.join(args.workdir, "bench.md"), "w") as f:
        f.write("| figure | value |\n|---|---|\n")
        for k, v in res.items():
            f.write(f"| {k} | {v if not isinstance(v, float) else round(v, 4)} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
