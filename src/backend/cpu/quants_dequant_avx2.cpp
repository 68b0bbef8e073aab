// AVX2 dequantisation of the formats prefill meets most (the 32-element
// blocks, Q4_K, Q5_K, Q6_K): the GEMM path without AMX dequantises a tile of
// weight rows for every prefill matrix product, and the portable loops took a
// sixth of Gemma 3's prefill time.
//
// Bit for bit the portable results: as quants_dequant.cpp explains, every
// product below is exact in float (an f16 scale times small integers), so a
// fused multiply-add rounds once, exactly where the reference's add does.
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX2)

#include <cstring>

#include "core/half.h"

namespace deepinfer::cpu::quants::avx2 {

namespace {

// dst[0..8) = d * (bytes[0..8) - offset) (+ m), the bytes unsigned. Formats
// without a min multiply only, as the reference does (d * 0 keeps d's sign).
template <bool kMin>
inline void store8(__m128i bytes, int offset, __m256 d, __m256 m, float* dst) {
  const __m256 q = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_set1_epi32(offset)));
  _mm256_storeu_ps(dst, kMin ? _mm256_fmadd_ps(d, q, m) : _mm256_mul_ps(d, q));
}

// 16 unsigned bytes -> 16 floats.
template <bool kMin>
inline void store16(__m128i bytes, int offset, __m256 d, __m256 m, float* dst) {
  store8<kMin>(bytes, offset, d, m, dst);
  store8<kMin>(_mm_unpackhi_epi64(bytes, bytes), offset, d, m, dst + 8);
}

// Low and high nibbles of 16 packed bytes: elements 0..15 and 16..31.
inline void nibbles(const uint8_t* qs, __m128i& lo, __m128i& hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0xF);
  lo = _mm_and_si128(raw, mask);
  hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
}

// 0x10 in byte i where bit i of the 16-bit little-endian word is set.
inline __m128i fifth_bits(uint32_t bits16) {
  const __m128i spread = _mm_shuffle_epi8(_mm_set1_epi16(static_cast<int16_t>(bits16)),
                                          _mm_set_epi64x(0x0101010101010101, 0x0000000000000000));
  const __m128i bit = _mm_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit), _mm_set1_epi8(0x10));
}

template <typename Block, int kOffset, bool kHighBits, bool kMin>
void dequantize_32(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<Block>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const __m256 d = _mm256_set1_ps(f16_to_f32(b[i].d));
    __m256 m = _mm256_setzero_ps();
    if constexpr (kMin) m = _mm256_set1_ps(f16_to_f32(b[i].m));
    __m128i lo, hi;
    nibbles(b[i].qs, lo, hi);
    if constexpr (kHighBits) {
      uint32_t qh;
      std::memcpy(&qh, b[i].qh, 4);
      lo = _mm_or_si128(lo, fifth_bits(qh & 0xFFFF));
      hi = _mm_or_si128(hi, fifth_bits(qh >> 16));
    }
    store16<kMin>(lo, kOffset, d, m, dst);
    store16<kMin>(hi, kOffset, d, m, dst + 16);
  }
}

// Q4_K / Q5_K: weight = (d * sc) * q - dmin * m per 32-element group.
template <typename Block, bool kHighBits>
void dequantize_k4(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<Block>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int j = 0; j < 8; ++j, dst += 32) {
      int sc, mn;
      k4_scale_min(b[i].scales, j, sc, mn);
      const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc));
      const __m256 m1 = _mm256_set1_ps(-(dmin * static_cast<float>(mn)));
      const uint8_t* qs = b[i].qs + 32 * (j / 2);
      for (int h = 0; h < 2; ++h) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * h));
        if (j & 1) v = _mm_srli_epi16(v, 4);
        v = _mm_and_si128(v, _mm_set1_epi8(0xF));
        if constexpr (kHighBits) {
          const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qh + 16 * h));
          const __m128i bit = _mm_set1_epi8(static_cast<char>(1 << j));
          v = _mm_or_si128(v, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(qh, bit), bit), _mm_set1_epi8(0x10)));
        }
        store16<true>(v, 0, d1, m1, dst + 16 * h);
      }
    }
  }
}

}  // namespace

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  dequantize_32<BlockQ4_0, 8, false, false>(src, dst, n);
}
void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  dequantize_32<BlockQ4_1, 0, false, true>(src, dst, n);
}
void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  dequantize_32<BlockQ5_0, 16, true, false>(src, dst, n);
}
void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  dequantize_32<BlockQ5_1, 0, true, true>(src, dst, n);
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ8_0>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const __m256 d = _mm256_set1_ps(f16_to_f32(b[i].d));
    for (int l = 0; l < kQK; l += 8) {
      int64_t raw;
      std::memcpy(&raw, b[i].qs + l, 8);
      const __m256i q = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(raw));
      _mm256_storeu_ps(dst + l, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
    }
  }
}

void dequantize_q4_k(const void* src, float* dst, int64_t n) { dequantize_k4<BlockQ4_K, false>(src, dst, n); }
void dequantize_q5_k(const void* src, float* dst, int64_t n) { dequantize_k4<BlockQ5_K, true>(src, dst, n); }

// Q6_K: weight = (d * scale) * (q - 32) per 16-element group.
void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ6_K>(src);
  const __m128i low4 = _mm_set1_epi8(0xF), low2 = _mm_set1_epi8(3);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int e = 0; e < kQKK; e += 16, dst += 16) {
      const int h = e / 128, k = (e % 128) / 32, l0 = e % 32;
      __m128i ql = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].ql + 64 * h + 32 * (k & 1) + l0));
      const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qh + 32 * h + l0));
      if (k >= 2) ql = _mm_srli_epi16(ql, 4);
      const __m128i high = _mm_and_si128(_mm_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), low2);
      const __m128i q = _mm_or_si128(_mm_and_si128(ql, low4), _mm_slli_epi16(high, 4));
      store16<false>(q, 32, _mm256_set1_ps(d * static_cast<float>(b[i].scales[e / 16])), zero, dst);
    }
  }
}

}  // namespace deepinfer::cpu::quants::avx2

#endif  // DEEPINFER_QUANTS_AVX2
