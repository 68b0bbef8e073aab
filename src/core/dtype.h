// Element types of tensors, including the GGUF block-quantised formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  I32,
  I64,
  I8,
  U8,
  // Block-quantised formats with the GGUF/ggml memory layout.
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q8_1,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  Q8_K,
  // FP8 e4m3 ("fn": no infinities, max 448): the KV cache's 8-bit format.
  F8E4M3,
  // FP8 e4m3 weights in blocks of 64 along a row, each block one f32 scale
  // and 64 codes (core/fp8_blocks.h): what FP8 checkpoints and
  // --quantization fp8 load to.
  F8E4M3_B64,
  Count,
};

struct DTypeInfo {
  std::string_view name;
  int block_elems;   // elements per block (1 for plain types)
  int block_bytes;   // bytes per block
  bool quantized;
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
inline bool is_quantized(DType t) { return dtype_info(t).quantized; }

// Bytes taken by a row of n elements; throws if n is not a multiple of the block size.
size_t row_bytes(DType t, int64_t n);

}  // namespace deepinfer
