#!/usr/bin/env python3
"""Writes a Hugging Face Llama-architecture checkpoint as a bf16 (or Q8_0) GGUF
for the llama.cpp speed peer (scripts/gpu_run.sh, stage peer_llamacpp; the CPU
FP8 comparison in docs/benchmarks.md uses --type q8_0).

The file is for timing only. The weights are copied as they are (no Q/K
row permutation for llama.cpp's rotary layout), and the vocabulary is a
placeholder of the model's size (three specials, 256 byte tokens, filler).
llama-bench feeds random token ids, so the work per token is the model's
and nothing else matters; the file's outputs are not the HF model's.

    python3 scripts/hf_to_gguf_bf16.py MODEL_DIR OUT.gguf [--type q8_0] [--gguf-py PATH/TO/gguf-py]

Needs numpy and gguf-py (llama.cpp's tree, or `pip install gguf`); reads
safetensors files itself (f32, f16 or bf16 tensors).
"""
import argparse
import json
import pathlib
import sys

import numpy as np

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in TOP_NAMES:
        return TOP_NAMES[hf]
    parts = hf.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
        rest = ".".join(parts[3:])
        if rest in LAYER_NAMES:
            return f"blk.{int(parts[2])}.{LAYER_NAMES[rest]}"
    raise SystemExit(f"unexpected tensor {hf}: only Llama-architecture checkpoints are supported")


def read_safetensors(path):
    """(name, f32 numpy array) for every tensor of one safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            raw = np.frombuffer(f.read(end - begin), dtype=np.uint8)
            if info["dtype"] == "BF16":
                values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif info["dtype"] == "F16":
                values = raw.view(np.float16).astype(np.float32)
            elif info["dtype"] == "F32":
                values = raw.view(np.float32)
            else:
                raise SystemExit(f"{path}: tensor {name} is {info['dtype']}; expected F32, F16 or BF16")
            yield name, values.reshape(info["shape"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=["bf16", "q8_0"], default="bf16", help="type of the matrices (norms stay f32)")
    ap.add_argument("--gguf-py", help="the gguf-py folder of the llama.cpp tree (default: the installed gguf)")
    args = ap.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    import gguf
    import gguf.quants

    model = pathlib.Path(args.model_dir)
    cfg = json.loads((model / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise SystemExit(f"{model}: model_type {cfg.get('model_type')!r}, expected 'llama'")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    vocab = cfg["vocab_size"]

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(model.name)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get("num_key_value_heads", heads))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    w.add_rope_freq_base(float(rope_theta))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if args.type == "bf16" else gguf.LlamaFileType.MOSTLY_Q8_0)

    specials = ["<unk>", "<s>", "</s>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    if vocab < len(tokens):
        raise SystemExit(f"vocabulary of {vocab} is smaller than the {len(tokens)} placeholder tokens")
    tokens += [f"t{i}" for i in range(len(tokens), vocab)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    files = sorted(model.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"{model}: no safetensors files")
    count = 0
    for path in files:
        for name, t in read_safetensors(path):
            if t.ndim == 1:  # norms stay f32, as llama.cpp's own converter keeps them
                w.add_tensor(gguf_name(name), np.ascontiguousarray(t, dtype=np.float32))
            else:
                qtype = gguf.GGMLQuantizationType.BF16 if args.type == "bf16" else gguf.GGMLQuantizationType.Q8_0
                raw = gguf.quants.quantize(np.ascontiguousarray(t, dtype=np.float32), qtype)
                w.add_tensor(gguf_name(name), raw, raw_dtype=qtype)
            count += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: {count} tensors ({args.type}), vocabulary {vocab} (placeholder)")


if __name__ == "__main__":
    main()
