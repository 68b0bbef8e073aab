#!/usr/bin/env python3
"""Adds a random multi-token-prediction (MTP) layer to the tiny DeepSeek-V3
checkpoint and writes a reference for it.

transformers does not run DeepSeek-V3's MTP layers (it drops the weights of
layer num_hidden_layers), so the reference is assembled here from
transformers' own modules, the way vLLM runs DeepSeek's MTP layer:

  x_i      = eh_proj(concat(enorm(embed(t_{i+1})) [0 at position 0], hnorm(h_i)))
  g_i      = DeepseekV3DecoderLayer #num_hidden_layers (causal over x_0..x_i)
  logits_i = shared_head.head(shared_head.norm(g_i))   (predicts t_{i+2})

where h_i is the decoder's final hidden state after its norm
(last_hidden_state). A draft chain feeds g_i as the next position's hidden
state with the drafted token.

Input: tests/data/hf_tiny/deepseek_v3 (the decoder, unchanged). Output:
tests/data/hf_tiny/deepseek_v3_mtp/: the same config.json, model.safetensors
with the decoder's tensors plus model.layers.3.* (the MTP layer in
transformers' saved format, with its own embed_tokens and shared_head, drawn
apart from the decoder's so a mix-up shows), and mtp_reference.json:
  per prompt: the decoder's greedy sequence (prompt + continuation), the MTP
  layer's logits at the prompt's last position (its first draft after
  prefill) and, for the chain, the logits at the next position when fed its
  own hidden state and its argmax; plus the argmax margins.

Also writes tests/data/hf_tiny/deepseek_v3_mtp_oracle/ (bf16): the same
shapes with every attention output and feed-forward down projection zeroed,
so the decoder is a bigram model (next token = f(token)), and an MTP layer
built to predict exactly that one step further: eh_proj passes the
normalised embedding through (identity | zero), its block adds nothing, and
its head is the decoder's norm and lm_head. Its drafts are what the decoder
will produce (up to rounding near ties), so speculation with it must accept
nearly every draft: an end-to-end check that the engine feeds the layer the
right tokens and turns accepted drafts into fewer steps.

Requires torch, transformers >= 5, safetensors.
Usage: scripts/gen_hf_mtp_reference.py [--data DIR]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hf_tiny_reference import REPO, f32_list, greedy, margin, randomise  # noqa: E402

SEED = 4242
N_CONTINUATION = 8
SOURCE = "deepseek_v3"
CASE = "deepseek_v3_mtp"


def mtp_modules(cfg, gen):
    """A 4-layer model whose layer 3 is the MTP block, plus the MTP's own norms and projections."""
    big_cfg = DeepseekV3Config.from_dict(cfg.to_dict())
    big_cfg.num_hidden_layers = cfg.num_hidden_layers + 1
    big = AutoModelForCausalLM.from_config(big_cfg, attn_implementation="eager", dtype=torch.float32)
    randomise(big, False, gen)
    with torch.no_grad():
        for name, buf in big.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen))
    H, V = cfg.hidden_size, cfg.vocab_size
    extra = {
        "enorm.weight": 1.0 + 0.3 * torch.randn(H, generator=gen),
        "hnorm.weight": 1.0 + 0.3 * torch.randn(H, generator=gen),
        "eh_proj.weight": torch.randn(H, 2 * H, generator=gen) / (2 * H) ** 0.5,
        "shared_head.norm.weight": 1.0 + 0.3 * torch.randn(H, generator=gen),
        "shared_head.head.weight": 0.5 * torch.randn(V, H, generator=gen),
        "embed_tokens.weight": 0.5 * torch.randn(V, H, generator=gen),
    }
    return big.eval(), extra


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def mtp_forward(big, extra, cfg, tokens_next, hidden):
    """The MTP layer over positions 0..n-1: tokens_next[i] is t_{i+1}, hidden[i] is h_i (or a chained g)."""
    n = len(tokens_next)
    eps = cfg.rms_norm_eps
    with torch.no_grad():
        e = extra["embed_tokens.weight"][torch.tensor(tokens_next)]
        e[0] = 0.0  # position 0 (vLLM's masking)
        x = torch.cat([rms_norm(e, extra["enorm.weight"], eps), rms_norm(hidden, extra["hnorm.weight"], eps)], -1)
        x = (x @ extra["eh_proj.weight"].T).unsqueeze(0)
        pos = torch.arange(n).unsqueeze(0)
        mask = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)
        layer = big.model.layers[cfg.num_hidden_layers]
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=big.model.rotary_emb(x, pos))
        g = (out[0] if isinstance(out, tuple) else out)[0]
        logits = rms_norm(g, extra["shared_head.norm.weight"], eps) @ extra["shared_head.head.weight"].T
    return g, logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(REPO, "tests", "data", "hf_tiny"))
    args = ap.parse_args()
    src = os.path.join(args.data, SOURCE)
    out_dir = os.path.join(args.data, CASE)
    target = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", dtype=torch.float32).eval()
    cfg = target.config
    assert cfg.num_nextn_predict_layers == 1, "the source config declares one MTP layer"
    gen = torch.Generator().manual_seed(SEED)
    big, extra = mtp_modules(cfg, gen)
    mtp = cfg.num_hidden_layers

    # The checkpoint: the decoder's tensors as they are, the MTP block's as
    # transformers saves a decoder layer, and the MTP extras.
    tensors = load_file(os.path.join(src, "model.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        big.save_pretrained(tmp, safe_serialization=True)
        saved = {}
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".safetensors"):
                saved.update(load_file(os.path.join(tmp, f)))
    prefix = f"model.layers.{mtp}."
    block = {k: v for k, v in saved.items() if k.startswith(prefix)}
    assert block, "the saved 4-layer model has no layer 3"
    tensors.update(block)
    tensors.update({prefix + k: v.contiguous() for k, v in extra.items()})
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), os.path.join(out_dir, "config.json"))

    with open(os.path.join(src, "reference.json")) as f:
        source_ref = json.load(f)
    prompts = []
    for p in source_ref["prompts"]:
        tokens = p["tokens"]
        cont, margins = greedy(target, tokens, N_CONTINUATION)
        seq = tokens + cont
        with torch.no_grad():
            hidden = target.model(torch.tensor([seq])).last_hidden_state[0]
        L = len(tokens)
        # Catch-up after prefill: positions 0..L-1 with next tokens seq[1..L].
        g, logits = mtp_forward(big, extra, cfg, seq[1:L + 1], hidden[:L])
        first = logits[L - 1]
        d1 = int(torch.argmax(first))
        # Chain: position L takes g_{L-1} as its hidden state and d1 as its token.
        g2, logits2 = mtp_forward(big, extra, cfg, seq[1:L + 1] + [d1], torch.cat([hidden[:L], g[L - 1:L]]))
        chained = logits2[L]
        prompts.append({
            "name": p["name"], "tokens": tokens, "greedy_tokens": cont, "greedy_margins": margins,
            "first_draft_logits": f32_list(first), "first_draft_margin": margin(first),
            "first_draft_max_abs_logit": float(first.abs().max()),
            "chained_logits": f32_list(chained), "chained_margin": margin(chained),
            "chained_max_abs_logit": float(chained.abs().max()),
        })
    reference = {
        "case": CASE, "source": SOURCE, "mtp_layer": mtp, "seed": SEED,
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "reference_compute_dtype": "float32", "vocab_size": cfg.vocab_size, "prompts": prompts,
    }
    with open(os.path.join(out_dir, "mtp_reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    write_oracle(src, os.path.join(args.data, CASE + "_oracle"), cfg)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    print(f"{CASE}: {size / 1024:.0f} KiB, MTP layer {mtp} ({len(block)} block tensors), margins "
          f"{[round(p['first_draft_margin'], 3) for p in prompts]} / {[round(p['chained_margin'], 3) for p in prompts]}")


def write_oracle(src, out_dir, cfg):
    """The bigram decoder and its exact MTP layer (see the module docstring), in bf16."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    H = cfg.hidden_size
    mtp = f"model.layers.{cfg.num_hidden_layers}."
    out = {}
    for name, t in tensors.items():
        if name.endswith("o_proj.weight") or "down_proj" in name:
            t = torch.zeros_like(t)  # every layer adds nothing to the residual
        out[name] = t
    # The MTP block: the decoder's layer 1 (MoE) with its outputs zeroed too.
    for name, t in list(out.items()):
        if name.startswith("model.layers.1."):
            out[mtp + name[len("model.layers.1."):]] = t.clone()
    out[mtp + "enorm.weight"] = torch.ones(H)
    out[mtp + "hnorm.weight"] = torch.ones(H)
    out[mtp + "eh_proj.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], dim=1)
    out[mtp + "shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
    out[mtp + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    out[mtp + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    out = {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["dtype"] = "bfloat16"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{os.path.basename(out_dir)}: {os.path.getsize(os.path.join(out_dir, 'model.safetensors')) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
