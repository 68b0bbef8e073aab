// FP8 weights in row blocks (DType::F8E4M3_B64): every 64 consecutive
// elements of a row share one f32 scale, stored in front of their 64 e4m3
// codes; element = e4m3 value of its code * its block's scale (1.06 bytes an
// element). One block per 64 elements keeps the format a plain block dtype,
// so a weight row, a slice of whole blocks and an expert stack are what they
// are for the GGUF formats, and rows of 576 or 960 (SmolLM2) fit it. A
// checkpoint's 128 x 128 block scales (DeepSeek-V3, Qwen3 FP8) or
// per-channel / per-tensor scales map onto it exactly (the codes are kept,
// each row block takes its scale); quantising a 16/32-bit weight gives each
// row block its own scale, finer than 128 x 128 blocks.
#pragma once

#include <cstdint>

namespace deepinfer {

inline constexpr int kF8BlockElems = 64;

struct F8Block {
  float scale;
  uint8_t codes[kF8BlockElems];
};
static_assert(sizeof(F8Block) == 4 + kF8BlockElems, "F8Block must match DType::F8E4M3_B64's block_bytes");

// n values (a multiple of 64) into n / 64 blocks: each block's scale is its
// largest magnitude / 448 (e4m3's largest), codes rounded to nearest even. A
// block of zeros gets scale 0. Returns the index of the first value that is
// not finite (nothing sensible to store; the caller reports it), else -1.
int64_t quantize_f8_blocks(const float* src, F8Block* dst, int64_t n);

// Packs n e4m3 codes (a multiple of 64) with one scale per 64 of them.
// Returns the index of the first NaN code (0x7f / 0xff; the fast kernels do
// not decode NaN) or, as -2 - block, the first scale that is not finite;
// -1 when all is well.
int64_t pack_f8_blocks(const uint8_t* codes, const float* block_scales, F8Block* dst, int64_t n);

// The exact values: e4m3 value * scale, one f32 rounding.
void dequantize_f8_blocks(const F8Block* src, float* dst, int64_t n);

// The split row layout a GPU keeps these weights in (same bytes per row): a
// row's k codes first, then its k / 64 f32 scales, so that its codes load as
// aligned 16-byte vectors. `rows` rows of k elements (a multiple of 64),
// contiguous, from blocks to split rows and back.
void split_f8_rows(const F8Block* src, int64_t rows, int64_t k, uint8_t* dst);
void join_f8_rows(const uint8_t* src, int64_t rows, int64_t k, F8Block* dst);

}  // namespace deepinfer
