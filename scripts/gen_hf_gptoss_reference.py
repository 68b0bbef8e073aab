#!/usr/bin/env python3
"""Generates a tiny random gpt-oss checkpoint and transformers reference outputs.

The gpt-oss counterpart of gen_hf_moe_reference.py (same reference.json format,
same helpers): a GptOssForCausalLM built with from_config (hidden 64, 3 layers
alternating sliding window 8 / full attention, 8 experts top-2, YaRN rope,
attention sinks, biases everywhere), saved with save_pretrained into
tests/data/hf_tiny/gpt_oss/ in float32. Recorded besides the prompts' logits
and greedy continuations:
  - "expert_hits" / "min_router_margin" as for the other MoE cases,
  - "clamp_hits": how many expert activations hit the clamped SwiGLU's limits
    (gate > limit, |up| > limit) over the prompts, so the clamp matters,
  - "sensitivity": the logit change when one gpt-oss detail is dropped (sinks,
    YaRN, its attention factor, sliding window, clamp, biases, interleaving),
  - "yarn_tables": transformers' inv_freq and attention factor for the tiny
    model's rope and for other YaRN settings (the published gpt-oss one,
    truncation on, DeepSeek's mscale / mscale_all_dim), to compare bit for bit.

The expert weights are drawn large enough that some gate / up activations
exceed the clamp limit (7). config_legacy.json spells the configuration as
transformers 4.x wrote it for the published checkpoints (top-level rope_theta
and rope_scaling).

Requires torch, transformers >= 5, safetensors.
Usage: scripts/gen_hf_gptoss_reference.py [--out DIR] [--only gpt_oss]
"""
import copy
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_tiny_reference import (VOCAB, generate, last_logits, logit_sensitivity,  # noqa: E402
                                   prompt_tokens_for, reference_prompts, save_checkpoint, write_reference)

SEED = 8642
SEED_STEP = 1000
MAX_DRAWS = 20
NAME = "gpt_oss"
ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "original_max_position_embeddings": 64, "truncate": False}
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              max_position_embeddings=512, rms_norm_eps=1e-5, rope_parameters=ROPE, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, attention_bias=True)
# Standard deviation of the expert pre-activations; above ~2.5 some exceed the clamp limit of 7.
EXPERT_PRE_STD = 3.0
# Further YaRN settings whose tables the C++ test compares (head_dim, rope_parameters).
YARN_TABLES = {
    "gpt_oss_published": (64, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False}),
    "truncated": (64, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                       "beta_slow": 1.0, "original_max_position_embeddings": 4096}),
    "deepseek_mscale": (64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 4096}),
    "explicit_attention_factor": (32, {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                       "attention_factor": 1.25, "original_max_position_embeddings": 2048}),
}


def randomise(model, gen):
    """Every parameter drawn so that activations stay O(1), except the experts' pre-activations (std ~3)."""
    h = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("experts.gate_up_proj"):  # [E, H, 2F], [in, out]
                p.copy_(torch.randn(p.shape, generator=gen) * EXPERT_PRE_STD / h ** 0.5)
            elif name.endswith("experts.down_proj"):  # [E, F, H]: inputs up to ~50 after the clamped SwiGLU
                p.copy_(torch.randn(p.shape, generator=gen) / (8.0 * p.shape[1] ** 0.5))
            elif name.endswith("router.bias"):  # small, so that routing does not collapse onto a few experts
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("sinks"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def build(cfg, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", experts_implementation="eager",
                                                 dtype=torch.float32)
    randomise(model, torch.Generator().manual_seed(seed))
    return model.eval()


def routing_and_clamp_stats(model, prompts):
    """Expert hits per layer, the smallest k-th/(k+1)-th routing probability gap, and clamp hits."""
    cfg = model.config
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.router")]
    experts = [m for n, m in model.named_modules() if n.endswith("mlp.experts")]
    records, clamps = [], {"gate_above_limit": 0, "up_outside_limit": 0, "activations": 0}
    hooks = [r.register_forward_hook(lambda mod, inp, out, i=i: records.append((i, out[0].detach())))
             for i, r in enumerate(routers)]

    def counting(mod, apply_gate):
        def wrapped(gate_up):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            clamps["gate_above_limit"] += int((gate > mod.limit).sum())
            clamps["up_outside_limit"] += int((up.abs() > mod.limit).sum())
            clamps["activations"] += gate.numel()
            return apply_gate(gate_up)
        return wrapped

    for e in experts:
        e._apply_gate = counting(e, e._apply_gate)
    min_gap = float("inf")
    k, n_experts = cfg.num_experts_per_tok, cfg.num_local_experts
    hits = [[0] * n_experts for _ in routers]
    for tokens in prompts:
        records.clear()
        last_logits(model, tokens)
        for layer, logits in records:
            probs = torch.softmax(logits.float(), dim=-1)
            top = torch.topk(probs, k + 1, dim=-1)
            min_gap = min(min_gap, float((top.values[:, k - 1] - top.values[:, k]).min()))
            for row in top.indices[:, :k].tolist():
                for e in row:
                    hits[layer][e] += 1
    for h in hooks:
        h.remove()
    for e in experts:
        del e._apply_gate  # back to the class's method
    return hits, min_gap, clamps


def variants():
    """name -> function(config, state_dict) changing one gpt-oss detail."""
    def cfg_change(**kw):
        def apply(cfg, sd):
            for key, v in kw.items():
                setattr(cfg, key, v)
        return apply

    def sd_change(fn):
        def apply(cfg, sd):
            for key in list(sd):
                new = fn(key, sd[key])
                if new is not None:
                    sd[key] = new
        return apply

    def no_interleave(key, t):
        # gate/up read as halves (Mixtral's fused layout) instead of interleaved
        if key.endswith("experts.gate_up_proj"):
            f = t.shape[-1] // 2
            return torch.stack([t[..., :f], t[..., f:]], dim=-1).reshape(t.shape)
        return None

    return {
        "no_sinks": sd_change(lambda k, t: torch.full_like(t, -1e30) if k.endswith("sinks") else None),
        "no_yarn": cfg_change(rope_parameters={"rope_type": "default", "rope_theta": ROPE["rope_theta"]}),
        "yarn_attention_factor_1": cfg_change(rope_parameters=dict(ROPE, attention_factor=1.0)),
        "yarn_truncated": cfg_change(rope_parameters=dict(ROPE, truncate=True)),
        "no_sliding_window": cfg_change(layer_types=["full_attention"] * CONFIG["num_hidden_layers"]),
        "no_clamp": cfg_change(swiglu_limit=1e9),
        "no_expert_bias": sd_change(lambda k, t: torch.zeros_like(t) if "experts" in k and k.endswith("_bias")
                                    else None),
        "no_router_bias": sd_change(lambda k, t: torch.zeros_like(t) if k.endswith("router.bias") else None),
        "no_o_proj_bias": sd_change(lambda k, t: torch.zeros_like(t) if k.endswith("o_proj.bias") else None),
        "gate_up_halves": sd_change(no_interleave),
    }


def yarn_table(head_dim, rope_parameters):
    max_position = int(rope_parameters["factor"] * rope_parameters["original_max_position_embeddings"])
    cfg = GptOssConfig(head_dim=head_dim, hidden_size=head_dim * 4, num_attention_heads=4,
                       max_position_embeddings=max_position, rope_parameters=copy.deepcopy(rope_parameters))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    return {"head_dim": head_dim, "rope_parameters": rope_parameters, "max_position_embeddings": max_position,
            "inv_freq": [float(x) for x in inv_freq.float()], "attention_factor": float(attention_factor)}


def make_case(name, config, out_dir, index):
    cfg = GptOssConfig(**config)
    for draw in range(MAX_DRAWS):
        seed = SEED + index + SEED_STEP * draw
        model = build(cfg, seed)
        prompt_tokens = prompt_tokens_for(seed)
        hits, min_gap, clamps = routing_and_clamp_stats(model, prompt_tokens)
        if all(min(layer) > 0 for layer in hits) and clamps["gate_above_limit"] and clamps["up_outside_limit"]:
            break
    else:
        raise SystemExit(f"no draw in {MAX_DRAWS} routes a token to every expert and hits both clamps")
    folder = os.path.join(out_dir, name)
    legacy_rope = {k: v for k, v in ROPE.items() if k != "rope_theta"}
    saved = save_checkpoint(model, folder, {"rope_theta": ROPE["rope_theta"], "rope_scaling": legacy_rope})
    prompts = reference_prompts(model, prompt_tokens)
    sensitivity = logit_sensitivity(model, cfg, variants(), prompts, experts_implementation="eager")

    rotary = model.model.rotary_emb
    tables = {"tiny_model": {"head_dim": CONFIG["head_dim"], "rope_parameters": ROPE,
                             "max_position_embeddings": CONFIG["max_position_embeddings"],
                             "inv_freq": [float(x) for x in rotary.inv_freq.float()],
                             "attention_factor": float(rotary.attention_scaling)}}
    for tname, (head_dim, rp) in YARN_TABLES.items():
        tables[tname] = yarn_table(head_dim, rp)

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    reference = {
        "case": name,
        "architecture": saved["architectures"][0],
        "weights_dtype": "float32",
        "expert_layout": "stacked_in_out_interleaved",
        "tie_word_embeddings": saved.get("tie_word_embeddings"),
        "safetensors_files": files,
        "sharded": False,
        "vocab_size": VOCAB,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "reference_compute_dtype": "float32",
        "num_experts": cfg.num_local_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "expert_hits": hits,
        "min_router_margin": min_gap,
        "clamp_hits": clamps,
        "sensitivity_max_abs_logit_change": sensitivity,
        "yarn_tables": tables,
        "prompts": prompts,
    }
    write_reference(folder, reference)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{name}: {size / 1024:.0f} KiB seed={seed} max|logit|={max(p['max_abs_logit'] for p in prompts):.2f} "
          f"min margin={min(min(p['greedy_margins']) for p in prompts):.4f} min router margin={min_gap:.2e} "
          f"hits={hits} clamps={clamps} sensitivity={sensitivity}")


def main():
    generate(make_case, {NAME: CONFIG})


if __name__ == "__main__":
    main()
