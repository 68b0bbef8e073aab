#!/usr/bin/env python3
"""GPU end-to-end check of DeepInfer's CUDA backend against Hugging Face transformers.

For each architecture (a Llama-3-8B-shaped model, a small Qwen3, a small
Gemma 3 text model with sliding-window layers) it creates a randomly
initialised bf16 model with `from_config`, saves it as safetensors with a
synthetic byte-level tokenizer (every id decodes), and runs

    deepinfer generate --device cuda --model DIR --input prompts.jsonl --output out.jsonl

with prompt_token_ids, greedy decoding, ignore_eos and top-20 logprobs. Then
transformers (bf16, same GPU) runs one forward pass over prompt + DeepInfer's
continuation (teacher forcing) and its own greedy generation. Reported per
model: top-1 agreement at every generated position (DeepInfer's greedy token
vs transformers' argmax on the same prefix), max |logprob difference| over
DeepInfer's top-20 tokens, and how many greedy tokens agree before the first
divergence.

Usage (on the GPU machine; scripts/gpu_run.sh calls it):
  scripts/gpu_e2e.py --deepinfer build/deepinfer --out $OUT [--models llama8b,qwen3,gemma3]
Writes e2e.json into --out and e2e.md into --workdir.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

# Where transformers and DeepInfer run: the GPU; --device cpu is a dry run of
# the GGUF check on a machine without one.
DEVICE = "cuda"


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(path, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    for i in range(256, vocab_size):
        vocab[f"tok{i}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)


def legacy_rope_fields(path):
    """transformers 5 writes rope_parameters; also write the older rope_theta /
    rope_scaling / rope_local_base_freq fields that the loader reads."""
    p = os.path.join(path, "config.json")
    cfg = json.load(open(p))
    for c in [cfg] + ([cfg["text_config"]] if isinstance(cfg.get("text_config"), dict) else []):
        rp = c.get("rope_parameters")
        if not isinstance(rp, dict):
            continue
        full, local = rp, None
        if "full_attention" in rp:
            full, local = rp["full_attention"], rp.get("sliding_attention")
        if "rope_theta" in full:
            c.setdefault("rope_theta", full["rope_theta"])
        if full.get("rope_type", "default") != "default":
            c.setdefault("rope_scaling", {k: v for k, v in full.items() if k != "rope_theta"})
        if local and "rope_theta" in local:
            c.setdefault("rope_local_base_freq", local["rope_theta"])
    json.dump(cfg, open(p, "w"), indent=1)


def make_config(name):
    import transformers as tf
    if name == "llama8b":
        return tf.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                              rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                              bos_token_id=1, eos_token_id=2)
    if name == "qwen3":
        return tf.Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                              max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    if name == "gemma3":
        return tf.Gemma3TextConfig(vocab_size=32000, hidden_size=640, intermediate_size=2048, num_hidden_layers=6,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                   sliding_window=64, query_pre_attn_scalar=256, max_position_embeddings=4096,
                                   rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    # Mixture-of-experts models (issue 8), small enough to create in seconds.
    if name == "qwen3_moe":
        return tf.Qwen3MoeConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512,
                                 num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, num_hidden_layers=4,
                                 num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                 max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if name == "mixtral":
        return tf.MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                                num_attention_heads=16, num_key_value_heads=8, num_local_experts=8,
                                num_experts_per_tok=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
                                rope_theta=1000000.0, sliding_window=None, bos_token_id=1, eos_token_id=2)
    if name == "gpt_oss":
        return tf.GptOssConfig(vocab_size=32000, hidden_size=512, intermediate_size=512, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_local_experts=8,
                               num_experts_per_tok=2, sliding_window=32,
                               layer_types=["sliding_attention", "full_attention"] * 2,
                               max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    # DeepSeek layer shapes (MLA: 16 heads of nope 128 + rope 64, v 128,
    # kv_lora_rank 512), 4 layers with the first one dense.
    if name == "deepseek_v2_lite":
        return tf.DeepseekV2Config(vocab_size=32000, hidden_size=2048, intermediate_size=10944,
                                   moe_intermediate_size=1408, num_hidden_layers=4, num_attention_heads=16,
                                   num_key_value_heads=16, n_routed_experts=64, n_shared_experts=2,
                                   num_experts_per_tok=6, first_k_dense_replace=1, topk_method="greedy", n_group=1,
                                   topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0, kv_lora_rank=512,
                                   q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                   max_position_embeddings=4096, rms_norm_eps=1e-6,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    if name == "deepseek_v3":
        # V3's routing (sigmoid scores, correction bias, 8 groups of which 4
        # are kept, top 8, routed scaling 2.5) and q LoRA, at a smaller width.
        return tf.DeepseekV3Config(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                   moe_intermediate_size=256, num_hidden_layers=4, num_attention_heads=16,
                                   num_key_value_heads=16, n_routed_experts=64, n_shared_experts=1,
                                   num_experts_per_tok=8, n_group=8, topk_group=4, first_k_dense_replace=1,
                                   norm_topk_prob=True, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=384,
                                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                   max_position_embeddings=4096, rms_norm_eps=1e-6,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    raise ValueError(name)


def build_model(name, path):
    import transformers as tf
    cfg = make_config(name)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device(DEVICE):
        try:
            model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:
            model = tf.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    legacy_rope_fields(path)
    write_tokenizer(path, cfg.vocab_size)
    print(f"[e2e] {name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params, created and saved "
          f"in {time.time() - t0:.1f} s", flush=True)
    return model, cfg


# Real text for real weights (GGUF checkpoints): their logits have margins,
# so top-1 agreement measures the engine rather than ties.
GGUF_PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize "
    "foods from carbon dioxide and water. Explain, step by step, what happens in the light-dependent reactions.",
    "Translate to German: The weather is nice today and we are going for a walk in the park.",
    "List three differences between a CPU and a GPU, with one sentence each.",
    "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker who",
    "Q: What is 17 multiplied by 23?\nA:",
]


def _gguf_field(reader, key):
    import gguf
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types and f.types[0] == gguf.GGUFValueType.STRING else v[0].item()


def hf_llama_from_gguf(gguf_path):
    """A transformers Llama model holding a llama-architecture GGUF's weights,
    dequantised by the gguf package (the values DeepInfer's dequantisation
    gives bit for bit) and with llama.cpp's rotary row order of q/k undone.
    Written here so the check needs neither accelerate nor transformers' GGUF
    support on the GPU machine."""
    import gguf
    import numpy as np
    import transformers as tf
    r = gguf.GGUFReader(gguf_path)
    arch = _gguf_field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path}: architecture {arch}; this check reads llama GGUFs only")
    g = lambda k: _gguf_field(r, f"llama.{k}")  # noqa: E731
    heads, kv_heads, hidden = g("attention.head_count"), g("attention.head_count_kv"), g("embedding_length")
    tensors = {t.name: t for t in r.tensors}
    cfg = tf.LlamaConfig(vocab_size=int(tensors["token_embd.weight"].shape[1]), hidden_size=hidden,
                         intermediate_size=g("feed_forward_length"), num_hidden_layers=g("block_count"),
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                         rms_norm_eps=g("attention.layer_norm_rms_epsilon"), rope_theta=g("rope.freq_base"),
                         max_position_embeddings=g("context_length"),
                         tie_word_embeddings="output.weight" not in tensors)

    def weight(name):
        t = tensors[name]
        shape = [int(x) for x in reversed(t.shape.tolist())]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)

    def unpermute(w, n):  # llama.cpp interleaves each head's two rotary halves; transformers keeps them apart
        return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
    state = {}
    for name in tensors:
        if name in names:
            state[names[name]] = weight(name)
            continue
        _, layer, kind, _ = name.split(".")
        w = weight(name)
        if kind == "attn_q":
            w = unpermute(w, heads)
        elif kind == "attn_k":
            w = unpermute(w, kv_heads)
        state[f"model.layers.{layer}.{per_layer[kind]}.weight"] = w
    model = tf.LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise ValueError(f"GGUF to transformers: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


def build_gguf_model(gguf_path, exe):
    """The GGUF's weights in a transformers model (bf16), and the prompts
    tokenised by DeepInfer's reading of the GGUF's own tokenizer."""
    t0 = time.time()
    model = hf_llama_from_gguf(gguf_path).to(device=DEVICE, dtype=torch.bfloat16).eval()
    lines = "".join(json.dumps({"text": p}) + "\n" for p in GGUF_PROMPTS)
    r = subprocess.run([exe, "tokenize", "--tokenizer", gguf_path], input=lines, capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"deepinfer tokenize failed: {r.stderr[-2000:]}")
    prompts = [json.loads(l)["ids"] for l in r.stdout.splitlines() if l.strip()]
    print(f"[e2e] {os.path.basename(gguf_path)}: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params, "
          f"read into transformers in {time.time() - t0:.1f} s", flush=True)
    return model, prompts


def prompts_for(name, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 17, 64, 130, 300, 700, 1500, 40] if name != "llama8b" else [5, 33, 128, 400, 1000, 60]
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def run_deepinfer(exe, path, prompts, max_tokens, workdir, kv_dtype="auto", quantization="none"):
    inp = os.path.join(workdir, "in.jsonl")
    out = os.path.join(workdir, "out.jsonl")
    with open(inp, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_token_ids": p, "max_tokens": max_tokens, "temperature": 0,
                                "ignore_eos": True, "logprobs": 20}) + "\n")
    cmd = [exe, "generate", "--device", DEVICE, "--model", path, "--input", inp, "--output", out,
           "--max-model-len", "4096", "--kv-cache-memory", str(8 << 30), "--max-num-batched-tokens", "2048",
           "--kv-cache-dtype", kv_dtype, "--quantization", quantization]
    # FP8 weights stay FP8 on the GPU only when asked (docs/quantization.md).
    env = dict(os.environ, DEEPINFER_CUDA_FP8="1") if quantization == "fp8" else None
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"deepinfer failed ({r.returncode}):\n{r.stderr[-4000:]}")
    rows = [json.loads(l) for l in open(out) if l.strip()]
    rows.sort(key=lambda j: j["index"])
    return rows, time.time() - t0, r.stderr[-2000:]


DECISIVE_MARGIN = 0.5


@torch.no_grad()
def compare(model, prompts, row_sets, max_tokens):
    """Teacher-forced on DeepInfer's own continuation: at each generated
    position, DeepInfer's greedy token and top-20 logprobs against
    transformers in bf16 and in f32 (the model upcast), and transformers bf16
    against f32 as the noise floor of bf16 inference itself. row_sets: one
    DeepInfer run per KV-cache dtype; returns one result per run."""
    hf_greedy = [model.generate(torch.tensor([p], device=DEVICE), max_new_tokens=max_tokens, do_sample=False,
                                min_new_tokens=max_tokens, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    forced = {}
    for key, rows in row_sets.items():
        seqs, bf16_rows, greedy_match = [], [], []
        for p, row, hf in zip(prompts, rows, hf_greedy):
            ours = row["token_ids"]
            seq = torch.tensor([p + ours], device=DEVICE)
            pos = torch.arange(len(p) - 1, len(p) - 1 + len(ours), device=DEVICE)
            bf16_rows.append(torch.log_softmax(model(seq).logits[0].float()[pos], dim=-1))
            seqs.append((seq, pos))
            n = 0
            while n < min(len(hf), len(ours)) and hf[n] == ours[n]:
                n += 1
            greedy_match.append(n)
        forced[key] = (seqs, bf16_rows, greedy_match)
    model.float()

    def f32_rows(key):
        return [torch.log_softmax(model(seq).logits[0][pos].float(), dim=-1) for seq, pos in forced[key][0]]
    f32 = {key: f32_rows(key) for key in row_sets if not key.endswith("_w_fp8")}
    fp8_keys = [key for key in row_sets if key.endswith("_w_fp8")]
    if fp8_keys:
        # FP8 weights are checked against transformers in f32 with the same
        # FP8 weights (what our kernels should compute) and against bf16
        # without them (what quantising costs).
        fake_quantize_fp8_(model)
        f32.update({key: f32_rows(key) for key in fp8_keys})
    return {key: score(rows, *forced[key], f32[key], max_tokens) for key, rows in row_sets.items()}


@torch.no_grad()
def fake_quantize_fp8_(model):
    """The linear layers' weights (attention and MLP of every layer; not the
    embeddings, LM head, norms or routers) replaced in place by what
    `--quantization fp8` stores: per 64 elements of a row, scale = max |w| /
    448, codes = e4m3 of w / scale (round to nearest even), value = code *
    scale in f32."""
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or ".layers." not in name or name.endswith(("gate", "router")):
            continue
        w = mod.weight.data.float()
        if w.shape[1] % 64:
            continue
        blocks = w.reshape(w.shape[0], -1, 64)
        scale = blocks.abs().amax(dim=-1, keepdim=True) / 448.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = (blocks / safe).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
        mod.weight.data.copy_((codes * scale).reshape(w.shape))


def score(rows, seqs, bf16_rows, greedy_match, f32_rows, max_tokens):
    stats = {k: 0 for k in ("ours_vs_bf16", "ours_vs_f32", "bf16_vs_f32")}
    diffs = {k: 0.0 for k in stats}
    total = 0
    # Positions where the f32 reference's top-1 leads its top-2 by at least
    # DECISIVE_MARGIN nats: beyond bf16 inference's own noise (max |bf16 - f32|
    # logprob difference is ~0.3 on the random 8B model), so the top-1 is
    # defined; randomly initialised models have mostly near-tied logits.
    decisive = {"positions": 0, "ours_vs_f32": 0, "bf16_vs_f32": 0}
    for row, lb, lf in zip(rows, bf16_rows, f32_rows):
        for i, tok in enumerate(row["token_ids"]):
            top2 = torch.topk(lf[i], 2).values
            if float(top2[0] - top2[1]) >= DECISIVE_MARGIN:
                decisive["positions"] += 1
                decisive["ours_vs_f32"] += int(int(torch.argmax(lf[i])) == tok)
                decisive["bf16_vs_f32"] += int(int(torch.argmax(lb[i])) == int(torch.argmax(lf[i])))
            total += 1
            stats["ours_vs_bf16"] += int(int(torch.argmax(lb[i])) == tok)
            stats["ours_vs_f32"] += int(int(torch.argmax(lf[i])) == tok)
            stats["bf16_vs_f32"] += int(int(torch.argmax(lb[i])) == int(torch.argmax(lf[i])))
            ids = [a["token_id"] for a in row["logprobs"][i]["top_logprobs"]]
            ours_lp = torch.tensor([a["logprob"] for a in row["logprobs"][i]["top_logprobs"]], device=DEVICE)
            diffs["ours_vs_bf16"] = max(diffs["ours_vs_bf16"], float((ours_lp - lb[i][ids]).abs().max()))
            diffs["ours_vs_f32"] = max(diffs["ours_vs_f32"], float((ours_lp - lf[i][ids]).abs().max()))
            diffs["bf16_vs_f32"] = max(diffs["bf16_vs_f32"], float((lb[i][ids] - lf[i][ids]).abs().max()))
    res = {"positions": total, "greedy_prefix_match": greedy_match, "greedy_tokens": max_tokens}
    for k in stats:
        res[f"top1_{k}"] = stats[k] / max(total, 1)
        res[f"max_abs_logprob_diff_{k}"] = diffs[k]
    res["top1_agree"], res["top1_rate"] = stats["ours_vs_bf16"], stats["ours_vs_bf16"] / max(total, 1)
    res["decisive_margin"] = DECISIVE_MARGIN
    res["decisive_positions"] = decisive["positions"]
    res["decisive_top1_ours_vs_f32"] = decisive["ours_vs_f32"] / max(decisive["positions"], 1)
    res["decisive_top1_bf16_vs_f32"] = decisive["bf16_vs_f32"] / max(decisive["positions"], 1)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="qwen3,gemma3,llama8b")
    ap.add_argument("--workdir", default="/tmp/deepinfer_e2e")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--keep", default="llama8b,qwen3", help="model folders to keep for the benchmark")
    ap.add_argument("--kv-cache-dtypes", default="auto", help="DeepInfer runs per model, e.g. auto,fp8")
    ap.add_argument("--quantizations", default="none", help="DeepInfer runs per model by weight format, e.g. none,fp8")
    ap.add_argument("--gguf", default="", help="comma list of GGUF checkpoints to check too (real weights)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    results = {}
    os.makedirs(args.workdir, exist_ok=True)
    def check(model, prompts, runs):
        """runs: {result key: (model path for DeepInfer, KV-cache dtype, weight quantization, its workdir)}."""
        row_sets, seconds = {}, {}
        for key, (path, kv, quant, workdir) in runs.items():
            row_sets[key], seconds[key], _ = run_deepinfer(args.deepinfer, path, prompts, args.max_tokens, workdir, kv,
                                                           quant)
        for key, res in compare(model, prompts, row_sets, args.max_tokens).items():
            res["deepinfer_seconds"] = seconds[key]
            res["prompt_lengths"] = [len(p) for p in prompts]
            results[key] = res
            print(f"[e2e] {key}: {res['positions']} positions; top-1 agreement ours/hf-bf16 "
                  f"{100 * res['top1_ours_vs_bf16']:.1f}%, ours/hf-f32 {100 * res['top1_ours_vs_f32']:.1f}%, "
                  f"hf-bf16/hf-f32 {100 * res['top1_bf16_vs_f32']:.1f}%; max |dlogprob| (top-20) ours/bf16 "
                  f"{res['max_abs_logprob_diff_ours_vs_bf16']:.4f}, ours/f32 {res['max_abs_logprob_diff_ours_vs_f32']:.4f}, "
                  f"bf16/f32 {res['max_abs_logprob_diff_bf16_vs_f32']:.4f}; decisive positions "
                  f"{res['decisive_positions']}: ours/f32 {100 * res['decisive_top1_ours_vs_f32']:.1f}%; greedy prefix "
                  f"match {res['greedy_prefix_match']} of {args.max_tokens}", flush=True)

    # (name, builder of (model, prompts), DeepInfer's model path, where its runs write)
    jobs = [(os.path.basename(g), lambda g=g: build_gguf_model(g, args.deepinfer), g, args.workdir)
            for g in filter(None, args.gguf.split(","))]
    for name in filter(None, args.models.split(",")):
        path = os.path.join(args.workdir, name)

        def build(name=name, path=path):
            model, cfg = build_model(name, path)
            return model, prompts_for(name, cfg.vocab_size)
        jobs.append((name, build, path, path))
    for name, build, path, workdir in jobs:
        model = None
        try:
            model, prompts = build()
            check(model, prompts, {name + ("" if kv == "auto" else f"_kv_{kv}") + ("" if q == "none" else f"_w_{q}"):
                                   (path, kv, q, workdir)
                                   for kv in args.kv_cache_dtypes.split(",") for q in args.quantizations.split(",")})
        except Exception as e:  # keep going: the report says what failed
            results[name] = {"error": str(e)[-3000:]}
            print(f"[e2e] {name}: FAILED: {str(e)[-3000:]}", flush=True)
        finally:
            model = None
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        if os.path.dirname(path) == args.workdir and name not in args.keep.split(","):  # a model made here
            subprocess.run(["rm", "-rf", path])
    json.dump(results, open(os.path.join(args.out, "e2e.json"), "w"), indent=1)
    with open(os.path.join(args.workdir, "e2e.md"), "w") as f:
        f.write("| model | positions | top-1 ours vs HF bf16 / HF f32 (HF bf16 vs f32) | decisive positions "
                f"(f32 margin >= {DECISIVE_MARGIN}): top-1 ours vs f32 (HF bf16 vs f32) | max abs logprob diff "
                "ours vs bf16 / f32 (bf16 vs f32) | greedy prefix match vs HF bf16 |\n|---|---|---|---|---|---|\n")
        for name, r in results.items():
            if "error" in r:
                f.write(f"| {name} | FAILED: {r['error'][:200]!r} | | | |\n")
            else:
                f.write(f"| {name} | {r['positions']} | {100 * r['top1_ours_vs_bf16']:.1f}% / "
                        f"{100 * r['top1_ours_vs_f32']:.1f}% ({100 * r['top1_bf16_vs_f32']:.1f}%) | "
                        f"{r['decisive_positions']}: {100 * r['decisive_top1_ours_vs_f32']:.1f}% "
                        f"({100 * r['decisive_top1_bf16_vs_f32']:.1f}%) | "
                        f"{r['max_abs_logprob_diff_ours_vs_bf16']:.3f} / {r['max_abs_logprob_diff_ours_vs_f32']:.3f} "
                        f"({r['max_abs_logprob_diff_bf16_vs_f32']:.3f}) | {r['greedy_prefix_match']} of {r['greedy_tokens']} |\n")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
