#!/usr/bin/env python3
"""Generates tiny random DeepSeek-V2 / V3 checkpoints and transformers reference outputs.

The Multi-head Latent Attention counterpart of gen_hf_moe_reference.py (same
reference.json format, helpers from gen_hf_tiny_reference.py). Cases:
  - deepseek_v2_lite: no q_lora (q_proj), greedy softmax top-k, default rope,
    one dense layer first (first_k_dense_replace=1), two shared experts;
  - deepseek_v2: q_lora (q_a_proj / q_a_layernorm / q_b_proj),
    group_limited_greedy (a group's score is its best expert), routed scaling,
    YaRN rope with mscale == mscale_all_dim (softmax scale x mscale^2);
  - deepseek_v3: noaux_tc routing (sigmoid + e_score_correction_bias, a group's
    score is the sum of its two best), norm_topk_prob, routed_scaling_factor,
    YaRN with mscale != mscale_all_dim (cos/sin scaled too), rope_interleave,
    first_k_dense_replace=1; saved with stacked expert tensors.
Every parameter is random (norm weights too) and so is V3's correction bias
(a buffer transformers initialises to zeros), so each routing detail matters.

reference.json adds to the MoE format:
  - "expert_hits": per MoE layer, how many prompt tokens chose each expert,
  - "min_router_margin": over the prompts' tokens and MoE layers, the smallest
    gap between the k-th and (k+1)-th selection score among the allowed
    experts, and between the last chosen and the first dropped group score,
  - "kv_cache_row": kv_lora_rank + qk_rope_head_dim, what one cached token holds.

config_legacy.json spells each configuration as transformers 4 / the Hub
checkpoints do (top-level rope_theta and rope_scaling with "type").

Requires torch, transformers >= 5, safetensors.
Usage: scripts/gen_hf_mla_reference.py [--out DIR] [--only CASE]
"""
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_tiny_reference import (VOCAB, generate, last_logits, logit_sensitivity,  # noqa: E402
                                   prompt_tokens_for, randomise, reference_prompts, save_checkpoint,
                                   write_reference)

SEED = 8765
SEED_STEP = 1000
MAX_DRAWS = 30
MIN_ROUTER_MARGIN = 1e-4
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
              max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              tie_word_embeddings=False, num_hidden_layers=3, first_k_dense_replace=1, kv_lora_rank=32,
              qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24)
V2_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
           "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
V3_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 16,
           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def legacy_rope(rp):
    """transformers 4 / Hub spelling: top-level rope_theta, rope_scaling with "type"."""
    out = {"rope_theta": rp["rope_theta"]}
    if rp["rope_type"] != "default":
        scaling = {k: v for k, v in rp.items() if k not in ("rope_type", "rope_theta")}
        out["rope_scaling"] = dict(scaling, type=rp["rope_type"])
    return out


def cases():
    """name -> (config, save_original_format, legacy fields, sensitivity variants)."""
    out = {}
    lite = dict(COMMON, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
                moe_intermediate_size=24, topk_method="greedy", routed_scaling_factor=1.0,
                rope_parameters=DEFAULT_ROPE)
    out["deepseek_v2_lite"] = (DeepseekV2Config(**lite), True, legacy_rope(DEFAULT_ROPE),
                               {"top_1": {"num_experts_per_tok": 1}})
    # Three experts from two groups of two: group-limited picks differ from plain top-k.
    v2 = dict(COMMON, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
              moe_intermediate_size=24, topk_method="group_limited_greedy", n_group=4, topk_group=2,
              routed_scaling_factor=1.5, rope_parameters=V2_YARN)
    out["deepseek_v2"] = (DeepseekV2Config(**v2), True, legacy_rope(V2_YARN),
                          {"no_rope_scaling": {"rope_parameters": DEFAULT_ROPE},
                           "greedy_routing": {"topk_method": "greedy"},
                           "no_routed_scaling": {"routed_scaling_factor": 1.0}})
    v3 = dict(COMMON, q_lora_rank=48, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
              moe_intermediate_size=16, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
              rope_interleave=True, rope_parameters=V3_YARN)
    out["deepseek_v3"] = (DeepseekV3Config(**v3), False, legacy_rope(V3_YARN),
                          {"no_rope_scaling": {"rope_parameters": DEFAULT_ROPE},
                           "no_mscale_all_dim": {"rope_parameters": dict(V3_YARN, mscale_all_dim=0.0)},
                           "rope_not_interleaved": {"rope_interleave": False},
                           "no_norm_topk_prob": {"norm_topk_prob": False},
                           "no_groups": {"n_group": 1, "topk_group": 1}})
    return out


def build(cfg, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    randomise(model, False, gen)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen))
    return model.eval()


def gates(model):
    return [m for name, m in model.named_modules() if name.endswith("mlp.gate")]


def selection(gate, logits):
    """(choice scores with disallowed experts at -inf, group scores or None) as the router ranks them."""
    cfg = gate
    if hasattr(gate, "e_score_correction_bias"):  # V3 noaux_tc
        scores = logits.sigmoid() + gate.e_score_correction_bias
        groups = scores.view(-1, gate.num_group, gate.num_experts // gate.num_group).topk(2, dim=-1)[0].sum(-1)
    else:
        scores = logits.softmax(dim=-1)
        if cfg.topk_method != "group_limited_greedy":
            return scores, None
        groups = scores.view(-1, gate.num_group, gate.num_experts // gate.num_group).max(dim=-1).values
    keep = torch.zeros_like(groups).scatter_(1, torch.topk(groups, gate.topk_group, dim=-1)[1], 1)
    mask = keep.unsqueeze(-1).expand(-1, gate.num_group, gate.num_experts // gate.num_group).reshape(scores.shape)
    return scores.masked_fill(mask == 0, float("-inf")), groups


def routing_stats(model, prompts):
    records = []
    hooks = [g.register_forward_hook(lambda mod, inp, out, i=i: records.append((i, mod, out[0].detach(), out[2])))
             for i, g in enumerate(gates(model))]
    n_experts = gates(model)[0].num_experts
    hits = [[0] * n_experts for _ in hooks]
    min_gap = float("inf")
    for tokens in prompts:
        records.clear()
        last_logits(model, tokens)
        for layer, gate, logits, chosen in records:
            scores, groups = selection(gate, logits.float())
            k = gate.top_k
            top = torch.topk(scores, k + 1, dim=-1).values
            allowed_next = top[:, k]
            gap = torch.where(torch.isinf(allowed_next), torch.full_like(allowed_next, float("inf")),
                              top[:, k - 1] - allowed_next)
            min_gap = min(min_gap, float(gap.min()))
            if groups is not None and gate.topk_group < gate.num_group:
                g = torch.topk(groups, gate.topk_group + 1, dim=-1).values
                min_gap = min(min_gap, float((g[:, -2] - g[:, -1]).min()))
            for row in chosen.tolist():
                for e in row:
                    hits[layer][e] += 1
    for h in hooks:
        h.remove()
    return hits, min_gap


def make_case(name, spec, out_dir, index):
    cfg, original_format, legacy, variants = spec
    for draw in range(MAX_DRAWS):
        seed = SEED + index + SEED_STEP * draw
        model = build(cfg, seed)
        prompt_tokens = prompt_tokens_for(seed)
        hits, min_gap = routing_stats(model, prompt_tokens)
        if all(min(layer) > 0 for layer in hits) and min_gap > MIN_ROUTER_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no draw in {MAX_DRAWS} uses every expert with clear routing margins")
    folder = os.path.join(out_dir, name)
    saved = save_checkpoint(model, folder, legacy, save_original_format=original_format)
    prompts = reference_prompts(model, prompt_tokens)
    sensitivity = logit_sensitivity(model, cfg, variants, prompts)

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    reference = {
        "case": name,
        "architecture": saved["architectures"][0],
        "weights_dtype": "float32",
        "expert_layout": "per_expert" if original_format else "stacked",
        "q_lora_rank": cfg.q_lora_rank,
        "kv_cache_row": cfg.kv_lora_rank + cfg.qk_rope_head_dim,
        "safetensors_files": files,
        "vocab_size": VOCAB,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": "eager",
        "reference_compute_dtype": "float32",
        "num_experts": cfg.n_routed_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "expert_hits": hits,
        "min_router_margin": min_gap,
        "sensitivity_max_abs_logit_change": sensitivity,
        "prompts": prompts,
    }
    write_reference(folder, reference)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{name}: {saved['architectures'][0]} {reference['expert_layout']} {size / 1024:.0f} KiB seed={seed} "
          f"max|logit|={max(p['max_abs_logit'] for p in prompts):.2f} "
          f"min margin={min(min(p['greedy_margins']) for p in prompts):.4f} "
          f"min router margin={min_gap:.2e} hits={hits} sensitivity={sensitivity}")


def main():
    generate(make_case, cases())


if __name__ == "__main__":
    main()
