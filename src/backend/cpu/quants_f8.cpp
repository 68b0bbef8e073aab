// Kernels for FP8 e4m3 weights in 64-element row blocks (core/fp8_blocks.h).
// The dots read f32 activations directly: the weights carry one f32 scale per
// block and 3 mantissa bits, so there is nothing to gain from 8-bit
// activations and the products stay as accurate as a bf16 weight's.
//
// The vector kernels decode a code without a table: e4m3 (sign, 4 exponent
// bits biased by 7, 3 mantissa bits) moved into an f16's bit positions
// (sign to bit 15, the rest to bits 13..7) is the same number times 2^-8 -
// subnormals included, since f16's subnormals reach below e4m3's - and the
// hardware's exact f16 -> f32 conversion does the rest; the 2^8 goes into the
// block scale, so every weight is exactly code value * scale as in the
// portable kernels. Sign-extending the byte to 16 bits and shifting it left
// by 7 lands everything but a second copy of the sign (bit 14), which one AND
// clears: three operations per 16 or 32 codes. NaN codes would decode to
// 480; loading refuses them.
#include <cstring>

#include "backend/cpu/quants_internal.h"
#include "core/fp8.h"
#include "core/fp8_blocks.h"

namespace deepinfer::cpu::quants {

#if defined(DEEPINFER_QUANTS_AVX2)
// The dots fetch a block 4 KiB ahead into L1: the GGUF formats' 2 KiB into
// L2 read 11.2 GB/s on one EPYC core at 128 MiB of weights, 4 KiB into L1
// about 14 (bench_quants 128 5 f8_e4m3_b64). Baseline code, outside the
// AVX-512 region below.
constexpr size_t kF8PrefetchAhead = 4096;
inline void prefetch_f8_block(const F8Block* b) {
  const char* p = reinterpret_cast<const char*>(b) + kF8PrefetchAhead;
  _mm_prefetch(p, _MM_HINT_T0);
  _mm_prefetch(p + 64, _MM_HINT_T0);
}
#endif

void dequantize_f8_b64(const void* src, float* dst, int64_t n) {
  dequantize_f8_blocks(static_cast<const F8Block*>(src), dst, n);
}

namespace scalar {

float dot_f8_b64(const void* w, const void* x, int64_t n) {
  const auto* b = static_cast<const F8Block*>(w);
  const auto* xf = static_cast<const float*>(x);
  const auto& table = f8e4m3_table();
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kF8BlockElems; ++i, xf += kF8BlockElems) {
    float block = 0.0f;
    for (int l = 0; l < kF8BlockElems; ++l) block += table[b[i].codes[l]] * xf[l];
    sum += block * b[i].scale;
  }
  return sum;
}

}  // namespace scalar

#if defined(DEEPINFER_QUANTS_AVX2)
namespace avx2 {

namespace {

// 16 codes -> the f16 bits of value * 2^-8.
inline __m256i f16_bits(const uint8_t* codes) {
  const __m256i c = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_and_si256(_mm256_slli_epi16(c, 7), _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
}

}  // namespace

float dot_f8_b64(const void* w, const void* x, int64_t n) {
  const auto* b = static_cast<const F8Block*>(w);
  const auto* xf = static_cast<const float*>(x);
  __m256 total = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kF8BlockElems; ++i, xf += kF8BlockElems) {
    prefetch_f8_block(b + i);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int l = 0; l < kF8BlockElems; l += 16) {
      const __m256i h = f16_bits(b[i].codes + l);
      acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_loadu_ps(xf + l), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), _mm256_loadu_ps(xf + l + 8), acc1);
    }
    total = _mm256_fmadd_ps(_mm256_add_ps(acc0, acc1), _mm256_set1_ps(b[i].scale * 256.0f), total);
  }
  return hsum(total);
}

void dequantize_f8_b64(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const F8Block*>(src);
  for (int64_t i = 0; i < n / kF8BlockElems; ++i, dst += kF8BlockElems) {
    const __m256 scale = _mm256_set1_ps(b[i].scale * 256.0f);
    for (int l = 0; l < kF8BlockElems; l += 16) {
      const __m256i h = f16_bits(b[i].codes + l);
      _mm256_storeu_ps(dst + l, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale));
      _mm256_storeu_ps(dst + l + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale));
    }
  }
}

}  // namespace avx2
#endif

}  // namespace deepinfer::cpu::quants

#if defined(DEEPINFER_QUANTS_AVX512)

#include "backend/cpu/isa_target.h"

DEEPINFER_ISA_BEGIN(DEEPINFER_AVX512_FEATURES)

namespace deepinfer::cpu::quants::avx512 {

float dot_f8_b64(const void* w, const void* x, int64_t n) {
  const auto* b = static_cast<const F8Block*>(w);
  const auto* xf = static_cast<const float*>(x);
  const __m512i clear_bit14 = _mm512_set1_epi16(static_cast<int16_t>(0xBFFF));
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kF8BlockElems; ++i, xf += kF8BlockElems) {
    prefetch_f8_block(b + i);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int l = 0; l < kF8BlockElems; l += 32) {
      const __m512i c = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].codes + l)));
      const __m512i h = _mm512_and_si512(_mm512_slli_epi16(c, 7), clear_bit14);
      acc0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), _mm512_loadu_ps(xf + l), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), _mm512_loadu_ps(xf + l + 16), acc1);
    }
    total = _mm512_fmadd_ps(_mm512_add_ps(acc0, acc1), _mm512_set1_ps(b[i].scale * 256.0f), total);
  }
  return _mm512_reduce_add_ps(total);
}

}  // namespace deepinfer::cpu::quants::avx512

DEEPINFER_ISA_END

#endif
