#!/usr/bin/env python3
"""Generates tiny random mixture-of-experts checkpoints and transformers reference outputs.

The MoE counterpart of gen_hf_tiny_reference.py (whose helpers it reuses), for
Mixtral, Qwen2-MoE and Qwen3-MoE. Each case is a small randomly initialised
model (from_config) saved into tests/data/hf_tiny/<case>/ with reference.json
in the same format as the dense cases (last-position logits in float32,
greedy continuations with their top-1/top-2 margins, "sensitivity" of the
logits to routing details), plus MoE facts the C++ tests check:
  - "expert_hits": per MoE layer, how many of the prompts' tokens chose each
    expert (every expert must be hit, so every expert's weights matter),
  - "min_router_margin": the smallest gap, over all tokens and MoE layers of
    the prompts, between the k-th and (k+1)-th routing probability (a tiny gap
    would let float rounding pick a different expert).

Expert weight layouts: transformers 5 holds experts stacked (experts.gate_up_proj
[E, 2F, H], experts.down_proj [E, H, F]); save_pretrained converts them back to
the per-expert tensors of published checkpoints (Mixtral
block_sparse_moe.experts.N.w1/w2/w3, Qwen mlp.experts.N.gate_proj/up_proj/
down_proj) unless save_original_format=False, which writes the stacks. Cases
named *_fused are saved that way, the others per expert.

config_legacy.json spells each configuration as transformers 4 wrote it
(top-level rope_theta; Qwen3-MoE's num_experts rather than num_local_experts;
no qkv_bias / layer_types for Qwen2-MoE).

Requires torch, transformers >= 5, safetensors.
Usage: scripts/gen_hf_moe_reference.py [--out DIR] [--only CASE]
"""
import copy
import os
import sys

import torch
import transformers
from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_tiny_reference import (VOCAB, build, generate, last_logits, logit_sensitivity,  # noqa: E402
                                   prompt_tokens_for, reference_prompts, save_checkpoint, write_reference)

SEED = 4321
# Random routers favour some experts (the normed hidden states share a mean
# direction), so a draw may leave an expert unused by every prompt; the next
# seed (+SEED_STEP) is tried then, up to MAX_DRAWS times.
SEED_STEP = 1000
MAX_DRAWS = 20
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              tie_word_embeddings=False)
ROPE = {"rope_type": "default", "rope_theta": 1000000.0}


def cases():
    """name -> (config, dtype, save_original_format, legacy fields, sensitivity variants)."""
    out = {}
    mixtral = dict(COMMON, intermediate_size=48, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
                   sliding_window=None, rope_parameters=ROPE)
    out["mixtral"] = (MixtralConfig(**mixtral), torch.float32, True, {"rope_theta": 1000000.0},
                      {"top_1": {"num_experts_per_tok": 1}})
    out["mixtral_fused"] = (MixtralConfig(**dict(mixtral, num_local_experts=4)), torch.float32, False,
                            {"rope_theta": 1000000.0}, {"top_3": {"num_experts_per_tok": 3}})
    qwen2 = dict(COMMON, intermediate_size=96, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=False,
                 mlp_only_layers=[1], use_sliding_window=False, rope_parameters=ROPE)
    out["qwen2_moe"] = (Qwen2MoeConfig(**qwen2), torch.float32, True,
                        {"rope_theta": 1000000.0, "qkv_bias": None, "layer_types": None},
                        {"norm_topk_prob": {"norm_topk_prob": True}})
    qwen3 = dict(COMMON, head_dim=32, intermediate_size=96, num_hidden_layers=3, num_experts=8,
                 num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2,
                 use_sliding_window=False, rope_parameters=ROPE)
    legacy3 = {"rope_theta": 1000000.0, "num_experts": 8, "num_local_experts": None}
    out["qwen3_moe"] = (Qwen3MoeConfig(**qwen3), torch.float32, True, legacy3,
                        {"no_norm_topk_prob": {"norm_topk_prob": False}})
    out["qwen3_moe_bf16_fused"] = (Qwen3MoeConfig(**dict(qwen3, decoder_sparse_step=1, num_hidden_layers=2)),
                                   torch.bfloat16, False, legacy3, {})
    return out


def moe_gates(model):
    return [m for name, m in model.named_modules() if name.endswith("mlp.gate") or name.endswith("block_sparse_moe.gate")]


def routing_stats(model, prompts, top_k, n_experts):
    """Expert hit counts over the prompts' tokens and the smallest k-th/(k+1)-th probability gap."""
    records = []
    hooks = [g.register_forward_hook(lambda mod, inp, out, i=i: records.append((i, out[0].detach())))
             for i, g in enumerate(moe_gates(model))]
    min_gap = float("inf")
    hits = [[0] * n_experts for _ in range(len(hooks))]
    for tokens in prompts:
        records.clear()
        last_logits(model, tokens)
        for layer, logits in records:
            probs = torch.softmax(logits.float(), dim=-1)
            top = torch.topk(probs, min(top_k + 1, n_experts), dim=-1)
            if top_k < n_experts:
                min_gap = min(min_gap, float((top.values[:, top_k - 1] - top.values[:, top_k]).min()))
            for row in top.indices[:, :top_k].tolist():
                for e in row:
                    hits[layer][e] += 1
    for h in hooks:
        h.remove()
    return hits, min_gap


def make_case(name, spec, out_dir, index):
    cfg, dtype, original_format, legacy, variants = spec
    n_experts = cfg.num_local_experts if hasattr(cfg, "num_local_experts") else cfg.num_experts
    for draw in range(MAX_DRAWS):
        seed = SEED + index + SEED_STEP * draw
        model = build(cfg, dtype, seed, False)
        prompt_tokens = prompt_tokens_for(seed)
        hits, min_gap = routing_stats(model, prompt_tokens, cfg.num_experts_per_tok, n_experts)
        if all(min(layer) > 0 for layer in hits):
            break
    else:
        raise SystemExit(f"{name}: no draw in {MAX_DRAWS} routes a token to every expert")
    folder = os.path.join(out_dir, name)
    to_save = copy.deepcopy(model).to(dtype) if dtype != torch.float32 else model
    saved = save_checkpoint(to_save, folder, legacy, save_original_format=original_format)
    prompts = reference_prompts(model, prompt_tokens)
    sensitivity = logit_sensitivity(model, cfg, variants, prompts)

    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    reference = {
        "case": name,
        "architecture": saved["architectures"][0],
        "weights_dtype": str(dtype).replace("torch.", ""),
        "expert_layout": "per_expert" if original_format else "stacked",
        "tie_word_embeddings": saved.get("tie_word_embeddings"),
        "safetensors_files": files,
        "sharded": False,
        "vocab_size": VOCAB,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": "eager",
        "reference_compute_dtype": "float32",
        "num_experts": n_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "expert_hits": hits,
        "min_router_margin": min_gap,
        "sensitivity_max_abs_logit_change": sensitivity,
        "prompts": prompts,
    }
    write_reference(folder, reference)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    print(f"{name}: {saved['architectures'][0]} {dtype} {reference['expert_layout']} {size / 1024:.0f} KiB "
          f"max|logit|={max(p['max_abs_logit'] for p in prompts):.2f} "
          f"min margin={min(min(p['greedy_margins']) for p in prompts):.4f} "
          f"min router margin={min_gap:.2e} hits={hits} sensitivity={sensitivity}")


def main():
    generate(make_case, cases())


if __name__ == "__main__":
    main()
