#!/usr/bin/env python3
"""Writes the loader test fixtures with the reference writers (PyPI `gguf` and
`safetensors`), so the C++ readers are checked against files they did not write.

    pip install gguf safetensors numpy && python3 scripts/gen_loader_fixtures.py

Outputs (all tiny, checked in):
  tests/data/loader/tiny.gguf           every metadata value type, a few tensor types
  tests/data/loader/tiny.safetensors    every numpy-expressible supported dtype
  tests/data/loader/sharded/            config.json + index + two shards
  tests/fuzz/corpus/{gguf,safetensors}/ seeds: copies of the files above, a v2 variant
The expected values are repeated in tests/unit/loader/test_fixtures.cpp. The
safetensors writer orders __metadata__ arbitrarily, so reruns may differ in bytes.
"""
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "loader"
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
VT = gguf.GGUFValueType


def write_gguf(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), "tiny")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 0.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_key_value("t.arr_str", ["a", "", "ccc"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("t.arr_i32", [1, -2, 3], VT.ARRAY, sub_type=VT.INT32)
    w.add_key_value("t.arr_u8", [1, 2, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr_f32", [0.5, -1.0], VT.ARRAY, sub_type=VT.FLOAT32)
    w.add_key_value("t.arr_f64", [2.5], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_key_value("t.arr_bool", [True, False], VT.ARRAY, sub_type=VT.BOOL)
    w.add_key_value("t.arr_nested", [[1, 2], [3]], VT.ARRAY, sub_type=VT.ARRAY)

    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("f16", np.array([1, 2, 3, 4], dtype=np.float16))
    w.add_tensor("i32", np.array([7, -8, 9], dtype=np.int32))
    # Q8_0: per block of 32 a f16 scale then 32 int8 values; 2 rows of one block.
    q8 = np.zeros((2, 34), dtype=np.uint8)
    q8[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    q8[:, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    w.add_tensor("q8_0", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    # BF16 has no numpy dtype: raw bytes of [1.0, -2.0] (bf16 0x3f80, 0xc000).
    bf = np.array([0x3F80, 0xC000], dtype=np.uint16).view(np.uint8).reshape(1, 4)
    w.add_tensor("bf16", bf, raw_shape=bf.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_safetensors(path: Path) -> None:
    save_file(
        {
            "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
            "f16": np.array([1.0, -0.5], dtype=np.float16),
            "i32": np.array([[1, 2], [3, 4]], dtype=np.int32),
            "i64": np.array([-(2**40)], dtype=np.int64),
            "i8": np.array([-1, 2, -3], dtype=np.int8),
            "u8": np.array([255], dtype=np.uint8),
            "scalar": np.array(3.0, dtype=np.float32),
            "empty": np.zeros((0, 4), dtype=np.float32),
        },
        str(path),
        metadata={"format": "np", "note": "deepinfer fixture"},
    )


def write_sharded(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 4, "num_hidden_layers": 1}, indent=1))
    shards = {
        "model-00001-of-00002.safetensors": {
            "embed.weight": np.arange(8, dtype=np.float32).reshape(2, 4)},
        "model-00002-of-00002.safetensors": {
            "layer.0.weight": np.full((4, 4), 0.5, dtype=np.float16),
            "norm.weight": np.ones(4, dtype=np.float32)},
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
        weight_map.update({t: name for t in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 112}, "weight_map": weight_map}, indent=1))


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    write_gguf(DATA / "tiny.gguf")
    write_safetensors(DATA / "tiny.safetensors")
    write_sharded(DATA / "sharded")
    for target, name in (("gguf", "tiny.gguf"), ("safetensors", "tiny.safetensors")):
        (CORPUS / target).mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / name, CORPUS / target / name)
    shutil.copy(DATA / "sharded" / "model-00002-of-00002.safetensors", CORPUS / "safetensors" / "shard.safetensors")
    # Version 2 has the same little-endian layout as 3; only the version field differs.
    v2 = bytearray((DATA / "tiny.gguf").read_bytes())
    v2[4:8] = (2).to_bytes(4, "little")
    (CORPUS / "gguf" / "tiny_v2.gguf").write_bytes(bytes(v2))


if __name__ == "__main__":
    main()
