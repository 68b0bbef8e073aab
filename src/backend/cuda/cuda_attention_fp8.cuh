// The FP8 (e4m3) cache's operand helpers of the tensor-core attention kernel
// (cuda_attention_mma.cu): every e4m3 value is an f16 value, so the products
// run in f16. K's mma fragments are built straight from the staged bytes, with
// Q's fragments permuted to match; V tiles are widened to f16 for ldmatrix.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace deepinfer::cuda::attention_fp8 {

// Sixteen e4m3 values (one 16-byte chunk) widened to sixteen f16 (two chunks).
__device__ __forceinline__ void widen_fp8x16(const uint4& in, uint4& lo, uint4& hi) {
  const uint32_t words[4] = {in.x, in.y, in.z, in.w};
  uint32_t out[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * p));
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      out[2 * w + p] = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    }
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// A Q fragment register (two bf16) as two f16, saturated to f16's range.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t r) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
  const __half2 h = __floats2half2_rn(fminf(fmaxf(f.x, -65504.0f), 65504.0f), fminf(fmaxf(f.y, -65504.0f), 65504.0f));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Q fragments in the type the products use.
template <typename T, typename M>
__device__ __forceinline__ void to_math_type(uint32_t (&r)[4]) {
  if constexpr (!std::is_same_v<T, M>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = bf16x2_to_f16x2(r[i]);
  }
}

// Byte offset of 16-byte chunk `chunk` of FP8 row `row` in a staged K tile:
// XOR-swizzled so that the eight keys one 32-bit fragment load reads sit on
// distinct banks (two 64-byte rows share a 128-byte line at D = 64).
template <int D>
__device__ __forceinline__ uint32_t fp8_k_offset(int row, int chunk) {
  const int spread = D == 64 ? (row >> 1) & 3 : row & 7;
  return static_cast<uint32_t>(row * D + ((chunk ^ spread) << 4));
}

// Q's A fragment of one 16-dim step re-ordered for K fragments built from
// FP8 bytes: k indices 2c, 2c+1 (registers 0, 1) become dims 4c, 4c+1 and k
// indices 2c+8, 2c+9 (registers 2, 3) dims 4c+2, 4c+3, c = lane % 4. Those
// dims sit in registers 0/1 (dims < 8) or 2/3 of lanes 2c mod 4 and 2c+1 mod
// 4 of the same quad.
__device__ __forceinline__ void permute_q_for_fp8_k(uint32_t (&r)[4], int lane) {
  const int c = lane & 3, src = (lane & ~3) | ((2 * c) & 3);
  const bool low = c < 2;
  uint32_t out[4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // rows g (registers 0, 2) and g + 8 (1, 3)
    const uint32_t lo0 = __shfl_sync(0xffffffffu, r[half], src), hi0 = __shfl_sync(0xffffffffu, r[2 + half], src);
    const uint32_t lo1 = __shfl_sync(0xffffffffu, r[half], src + 1);
    const uint32_t hi1 = __shfl_sync(0xffffffffu, r[2 + half], src + 1);
    out[half] = low ? lo0 : hi0;
    out[2 + half] = low ? lo1 : hi1;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}

// Two B registers (k = dims 4c..4c+3 of one key) from four e4m3 bytes.
__device__ __forceinline__ void fp8x4_to_f16_fragments(uint32_t bytes, uint32_t& b0, uint32_t& b1) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes >> 16), __NV_E4M3);
  b0 = static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(lo.y) << 16);
  b1 = static_cast<uint32_t>(hi.x) | (static_cast<uint32_t>(hi.y) << 16);
}

}  // namespace deepinfer::cuda::attention_fp8
