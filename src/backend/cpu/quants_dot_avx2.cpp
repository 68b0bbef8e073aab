// AVX2/FMA/F16C kernels for the float weights, the 32-element block formats
// and the activation quantisers. Each 32-element block becomes one 256-bit
// vector of bytes multiplied with the Q8_1 activation block by maddubs.
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX2)

#include <cmath>
#include <cstring>

#include "core/half.h"

namespace deepinfer::cpu::quants::avx2 {

namespace {

// 16 packed bytes -> 32 quants: low nibbles are elements 0..15, high 16..31.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

// Bit i of the 32-bit little-endian qh becomes 0x10 in byte i.
inline __m256i high_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i byte_of_bit = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                 0x0101010101010101, 0x0000000000000000);
  const __m256i bit_in_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), byte_of_bit);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit_in_byte), bit_in_byte);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

inline __m256i load_bytes(const BlockQ8_0& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}

// Q4_0/Q5_0: unsigned quants minus a fixed offset, so sum(w*a) = d * (sum(q*a)
// - offset * sum(a)): the unsigned bytes go straight into maddubs and the
// offset term comes from the Q8_1 activations' scaled block sum s, one scalar
// multiply-add per block.
template <typename Block, int kOffset, bool kHighBits>
float dot_offset_form(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<Block>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float off0 = 0.0f, off1 = 0.0f;
  const int64_t nb = n / kQK;
  auto block = [&](int64_t i, __m256 acc, float& off_sum) {
    __m256i q = unpack_nibbles(b[i].qs);
    if constexpr (kHighBits) q = _mm256_or_si256(q, high_bits(b[i].qh));
    const __m256i act = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const float dw = f16_to_f32(b[i].d);
    off_sum = std::fma(dw, a[i].s, off_sum);
    return _mm256_fmadd_ps(_mm256_set1_ps(dw * a[i].d), _mm256_cvtepi32_ps(dot_u8_i8(q, act)), acc);
  };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    prefetch_weights(b + i, 2 * sizeof(Block));
    acc0 = block(i, acc0, off0);
    acc1 = block(i + 1, acc1, off1);
  }
  if (i < nb) acc0 = block(i, acc0, off0);
  return hsum(_mm256_add_ps(acc0, acc1)) - static_cast<float>(kOffset) * (off0 + off1);
}

// Q4_1/Q5_1: unsigned quants times d plus a min m, so sum(w*a) needs sum(a):
// the Q8_1 activations carry it (s = d_a * sum(a)) and each block adds m * s
// to a scalar sum (re-summing a for every weight row was a third of the work).
template <typename Block, bool kHighBits>
float dot_min_form(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<Block>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float min0 = 0.0f, min1 = 0.0f;
  const int64_t nb = n / kQK;
  auto block = [&](int64_t i, __m256 acc, float& min_sum) {
    // The adjacent f16 d and m converted together.
    uint32_t dm;
    std::memcpy(&dm, &b[i], 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm)));
    __m256i q = unpack_nibbles(b[i].qs);
    if constexpr (kHighBits) q = _mm256_or_si256(q, high_bits(b[i].qh));
    const __m256i act = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    min_sum = std::fma(_mm_cvtss_f32(_mm_movehdup_ps(f)), a[i].s, min_sum);
    const __m256 dq = _mm256_set1_ps(_mm_cvtss_f32(f) * a[i].d);
    return _mm256_fmadd_ps(dq, _mm256_cvtepi32_ps(dot_u8_i8(q, act)), acc);
  };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    prefetch_weights(b + i, 2 * sizeof(Block));
    acc0 = block(i, acc0, min0);
    acc1 = block(i + 1, acc1, min1);
  }
  if (i < nb) acc0 = block(i, acc0, min0);
  return hsum(_mm256_add_ps(acc0, acc1)) + (min0 + min1);
}

// Float weights: four independent accumulators hide the FMA latency.
template <typename Load, typename LoadOne>
float dot_float(const float* x, int64_t n, Load load, LoadOne load_one) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int u = 0; u < 4; ++u) {
      acc[u] = _mm256_fmadd_ps(load(i + 8 * u), _mm256_loadu_ps(x + i + 8 * u), acc[u]);
    }
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x + i), acc[0]);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += load_one(i) * x[i];
  return sum;
}

// Largest |x| over 8 * count floats.
inline float abs_max(const float* x, int count) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < count; ++j) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * j)));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// round(x * id) for 32 floats, clamped to +-127, stored as 32 int8 in order.
inline void quantize_32(const float* x, float id, int8_t* out) {
  const __m256 scale = _mm256_set1_ps(id);
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  __m256i v[4];
  for (int j = 0; j < 4; ++j) {
    __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), scale);
    f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
  }
  // The packs interleave 128-bit lanes; the permute restores element order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

}  // namespace

float dot_f32(const void* w, const void* x, int64_t n) {
  const auto* wf = static_cast<const float*>(w);
  return dot_float(
      static_cast<const float*>(x), n, [wf](int64_t i) { return _mm256_loadu_ps(wf + i); },
      [wf](int64_t i) { return wf[i]; });
}

float dot_f16(const void* w, const void* x, int64_t n) {
  const auto* wh = static_cast<const uint16_t*>(w);
  return dot_float(
      static_cast<const float*>(x), n,
      [wh](int64_t i) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + i)));
      },
      [wh](int64_t i) { return f16_to_f32(wh[i]); });
}

float dot_bf16(const void* w, const void* x, int64_t n) {
  const auto* wh = static_cast<const uint16_t*>(w);
  return dot_float(
      static_cast<const float*>(x), n,
      [wh](int64_t i) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      },
      [wh](int64_t i) { return bf16_to_f32(wh[i]); });
}

float dot_q4_0(const void* w, const void* x, int64_t n) {
  return dot_offset_form<BlockQ4_0, 8, false>(w, x, n);
}
float dot_q5_0(const void* w, const void* x, int64_t n) {
  return dot_offset_form<BlockQ5_0, 16, true>(w, x, n);
}
float dot_q4_1(const void* w, const void* x, int64_t n) {
  return dot_min_form<BlockQ4_1, false>(w, x, n);
}
float dot_q5_1(const void* w, const void* x, int64_t n) {
  return dot_min_form<BlockQ5_1, true>(w, x, n);
}

float dot_q8_0(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ8_0>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int64_t nb = n / kQK;
  auto block = [&](int64_t i, __m256 acc) {
    const __m256i act = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256 d = _mm256_set1_ps(f16_to_f32(b[i].d) * a[i].d);
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_i8(load_bytes(b[i]), act)), acc);
  };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    prefetch_weights(b + i, 2 * sizeof(BlockQ8_0));
    acc0 = block(i, acc0);
    acc1 = block(i + 1, acc1);
  }
  if (i < nb) acc0 = block(i, acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

// Same scales and rounding as scalar::quantize_q8_1, so both give the same bytes.
void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    const float amax = abs_max(src, kQK / 8);
    b[i].d = f16_to_f32(q8_0_scale(amax));
    quantize_32(src, b[i].d > 0.0f ? 1.0f / b[i].d : 0.0f, b[i].qs);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
    const __m256i pairs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(1));
    const __m256i pairs_hi =
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(1));
    b[i].s = b[i].d * static_cast<float>(hsum(_mm256_add_epi32(pairs, pairs_hi)));
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, src += kQKK) {
    const float amax = abs_max(src, kQKK / 8);
    b[i].d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < kQKK / 32; ++j) quantize_32(src + 32 * j, id, b[i].qs + 32 * j);
    for (int g = 0; g < kQKK / 16; ++g) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16 * g));
      const __m256i wide = _mm256_cvtepi8_epi16(q);
      const __m256i pairs = _mm256_madd_epi16(wide, _mm256_set1_epi16(1));
      b[i].bsums[g] = static_cast<int16_t>(hsum(pairs));
    }
  }
}

}  // namespace deepinfer::cpu::quants::avx2

#endif  // DEEPINFER_QUANTS_AVX2
