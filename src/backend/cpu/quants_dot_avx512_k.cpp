// AVX-512 + VNNI dot products of the K-quants with Q8_K activations. Each
// 512-bit step turns 64 weights of a super-block into unsigned bytes, puts
// them against 64 consecutive activation bytes with vpdpbusd (int32 sums of 4
// products, all below 2^15 in magnitude), and weights those sums with the
// sub-block scales by vpmaddwd against int32 lanes holding the scale in their
// low 16 bits (the high word is zero, so the sum's sign-extension word drops
// out). Mins and biases come from the activation block sums (bsums), and one
// float multiply-add per super-block applies d.
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX512)

#include <cstring>

#include "backend/cpu/isa_target.h"

DEEPINFER_ISA_BEGIN(DEEPINFER_AVX512_FEATURES)

namespace deepinfer::cpu::quants::avx512 {

namespace {

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 32 bytes in both halves of a 512-bit vector.
inline __m512i broadcast256(const void* p) { return _mm512_broadcast_i64x4(load256(p)); }

// The two f16 words at p (d and dmin, adjacent in Q4_K/Q5_K) times a float.
inline __m128 f16_pair_times(const void* p, float f) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits))), _mm_set1_ps(f));
}

// The 8 six-bit scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K
// scales array. With its 12 bytes as dwords s0, s1, s2:
//   scales 0..3 = s0 & 63, scales 4..7 = (s2 & 15) | (s0 >> 6) << 4,
//   mins 0..3 = s1 & 63,   mins 4..7 = (s2 >> 4) | (s1 >> 6) << 4.
// Reads 16 bytes; the block continues past the scales.
inline __m128i k4_scales_mins(const uint8_t* packed) {
  const __m128i v = load128(packed);
  __m128i low = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));  // s0 s2 s1 s2
  low = _mm_srlv_epi32(low, _mm_setr_epi32(0, 0, 0, 4));
  low = _mm_and_si128(low, _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  __m128i high = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // s0 s0 s1 s1
  high = _mm_and_si128(_mm_srli_epi32(high, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

// int32 lanes j..j+7 of v get sums[lane] * scale[lane] (scales as low words).
inline __m512i scaled(__m512i dots, __m512i scales) { return _mm512_madd_epi16(dots, scales); }

// Int32 lanes 0..7 = element 2j's value, 8..15 = element 2j + 1's.
inline __m512i spread_pair(__m512i v, int j) {
  const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32(2 * j)), v);
}

// Int32 128-bit lane i = element 4z + i's value.
inline __m512i spread_quad(__m512i v, int z) {
  const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32(4 * z)), v);
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with a six-bit scale and min each. Step j
// covers sub-blocks 2j (the low nibbles of qs[32j..32j+31]) and 2j + 1 (their
// high nibbles).
template <typename Block, bool kHighBits>
float dot_k4_family(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<Block>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(&b[i], sizeof(Block));
    const __m128i sm = k4_scales_mins(b[i].scales);
    const __m512i sm32 = _mm512_cvtepu8_epi32(sm);  // lanes 0..7 scales, 8..15 mins
    // Mins pair with sums over 32 activations: adjacent bsums added (|sum| < 2^15).
    const __m256i bsum_pairs = _mm256_madd_epi16(load256(a[i].bsums), _mm256_set1_epi16(1));
    const __m256i msum = _mm256_madd_epi16(bsum_pairs, _mm512_extracti32x8_epi32(sm32, 1));

    __m512i high;
    if constexpr (kHighBits) high = broadcast256(b[i].qh);
    __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i q = broadcast256(b[i].qs + 32 * j);
      q = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFFFF0000u, q, 4), nibble);
      if constexpr (kHighBits) {
        // Bit 2j of qh[l] is bit 4 of sub-block 2j's element l, bit 2j + 1 of 2j + 1's.
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * j))),
                                               _mm256_set1_epi8(static_cast<char>(2 << (2 * j))), 1);
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(high, bit), q, _mm512_set1_epi8(0x10));
      }
      const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load512(a[i].qs + 64 * j));
      sumi = _mm512_add_epi32(sumi, scaled(dots, spread_pair(sm32, j)));
    }
    const __m128 d = f16_pair_times(&b[i].d, a[i].d);  // d * da, dmin * da
    acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    acc_min = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(d)), _mm256_cvtepi32_ps(msum), acc_min);
  }
  return _mm512_reduce_add_ps(acc) - _mm512_reduce_add_ps(_mm512_zextps256_ps512(acc_min));
}

}  // namespace

float dot_q4_k(const void* w, const void* x, int64_t n) {
  return dot_k4_family<BlockQ4_K, false>(w, x, n);
}

float dot_q5_k(const void* w, const void* x, int64_t n) {
  return dot_k4_family<BlockQ5_K, true>(w, x, n);
}

// Q6_K as unsigned 0..63; the bias of 32 comes back as -32 * sum(scale * bsum).
// Step (h, p) covers elements 128h + 64p .. + 63: the nibbles of
// ql[64h .. 64h + 63] (high ones for p = 1) and bits 4p, 4p + 1 of qh[32h + l]
// for its first 32 elements, bits 4p + 2, 4p + 3 for the other 32. Each of its
// 128-bit lanes is one 16-element group with its own scale.
float dot_q6_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ6_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i two_bits_at_4 = _mm512_set1_epi8(0x30);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(&b[i], sizeof(BlockQ6_K));
    const __m256i sc16 = _mm256_cvtepi8_epi16(load128(b[i].scales));
    const __m256i bias = _mm256_madd_epi16(sc16, load256(a[i].bsums));
    const __m512i sc32 = _mm512_cvtepu16_epi32(sc16);  // low word the signed scale, high word 0
    __m512i sumi = _mm512_zextsi256_si512(_mm256_slli_epi32(bias, 5));
    sumi = _mm512_sub_epi32(_mm512_setzero_si512(), sumi);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i low = load512(b[i].ql + 64 * h);
      __m512i high = broadcast256(b[i].qh + 32 * h);
      high = _mm512_mask_srli_epi16(high, 0xFFFF0000u, high, 2);
      // p = 0: low nibbles, bits 0..1 of `high` moved to 4..5.
      // 0xF8: a | (b & c).
      const __m512i q0 = _mm512_ternarylogic_epi32(_mm512_and_si512(low, nibble), _mm512_slli_epi16(high, 4),
                                                   two_bits_at_4, 0xF8);
      // p = 1: high nibbles, bits 4..5 of `high` in place.
      const __m512i q1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble), high,
                                                   two_bits_at_4, 0xF8);
      const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q0, load512(a[i].qs + 128 * h));
      const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q1, load512(a[i].qs + 128 * h + 64));
      sumi = _mm512_add_epi32(sumi, scaled(d0, spread_quad(sc32, 2 * h)));
      sumi = _mm512_add_epi32(sumi, scaled(d1, spread_quad(sc32, 2 * h + 1)));
    }
    const float d = _cvtsh_ss(b[i].d) * a[i].d;
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// The 2-bit fields of Q2_K/Q3_K's qs: element 128h + 32k + l is bits 2k, 2k + 1
// of qs[32h + l]. Half h as two steps of 64 elements, p = 0 (k = 0, 1) and
// p = 1 (k = 2, 3); each 128-bit lane is one 16-element group.
struct TwoBitHalf {
  __m512i fields;  // qs[32h..] in both 256-bit halves, the upper one shifted right by 2
  explicit TwoBitHalf(const uint8_t* qs) {
    const __m512i q = broadcast256(qs);
    fields = _mm512_mask_srli_epi16(q, 0xFFFF0000u, q, 2);
  }
  __m512i step(int p) const {
    const __m512i v = p == 0 ? fields : _mm512_srli_epi16(fields, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(3));
  }
};

// Q2_K: four-bit scale (low nibble) and min (high nibble) per 16 elements.
float dot_q2_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ2_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  __m512 acc = _mm512_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(&b[i], sizeof(BlockQ2_K));
    const __m128i packed = load128(b[i].scales);
    const __m128i mins = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
    const __m256i msum = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), load256(a[i].bsums));
    const __m512i sc32 = _mm512_cvtepu8_epi32(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
    __m512i sumi = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const TwoBitHalf q(b[i].qs + 32 * h);
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q.step(p), load512(a[i].qs + 128 * h + 64 * p));
        sumi = _mm512_add_epi32(sumi, scaled(dots, spread_quad(sc32, 2 * h + p)));
      }
    }
    const __m128 d = f16_pair_times(&b[i].d, a[i].d);  // d * da, dmin * da
    acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    acc_min = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(d)), _mm256_cvtepi32_ps(msum), acc_min);
  }
  return _mm512_reduce_add_ps(acc) - _mm512_reduce_add_ps(_mm512_zextps256_ps512(acc_min));
}

// The 16 six-bit Q3_K scales, unbiased to -32..31, as int8. With the 12 bytes
// as dwords s0, s1, s2: scales 4i..4i+3 are the low (i = 0, 1) or high (i = 2,
// 3) nibbles of s(i & 1), with bits 2i, 2i + 1 of each byte of s2 on top.
inline __m128i q3_scales(const uint8_t* packed) {
  const __m128i v = _mm_maskz_loadu_epi32(0x7, packed);  // exactly 12 bytes
  __m128i low = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0));  // s0 s1 s0 s1
  low = _mm_and_si128(_mm_srlv_epi32(low, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0F));
  __m128i high = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
  high = _mm_and_si128(_mm_srlv_epi32(high, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi32(high, 4)), _mm_set1_epi8(32));
}

// Q3_K as unsigned 0..7 (low bits | high bit << 2); the true value is 4 less,
// which comes back as -4 * sum(scale * bsum). Element 32c + l's high bit is
// bit c of hmask[l].
float dot_q3_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ3_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(&b[i], sizeof(BlockQ3_K));
    const __m256i sc16 = _mm256_cvtepi8_epi16(q3_scales(b[i].scales));
    const __m256i bias = _mm256_madd_epi16(sc16, load256(a[i].bsums));
    const __m512i sc32 = _mm512_cvtepu16_epi32(sc16);  // low word the signed scale, high word 0
    __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_slli_epi32(bias, 2)));
    const __m512i hmask = broadcast256(b[i].hmask);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const TwoBitHalf q(b[i].qs + 32 * h);
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const int c = 4 * h + 2 * p;  // the step's first 32 elements; the other 32 are c + 1
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << c)),
                                               _mm256_set1_epi8(static_cast<char>(2 << c)), 1);
        const __m512i v = _mm512_mask_add_epi8(q.step(p), _mm512_test_epi8_mask(hmask, bit), q.step(p),
                                               _mm512_set1_epi8(4));
        const __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, load512(a[i].qs + 128 * h + 64 * p));
        sumi = _mm512_add_epi32(sumi, scaled(dots, spread_quad(sc32, 2 * h + p)));
      }
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(b[i].d) * a[i].d), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace deepinfer::cpu::quants::avx512

DEEPINFER_ISA_END

#endif  // DEEPINFER_QUANTS_AVX512
