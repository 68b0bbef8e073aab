// AVX2 dot products of the K-quants with Q8_K activations. Every variant turns
// 32 weights into unsigned bytes (< 64), multiplies them with 32 activation
// bytes by maddubs, weights the 16-bit pair sums by the sub-block scales with
// madd, and accumulates int32 over the super-block. Offsets and mins are
// folded in at the end through the activation block sums (bsums).
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX2)

#include <cstring>

#include "core/half.h"

namespace deepinfer::cpu::quants::avx2 {

namespace {

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Scales for 32 elements made of two 16-element groups: int16 lanes 0..7 get
// s0, lanes 8..15 get s1 (the order of maddubs' pair sums).
inline __m256i scale_pair(int16_t s0, int16_t s1) {
  return _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
}

// sum over 16 groups of scales[g] * bsums[g]; scales given as 16 int8.
inline int scaled_bsums(__m128i scales_i8, const int16_t* bsums) {
  const __m256i s = _mm256_cvtepi8_epi16(scales_i8);
  return hsum(_mm256_madd_epi16(s, load256(bsums)));
}

// The 16 six-bit Q3_K scales, unbiased to -32..31, as int8.
inline __m128i q3_scales(const uint8_t* packed) {
  uint32_t s[3];
  std::memcpy(s, packed, 12);
  const uint32_t lo = 0x0F0F0F0F, hi = 0x03030303;
  const __m128i v = _mm_setr_epi32(
      static_cast<int>((s[0] & lo) | ((s[2] & hi) << 4)),
      static_cast<int>((s[1] & lo) | (((s[2] >> 2) & hi) << 4)),
      static_cast<int>(((s[0] >> 4) & lo) | (((s[2] >> 4) & hi) << 4)),
      static_cast<int>(((s[1] >> 4) & lo) | (((s[2] >> 6) & hi) << 4)));
  return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

// The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of Q4_K/Q5_K.
inline void k4_scales_mins(const uint8_t* packed, uint8_t* out) {
  uint32_t s[3];
  std::memcpy(s, packed, 12);
  const uint32_t six = 0x3F3F3F3F, lo = 0x0F0F0F0F, hi = 0x03030303;
  const uint32_t words[4] = {
      s[0] & six,
      (s[2] & lo) | (((s[0] >> 6) & hi) << 4),
      s[1] & six,
      ((s[2] >> 4) & lo) | (((s[1] >> 6) & hi) << 4),
  };
  std::memcpy(out, words, 16);
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with a six-bit scale and min each.
template <typename Block, bool kHighBits>
float dot_k4_family(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<Block>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  const __m256i nibble = _mm256_set1_epi8(0xF);
  const __m256i bit0 = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(b + i, sizeof(Block));
    alignas(16) uint8_t sm[16];
    k4_scales_mins(b[i].scales, sm);
    // Mins pair with sums over 32 activations: add adjacent bsums first.
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a[i].bsums)),
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[i].bsums + 8)));
    const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8)));
    const __m128i m4 = _mm_madd_epi16(mins, bs);
    __m128i m2 = _mm_add_epi32(m4, _mm_unpackhi_epi64(m4, m4));
    const int msum = _mm_cvtsi128_si32(_mm_add_epi32(m2, _mm_shuffle_epi32(m2, 1)));

    __m256i qh;
    if constexpr (kHighBits) qh = load256(b[i].qh);
    __m256i sumi = _mm256_setzero_si256();
    const int8_t* act = a[i].qs;
    for (int j = 0; j < 4; ++j, act += 64) {
      const __m256i packed = load256(b[i].qs + 32 * j);
      __m256i q_lo = _mm256_and_si256(packed, nibble);
      __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      if constexpr (kHighBits) {
        // Bit 2j of qh[l] belongs to q_lo, bit 2j+1 to q_hi; shift them to bit 4.
        q_lo = _mm256_or_si256(q_lo, _mm256_slli_epi16(_mm256_and_si256(qh, bit0), 4));
        qh = _mm256_srli_epi16(qh, 1);
        q_hi = _mm256_or_si256(q_hi, _mm256_slli_epi16(_mm256_and_si256(qh, bit0), 4));
        qh = _mm256_srli_epi16(qh, 1);
      }
      const __m256i p_lo = _mm256_maddubs_epi16(q_lo, load256(act));
      const __m256i p_hi = _mm256_maddubs_epi16(q_hi, load256(act + 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p_lo, _mm256_set1_epi16(sm[2 * j])));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p_hi, _mm256_set1_epi16(sm[2 * j + 1])));
    }
    const float da = a[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    acc_min += f16_to_f32(b[i].dmin) * da * static_cast<float>(msum);
  }
  return hsum(acc) - acc_min;
}

}  // namespace

float dot_q4_k(const void* w, const void* x, int64_t n) {
  return dot_k4_family<BlockQ4_K, false>(w, x, n);
}

float dot_q5_k(const void* w, const void* x, int64_t n) {
  return dot_k4_family<BlockQ5_K, true>(w, x, n);
}

float dot_q2_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ2_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  const __m256i two_bits = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(b + i, sizeof(BlockQ2_K));
    const __m128i packed_scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].scales));
    const __m128i mins = _mm_and_si128(_mm_srli_epi16(packed_scales, 4), _mm_set1_epi8(0xF));
    const int msum = scaled_bsums(mins, a[i].bsums);
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc),
                       _mm256_cvtepu8_epi16(_mm_and_si128(packed_scales, _mm_set1_epi8(0xF))));
    __m256i sumi = _mm256_setzero_si256();
    const int8_t* act = a[i].qs;
    for (int h = 0; h < 2; ++h) {
      __m256i packed = load256(b[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k, act += 32) {
        const __m256i q = _mm256_and_si256(packed, two_bits);
        packed = _mm256_srli_epi16(packed, 2);
        const int g = 8 * h + 2 * k;
        const __m256i p = _mm256_maddubs_epi16(q, load256(act));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc[g], sc[g + 1])));
      }
    }
    const float da = a[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d) * da), _mm256_cvtepi32_ps(sumi), acc);
    acc_min += f16_to_f32(b[i].dmin) * da * static_cast<float>(msum);
  }
  return hsum(acc) - acc_min;
}

// Q3_K as unsigned 0..7 (low bits | high bit << 2); the true value is 4 less,
// which comes back as -4 * sum(scale * bsum).
float dot_q3_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ3_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  const __m256i two_bits = _mm256_set1_epi8(3);
  const __m256i bit0 = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(b + i, sizeof(BlockQ3_K));
    const __m128i scales = q3_scales(b[i].scales);
    const int bias = 4 * scaled_bsums(scales, a[i].bsums);
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), _mm256_cvtepi8_epi16(scales));
    __m256i hm = load256(b[i].hmask);
    __m256i sumi = _mm256_setzero_si256();
    const int8_t* act = a[i].qs;
    for (int h = 0; h < 2; ++h) {
      __m256i packed = load256(b[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k, act += 32) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(hm, bit0), 2);
        hm = _mm256_srli_epi16(hm, 1);
        const __m256i q = _mm256_or_si256(_mm256_and_si256(packed, two_bits), high);
        packed = _mm256_srli_epi16(packed, 2);
        const int g = 8 * h + 2 * k;
        const __m256i p = _mm256_maddubs_epi16(q, load256(act));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc[g], sc[g + 1])));
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(bias, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d) * a[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// Q6_K as unsigned 0..63; the bias of 32 comes back as -32 * sum(scale * bsum).
float dot_q6_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ6_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  const __m256i nibble = _mm256_set1_epi8(0xF);
  const __m256i two_bits = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    prefetch_weights(b + i, sizeof(BlockQ6_K));
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].scales));
    const int bias = 32 * scaled_bsums(scales, a[i].bsums);
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), _mm256_cvtepi8_epi16(scales));
    __m256i sumi = _mm256_setzero_si256();
    const int8_t* act = a[i].qs;
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(b[i].ql + 64 * h);
      const __m256i ql1 = load256(b[i].ql + 64 * h + 32);
      __m256i qh = load256(b[i].qh + 32 * h);
      const __m256i low[4] = {
          _mm256_and_si256(ql0, nibble), _mm256_and_si256(ql1, nibble),
          _mm256_and_si256(_mm256_srli_epi16(ql0, 4), nibble),
          _mm256_and_si256(_mm256_srli_epi16(ql1, 4), nibble)};
      for (int k = 0; k < 4; ++k, act += 32) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(qh, two_bits), 4);
        qh = _mm256_srli_epi16(qh, 2);
        const __m256i q = _mm256_or_si256(low[k], high);
        const int g = 8 * h + 2 * k;
        const __m256i p = _mm256_maddubs_epi16(q, load256(act));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc[g], sc[g + 1])));
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(bias, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d) * a[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

}  // namespace deepinfer::cpu::quants::avx2

#endif  // DEEPINFER_QUANTS_AVX2
