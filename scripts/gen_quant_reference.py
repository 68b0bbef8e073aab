#!/usr/bin/env python3
"""Writes reference data for the CPU quantisation kernels (tests/unit/quants).

For every weight dtype the kernels support, one file tests/data/quants/<dtype>.bin
holds raw rows (block bytes exactly as stored in GGUF) and the floats that the
`gguf` package's numpy dequantiser (gguf.quants.dequantize) produces for them.

Rows come from, in order of preference:
  * real tensors in models/*.gguf (first kCols elements of rows spread over
    several tensors),
  * gguf.quants.quantize on random data, for types it can quantise,
  * random bytes whose f16 scale fields are replaced by finite values (random
    exponents, including subnormals), for types it cannot quantise.
Every type also gets kRandomRows rows of random bytes to cover bit patterns the
real or quantised data may not use.

File format (little endian):
  b"DIQ1", u32 name_len, name (ascii, the DType name, e.g. "q4_K"),
  u32 rows, u32 cols, u32 row_bytes, rows*row_bytes raw bytes,
  rows*cols f32 expected values.

Usage: scripts/gen_quant_reference.py [--models models] [--out tests/data/quants]
Needs: pip install gguf numpy
"""
import argparse
import pathlib
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

kCols = 512
kRows = 4          # real or quantised rows per type
kRandomRows = 2    # random-byte rows per type

# DType name used by the C++ side -> ggml type.
kTypes = {
    "f32": T.F32, "f16": T.F16, "bf16": T.BF16,
    "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0,
    "q2_K": T.Q2_K, "q3_K": T.Q3_K, "q4_K": T.Q4_K, "q5_K": T.Q5_K, "q6_K": T.Q6_K,
}

# Byte offsets of the f16 scale fields inside one block.
kScaleOffsets = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def row_bytes(qtype, n):
    block, size = GGML_QUANT_SIZES[qtype]
    return n // block * size


_readers = {}


def real_rows(models_dir, qtype):
    rows = []
    for path in sorted(pathlib.Path(models_dir).glob("*.gguf")):
        if path not in _readers:
            _readers[path] = GGUFReader(path)
        reader = _readers[path]
        tensors = [t for t in reader.tensors
                   if t.tensor_type == qtype and int(t.shape[0]) >= kCols]
        for t in tensors[: kRows]:
            data = np.asarray(t.data).view(np.uint8)
            data = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
            r = min(len(data) - 1, 7 * (len(rows) + 1))
            rows.append(data[r, : row_bytes(qtype, kCols)].copy())
            if len(rows) == kRows:
                return rows
    return rows


def random_finite_f16(rng, n):
    mag = 10.0 ** rng.uniform(-7.0, 0.0, n)
    return (rng.choice([-1.0, 1.0], n) * mag).astype(np.float16)


def random_rows(rng, qtype, count):
    nbytes = row_bytes(qtype, kCols)
    rows = rng.integers(0, 256, (count, nbytes), dtype=np.uint8)
    if qtype == T.F32:
        return [rng.standard_normal(kCols).astype(np.float32).view(np.uint8) for _ in range(count)]
    if qtype == T.F16:
        for r in rows:
            v = r.view(np.uint16)
            v[(v & 0x7C00) == 0x7C00] &= 0xBFFF  # clear the top exponent bit: finite
        return list(rows)
    if qtype == T.BF16:
        # Exponents from zero (subnormals) up to 2^13, so that dot products stay finite.
        for r in rows:
            v = r.view(np.uint16)
            v[:] = (v & 0x807F) | (rng.integers(0, 140, v.shape, dtype=np.uint16) << 7)
        return list(rows)
    block_size = GGML_QUANT_SIZES[qtype][1]
    for r in rows:
        blocks = r.reshape(-1, block_size)
        for off in kScaleOffsets[qtype]:
            blocks[:, off:off + 2] = random_finite_f16(rng, len(blocks)).view(np.uint8).reshape(-1, 2)
    return list(rows)


def quantised_rows(rng, qtype):
    data = rng.standard_normal((kRows, kCols)).astype(np.float32)
    data *= 10.0 ** rng.uniform(-3, 1, (kRows, 1)).astype(np.float32)
    data[:, ::37] *= 8.0  # outliers so that blocks have different ranges
    if qtype == T.F32:
        return list(data.view(np.uint8))
    if qtype == T.F16:
        return list(data.astype(np.float16).view(np.uint8))
    try:
        q = quantize(data, qtype)
    except NotImplementedError:
        return None
    return list(q.view(np.uint8))


def main():
    repo = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=str(repo / "models"))
    ap.add_argument("--out", default=str(repo / "tests/data/quants"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240611)
    for name, qtype in kTypes.items():
        rows = real_rows(args.models, qtype)
        source = "real"
        if len(rows) < kRows:
            q = quantised_rows(rng, qtype)
            if q is not None:
                rows, source = q, "gguf.quants.quantize"
            else:
                rows, source = random_rows(rng, qtype, kRows), "random bytes"
        rows = rows + random_rows(rng, qtype, kRandomRows)
        raw = np.stack(rows).astype(np.uint8)
        expected = dequantize(raw, qtype).astype(np.float32).reshape(len(rows), kCols)
        assert np.all(np.isfinite(expected)), name
        nb = name.encode()
        with open(out / f"{name}.bin", "wb") as f:
            f.write(b"DIQ1" + struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<III", raw.shape[0], kCols, raw.shape[1]))
            f.write(raw.tobytes())
            f.write(expected.astype("<f4").tobytes())
        print(f"{name}: {raw.shape[0]} rows ({source} + random bytes), {raw.shape[1]} bytes/row")


if __name__ == "__main__":
    main()
