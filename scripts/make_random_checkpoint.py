#!/usr/bin/env python3
"""Writes a Llama-architecture Hugging Face checkpoint of random bf16 weights
with the standard library only (no numpy, torch or transformers), for CPU speed
runs where those are not installed:

    scripts/make_random_checkpoint.py --shape llama1b --tokenizer ../shared/tokenizers/llama3_1 --out /tmp/m/llama1b

Shapes: llama1b (Llama-3.2-1B: hidden 2048, 16 layers, FFN 8192, 32/8 heads,
vocab 128256, tied embeddings). The weights are a pool of 2^20 normal values
(std 0.02; norms 1.0) repeated with a per-tensor offset: random enough that no
kernel meets a special case, cheap enough to write gigabytes. The tokenizer
folder's tokenizer.json (or tokenizer.json.xz) and tokenizer_config.json are
copied beside the weights.
"""
import argparse
import json
import lzma
import os
import random
import shutil
import struct

SHAPES = {
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                    rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5),
}


def bf16_pool(n, std, seed):
    rng = random.Random(seed)
    out = bytearray(2 * n)
    for i in range(n):
        bits = struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, std)))[0]
        struct.pack_into("<H", out, 2 * i, (bits + 0x8000) >> 16)  # round half up: fine for random data
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json[.xz] and tokenizer_config.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    H, F, L, V = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    tensors = [("model.embed_tokens.weight", [V, H], 0.02), ("model.norm.weight", [H], None)]
    for l in range(L):
        p = f"model.layers.{l}."
        tensors += [(p + "input_layernorm.weight", [H], None), (p + "post_attention_layernorm.weight", [H], None),
                    (p + "self_attn.q_proj.weight", [q, H], 0.02), (p + "self_attn.k_proj.weight", [kv, H], 0.02),
                    (p + "self_attn.v_proj.weight", [kv, H], 0.02), (p + "self_attn.o_proj.weight", [H, q], 0.02),
                    (p + "mlp.gate_proj.weight", [F, H], 0.02), (p + "mlp.up_proj.weight", [F, H], 0.02),
                    (p + "mlp.down_proj.weight", [H, F], 0.02)]
    os.makedirs(args.out, exist_ok=True)
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    pool = bf16_pool(1 << 20, 0.02, 1)
    ones = struct.pack("<H", 0x3F80) * (1 << 16)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k, (name, shape, std) in enumerate(tensors):
            left = 2
            for d in shape:
                left *= d
            src = pool if std is not None else ones
            at = (k * 7919 * 2) % len(src) if std is not None else 0
            while left > 0:
                chunk = src[at:at + left]
                f.write(chunk)
                left -= len(chunk)
                at = 0
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", torch_dtype="bfloat16",
               bos_token_id=128000, eos_token_id=128001, attention_bias=False, **s)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tok = args.tokenizer
    if os.path.exists(os.path.join(tok, "tokenizer.json")):
        shutil.copy(os.path.join(tok, "tokenizer.json"), args.out)
    else:
        with lzma.open(os.path.join(tok, "tokenizer.json.xz")) as src, \
                open(os.path.join(args.out, "tokenizer.json"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy(os.path.join(tok, "tokenizer_config.json"), args.out)
    print(f"{args.out}: {offset / 2 / 1e9:.2f} B parameters, {offset / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
