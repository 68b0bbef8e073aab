#!/usr/bin/env python3
"""Generates tiny random Hugging Face checkpoints and transformers reference outputs.

For every dense architecture DeepInfer reads from a Hugging Face folder
(config.json + *.safetensors) this builds a small randomly initialised model
with transformers' from_config, saves it with save_pretrained into
tests/data/hf_tiny/<case>/ and records, in <case>/reference.json, for a few
prompts of token ids:
  - the last-position logits (float32),
  - a greedy continuation (argmax, recomputing the full sequence every step, so
    no KV-cache code of transformers is involved) with the top-1/top-2 margin
    of every step,
  - "sensitivity": how far the logits move when one architectural detail is
    dropped (rope scaling, sliding window, ...), which shows that the test's
    tolerance can tell a correct implementation from one ignoring that detail.

All parameters are randomised, norm weights included (so Gemma's (1 + w)
convention matters) and biases (Qwen2). Weights are drawn at a scale that
keeps activations O(1), so logits are O(10) with clear top-2 margins.

transformers >= 5 saves rotary settings as "rope_parameters"; checkpoints on
the Hub written by earlier versions use top-level "rope_theta",
"rope_scaling" and (Gemma 3) "rope_local_base_freq". Each case therefore also
gets config_legacy.json: the same configuration in the older spelling. The
C++ test loads the folder with each of the two files as config.json.

The bf16 case stores bfloat16 weights; its reference is computed in float32
from those rounded weights (what an engine with f32 activations computes).

A byte-level BPE tokenizer with exactly VOCAB tokens is saved once as
tests/data/hf_tiny/tokenizer.json so the Engine can be driven end to end.

Requires torch, transformers, safetensors, tokenizers (pip install).
Usage: scripts/gen_hf_tiny_reference.py [--out DIR] [--only CASE]
"""
import argparse
import copy
import json
import os
import shutil

import torch
import transformers
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,
                          Qwen2Config, Qwen3Config)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 320
PROMPT_LENGTHS = [1, 5, 23, 40]
N_CONTINUATION = 16
SEED = 1234

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def cases():
    """name -> (config, dtype, save kwargs, legacy fields, sensitivity variants)."""
    out = {}
    out["llama"] = (LlamaConfig(**COMMON, num_hidden_layers=2, tie_word_embeddings=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                    torch.float32, {}, {"rope_theta": 10000.0}, {})
    out["llama31_untied"] = (
        LlamaConfig(**COMMON, num_hidden_layers=2, tie_word_embeddings=False,
                    rope_parameters={**LLAMA31_ROPE, "rope_theta": 500000.0}),
        torch.float32, {}, {"rope_theta": 500000.0, "rope_scaling": LLAMA31_ROPE},
        {"no_rope_scaling": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
         "rope_theta_10000": {"rope_parameters": {**LLAMA31_ROPE, "rope_theta": 10000.0}}})
    out["mistral_window8"] = (
        MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=8, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        torch.float32, {}, {"rope_theta": 1000000.0},
        {"no_sliding_window": {"sliding_window": None}})
    out["qwen2_bias"] = (
        Qwen2Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=True, use_sliding_window=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        torch.float32, {}, {"rope_theta": 1000000.0}, {})
    qwen3 = dict(COMMON, head_dim=32)  # q_dim 128 != hidden 64, as in real Qwen3 models
    out["qwen3_qknorm"] = (
        Qwen3Config(**qwen3, num_hidden_layers=2, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        torch.float32, {}, {"rope_theta": 1000000.0}, {})
    gemma_layers = ["sliding_attention", "sliding_attention", "full_attention"]
    gemma_rope = {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}
    out["gemma3"] = (
        Gemma3TextConfig(**COMMON, num_hidden_layers=3, layer_types=gemma_layers, sliding_window=8,
                         query_pre_attn_scalar=24, tie_word_embeddings=True, rope_parameters=gemma_rope,
                         hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                         attn_logit_softcapping=None),
        torch.float32, {},
        # Configs from transformers 4.50-4.52 (e.g. gemma-3-1b) give the pattern, not layer_types.
        {"rope_theta": 1000000.0, "rope_local_base_freq": 20000.0, "sliding_window_pattern": 3,
         "layer_types": None},
        {"no_sliding_window": {"sliding_window": 4096},
         "query_pre_attn_scalar_head_dim": {"query_pre_attn_scalar": 16},
         "local_rope_theta_10000": {"rope_parameters": {**gemma_rope, "sliding_attention": {
             "rope_type": "default", "rope_theta": 10000.0}}},
         "global_rope_theta_10000": {"rope_parameters": {**gemma_rope, "full_attention": {
             "rope_type": "default", "rope_theta": 10000.0}}}})
    out["llama_sharded"] = (LlamaConfig(**COMMON, num_hidden_layers=2, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                            torch.float32, {"max_shard_size": "100KB"}, {"rope_theta": 10000.0}, {})
    out["qwen2_bf16"] = (
        Qwen2Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=True, use_sliding_window=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        torch.bfloat16, {}, {"rope_theta": 1000000.0}, {})
    return out


def randomise(model, is_gemma, gen):
    """Draws every parameter so that activations stay O(1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma scales by (1 + w): w near 0; the others scale by w: near 1.
                base = 0.0 if is_gemma else 1.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                # Logits are normed activations (|h| ~ 8) times these rows: std ~4.
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if is_gemma else 0.5))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def last_logits(model, tokens):
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False)
    return out.logits[0, -1].float()


def margin(logits):
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def greedy(model, tokens, n):
    seq, margins = list(tokens), []
    for _ in range(n):
        lg = last_logits(model, seq)
        margins.append(margin(lg))
        seq.append(int(torch.argmax(lg)))
    return seq[len(tokens):], margins


def f32_list(t):
    return [float(f"{float(x):.9g}") for x in t]


def legacy_config(saved, legacy):
    """The config.json a transformers 4.x save_pretrained would have written (None drops a key)."""
    cfg = copy.deepcopy(saved)
    cfg.pop("rope_parameters", None)
    cfg.pop("_sliding_window_pattern", None)
    cfg.update(legacy)
    return {k: v for k, v in cfg.items() if v is not None or k not in legacy}


def build(cfg, dtype, seed, is_gemma):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomise(model, is_gemma, torch.Generator().manual_seed(seed))
    if dtype != torch.float32:
        # Round the parameters only: Module.to() would also round buffers such
        # as the rotary inv_freq, which transformers keeps in f32.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).to(torch.float32))
    return model.eval()


def prompt_tokens_for(seed):
    """The reference prompts' token ids (one per PROMPT_LENGTHS entry) of a case's seed."""
    gen = torch.Generator().manual_seed(seed + 100)
    return [[int(t) for t in torch.randint(3, VOCAB, (n,), generator=gen)] for n in PROMPT_LENGTHS]


def save_checkpoint(model, folder, legacy, **save_kwargs):
    """Saves the model as safetensors (no generation_config.json) plus
    config_legacy.json; returns the config.json it wrote."""
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    gen_cfg = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)
    with open(os.path.join(folder, "config_legacy.json"), "w") as f:
        json.dump(legacy_config(saved, legacy), f, indent=2, sort_keys=True)
        f.write("\n")
    return saved


def reference_prompts(model, prompt_tokens):
    """Last-position logits and greedy continuations (with their margins) of each prompt."""
    prompts = []
    for n, tokens in zip(PROMPT_LENGTHS, prompt_tokens):
        logits = last_logits(model, tokens)
        cont, margins = greedy(model, tokens, N_CONTINUATION)
        prompts.append({"name": f"len{n}", "tokens": tokens, "logits": f32_list(logits),
                        "max_abs_logit": float(logits.abs().max()), "top2_margin": margin(logits),
                        "greedy_tokens": cont, "greedy_margins": margins})
    return prompts


def logit_sensitivity(model, cfg, variants, prompts, **from_config_kwargs):
    """How much each dropped detail moves the longest prompt's logits. A
    variant is a dict of config changes or a function (config, state_dict)
    that changes both."""
    sensitivity = {}
    longest = prompts[-1]["tokens"]
    ref = torch.tensor(prompts[-1]["logits"])
    for vname, change in variants.items():
        vcfg = copy.deepcopy(cfg)
        state = model.state_dict()
        if callable(change):
            state = copy.deepcopy(state)
            change(vcfg, state)
        else:
            for k, v in change.items():
                setattr(vcfg, k, copy.deepcopy(v))
            if "rope_parameters" in change and hasattr(vcfg, "standardize_rope_params"):
                vcfg.standardize_rope_params()
        vmodel = AutoModelForCausalLM.from_config(vcfg, attn_implementation="eager", dtype=torch.float32,
                                                  **from_config_kwargs)
        vmodel.load_state_dict(state)
        vmodel.eval()
        sensitivity[vname] = float((last_logits(vmodel, longest) - ref).abs().max())
    return sensitivity


def write_reference(folder, reference):
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")


def generate(make_case, cases):
    """The generators' command line: --out DIR (default tests/data/hf_tiny) and
    --only CASE; runs make_case(name, spec, out, index) per case and returns out."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "hf_tiny"))
    ap.add_argument("--only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for i, (name, spec) in enumerate(cases.items()):
        if args.only and name != args.only:
            continue
        make_case(name, spec, args.out, i)
    return args.out


def make_case(name, spec, out_dir, index):
    cfg, dtype, save_kwargs, legacy, variants = spec
    is_gemma = cfg.model_type.startswith("gemma")
    seed = SEED + index
    model = build(cfg, dtype, seed, is_gemma)
    folder = os.path.join(out_dir, name)
    to_save = copy.deepcopy(model).to(dtype) if dtype != torch.float32 else model
    saved = save_checkpoint(to_save, folder, legacy, **save_kwargs)
    prompts = reference_prompts(model, prompt_tokens_for(seed))
    sensitivity = logit_sensitivity(model, cfg, variants, prompts)

    shard_files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    reference = {
        "case": name,
        "architecture": saved["architectures"][0],
        "weights_dtype": str(dtype).replace("torch.", ""),
        "tie_word_embeddings": saved.get("tie_word_embeddings"),
        "safetensors_files": shard_files,
        "sharded": os.path.exists(os.path.join(folder, "model.safetensors.index.json")),
        "vocab_size": VOCAB,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": "eager",
        "reference_compute_dtype": "float32",
        "sensitivity_max_abs_logit_change": sensitivity,
        "prompts": prompts,
    }
    write_reference(folder, reference)
    print(f"{name}: {saved['architectures'][0]} {dtype} files={shard_files} "
          f"max|logit|={max(p['max_abs_logit'] for p in prompts):.2f} "
          f"min margin={min(min(p['greedy_margins']) for p in prompts):.4f} sensitivity={sensitivity}")


def make_tokenizer(out_dir):
    """Byte-level BPE with exactly VOCAB tokens (256 bytes + 1 special + merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    with open(os.path.abspath(__file__)) as f:
        text = f.read()
    tok.train_from_iterator([text] * 4, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(os.path.join(out_dir, "tokenizer.json"))


def main():
    make_tokenizer(generate(make_case, cases()))


if __name__ == "__main__":
    main()
