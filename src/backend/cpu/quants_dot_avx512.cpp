// AVX-512 + VNNI kernels for the float weights, the 32-element block formats
// and the activation quantisers. The block formats work on groups of up to 16
// blocks: the blocks' scales are gathered into one 16-lane vector each, and
// every pair of blocks becomes one 512-bit vector of bytes (block A in int32
// lanes 0..7, block B in 8..15) multiplied with the Q8_1 activations by
// vpdpbusd; the pair's two scales are spread over those lanes by one permute.
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX512)

#include <cstring>

#include "backend/cpu/isa_target.h"

DEEPINFER_ISA_BEGIN(DEEPINFER_AVX512_FEATURES)

namespace deepinfer::cpu::quants::avx512 {

namespace {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two 32-byte halves, a in bytes 0..31 and b in 32..63.
inline __m512i join256(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(a)), load256(b), 1);
}

// The 32 quants of two nibble blocks as bytes, each block's elements in order:
// [a low nibbles, a high nibbles, b low nibbles, b high nibbles].
inline __m512i nibble_pair(const uint8_t* a, const uint8_t* b) {
  __m512i v = _mm512_broadcast_i32x4(load128(a));
  v = _mm512_mask_broadcast_i32x4(v, 0xFF00, load128(b));
  v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);
  return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

// The same without the shift: the high nibbles stay in bits 4..7 (16 times
// their value; the caller scales those lanes by 1/16, exactly).
inline __m512i nibble_pair_x16(const uint8_t* a, const uint8_t* b) {
  __m512i v = _mm512_broadcast_i32x4(load128(a));
  v = _mm512_mask_broadcast_i32x4(v, 0xFF00, load128(b));
  const int64_t lo = 0x0F0F0F0F0F0F0F0F, hi = static_cast<int64_t>(0xF0F0F0F0F0F0F0F0u);
  return _mm512_and_si512(v, _mm512_setr_epi64(lo, lo, hi, hi, lo, lo, hi, hi));
}

// Fifth bits of two Q5 blocks (bit i of each little-endian qh is element i)
// added to nibble_pair's bytes.
inline __m512i add_high_pair(__m512i q, const uint8_t* qh_a, const uint8_t* qh_b) {
  const __mmask64 bits = static_cast<__mmask64>(load_u32(qh_a)) | (static_cast<__mmask64>(load_u32(qh_b)) << 32);
  return _mm512_mask_add_epi8(q, bits, q, _mm512_set1_epi8(0x10));
}

// Which weight format a group kernel handles.
enum class Kind { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 };

template <Kind K>
struct Format;
template <>
struct Format<Kind::Q4_0> {
  using Block = BlockQ4_0;
  static constexpr bool kSixteenths = true;
  static constexpr int kOffset = 8;
  static constexpr bool kMin = false;
};
template <>
struct Format<Kind::Q4_1> {
  using Block = BlockQ4_1;
  static constexpr bool kSixteenths = true;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
};
template <>
struct Format<Kind::Q5_0> {
  using Block = BlockQ5_0;
  static constexpr bool kSixteenths = false;
  static constexpr int kOffset = 16;
  static constexpr bool kMin = false;
};
template <>
struct Format<Kind::Q5_1> {
  using Block = BlockQ5_1;
  static constexpr bool kSixteenths = false;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
};
template <>
struct Format<Kind::Q8_0> {
  using Block = BlockQ8_0;
  static constexpr bool kSixteenths = false;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = false;
};

// sum over the 32 elements of blocks a and b of weight quant times activation,
// per 4 elements: int32 lanes 0..7 for a, 8..15 for b (for kSixteenths
// formats lanes 4..7 and 12..15 hold 16 times their sum).
template <Kind K>
inline __m512i pair_dot(const typename Format<K>::Block& wa, const typename Format<K>::Block& wb,
                        const BlockQ8_1& xa, const BlockQ8_1& xb) {
  const __m512i x = join256(xa.qs, xb.qs);
  if constexpr (K == Kind::Q8_0) {
    // Signed times signed: |w| (unsigned; -128 becomes 128) times x with w's sign.
    const __m512i w = join256(wa.qs, wb.qs);
    const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), xs);
  } else if constexpr (Format<K>::kSixteenths) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibble_pair_x16(wa.qs, wb.qs), x);
  } else {
    __m512i q = nibble_pair(wa.qs, wb.qs);
    if constexpr (K == Kind::Q5_0 || K == Kind::Q5_1) q = add_high_pair(q, wa.qh, wb.qh);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x);
  }
}

// An f16 to f32 by the F16C instruction (core/half.h's inline version is
// compiled for the baseline, outside this region: a software conversion).
inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// Block i's scale: the weight's d times the activation's.
template <Kind K>
inline float block_scale(const typename Format<K>::Block& w, const BlockQ8_1& x) {
  return half_to_float(w.d) * x.d;
}

// Block i's offset/min term: min(w) * s(x) (Q4_1, Q5_1, added) or
// d(w) * s(x) (Q4_0, Q5_0, subtracted kOffset times).
template <Kind K>
inline float block_extra(const typename Format<K>::Block& w, const BlockQ8_1& x) {
  if constexpr (Format<K>::kMin) {
    return half_to_float(w.m) * x.s;
  } else if constexpr (Format<K>::kOffset != 0) {
    return half_to_float(w.d) * x.s;
  } else {
    return 0.0f;
  }
}

// acc + the dots of blocks i and j (j == i for a lone last block, whose copy's
// scale is zero) times their scales, broadcast from scalars. Gathering the
// scales of 16 blocks at a time and permuting them per pair, as this kernel
// did, cost more than it saved on an EPYC core (Zen 4): in the same runs the
// gathering kernel decoded SmolLM2 Q4_1 at 125-135 tok/s on 2 threads where
// the AVX2 one got 148, and the 1B shape's Q8_0 at 16.5 (this one:
// 18.6-20.0, the AVX2 kernel 18.2-19.1).
template <Kind K>
inline __m512 pair_step(const typename Format<K>::Block* b, const BlockQ8_1* a, int64_t i, int64_t j, __m512 acc) {
  const __m512 dot = _mm512_cvtepi32_ps(pair_dot<K>(b[i], b[j], a[i], a[j]));
  const float si = block_scale<K>(b[i], a[i]), sj = j != i ? block_scale<K>(b[j], a[j]) : 0.0f;
  __m512 sc = _mm512_insertf32x8(_mm512_set1_ps(si), _mm256_set1_ps(sj), 1);
  if constexpr (Format<K>::kSixteenths) {
    // Lanes 4..7 and 12..15 hold 16 times their sums (pair_dot).
    constexpr float q = 1.0f / 16;
    sc = _mm512_mul_ps(sc, _mm512_setr_ps(1, 1, 1, 1, q, q, q, q, 1, 1, 1, 1, q, q, q, q));
  }
  return _mm512_fmadd_ps(sc, dot, acc);
}

template <Kind K>
float dot_blocks(const void* w, const void* x, int64_t n) {
  using F = Format<K>;
  const auto* b = blocks_of<typename F::Block>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  const int64_t nb = n / kQK;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  float extra = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    prefetch_weights(b + i, 4 * sizeof(typename F::Block));
    acc0 = pair_step<K>(b, a, i, i + 1, acc0);
    acc1 = pair_step<K>(b, a, i + 2, i + 3, acc1);
    if constexpr (F::kMin || F::kOffset != 0) {
      extra += (block_extra<K>(b[i], a[i]) + block_extra<K>(b[i + 1], a[i + 1])) +
               (block_extra<K>(b[i + 2], a[i + 2]) + block_extra<K>(b[i + 3], a[i + 3]));
    }
  }
  for (; i < nb; i += 2) {
    acc0 = pair_step<K>(b, a, i, i + 1 < nb ? i + 1 : i, acc0);
    if constexpr (F::kMin || F::kOffset != 0) {
      extra += block_extra<K>(b[i], a[i]) + (i + 1 < nb ? block_extra<K>(b[i + 1], a[i + 1]) : 0.0f);
    }
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  if constexpr (F::kMin) return sum + extra;
  if constexpr (F::kOffset != 0) return sum - static_cast<float>(F::kOffset) * extra;
  return sum;
}

// Float weights, 16 per vector: four accumulators, then a masked tail.
struct LoadF32 {
  static void prefetch(const void* w, int64_t i) {
    const auto* p = static_cast<const float*>(w) + i;
    prefetch_weights(p, 64 * sizeof(float));
  }
  static __m512 load(const void* w, int64_t i) { return _mm512_loadu_ps(static_cast<const float*>(w) + i); }
  static __m512 load_masked(const void* w, int64_t i, __mmask16 k) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(w) + i);
  }
};
struct LoadF16 {
  static void prefetch(const void* w, int64_t i) {
    const auto* p = static_cast<const uint16_t*>(w) + i;
    prefetch_weights(p, 64 * sizeof(uint16_t));
  }
  static __m512 load(const void* w, int64_t i) {
    return _mm512_cvtph_ps(load256(static_cast<const uint16_t*>(w) + i));
  }
  static __m512 load_masked(const void* w, int64_t i, __mmask16 k) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(w) + i));
  }
};
struct LoadBF16 {
  static void prefetch(const void* w, int64_t i) { LoadF16::prefetch(w, i); }
  static __m512 load(const void* w, int64_t i) {
    const __m512i v = _mm512_cvtepu16_epi32(load256(static_cast<const uint16_t*>(w) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  static __m512 load_masked(const void* w, int64_t i, __mmask16 k) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(w) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
};

template <typename L>
float dot_float(const void* w, const float* x, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    L::prefetch(w, i);
    acc0 = _mm512_fmadd_ps(L::load(w, i), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(L::load(w, i + 16), _mm512_loadu_ps(x + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(L::load(w, i + 32), _mm512_loadu_ps(x + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(L::load(w, i + 48), _mm512_loadu_ps(x + i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(L::load(w, i), _mm512_loadu_ps(x + i), acc0);
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc1 = _mm512_fmadd_ps(L::load_masked(w, i, k), _mm512_maskz_loadu_ps(k, x + i), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// round(v * id) clamped to +-127 (the portable quantisers' arithmetic), as int32.
inline __m512i quantize16(__m512 v, __m512 id) {
  __m512 f = _mm512_roundscale_ps(_mm512_mul_ps(v, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtps_epi32(f);
}

inline __m512 abs16(__m512 v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF))); }

}  // namespace

float dot_f32(const void* w, const void* x, int64_t n) {
  return dot_float<LoadF32>(w, static_cast<const float*>(x), n);
}
float dot_f16(const void* w, const void* x, int64_t n) {
  return dot_float<LoadF16>(w, static_cast<const float*>(x), n);
}
float dot_bf16(const void* w, const void* x, int64_t n) {
  return dot_float<LoadBF16>(w, static_cast<const float*>(x), n);
}

float dot_q4_0(const void* w, const void* x, int64_t n) { return dot_blocks<Kind::Q4_0>(w, x, n); }
float dot_q4_1(const void* w, const void* x, int64_t n) { return dot_blocks<Kind::Q4_1>(w, x, n); }
float dot_q5_0(const void* w, const void* x, int64_t n) { return dot_blocks<Kind::Q5_0>(w, x, n); }
float dot_q5_1(const void* w, const void* x, int64_t n) { return dot_blocks<Kind::Q5_1>(w, x, n); }
float dot_q8_0(const void* w, const void* x, int64_t n) { return dot_blocks<Kind::Q8_0>(w, x, n); }

// Same scales and rounding as scalar::quantize_q8_1, so both give the same bytes.
void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(abs16(v0), abs16(v1)));
    const float d = _cvtsh_ss(q8_0_scale(amax));
    const __m512 id = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m512i q0 = quantize16(v0, id), q1 = quantize16(v1, id);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16), _mm512_cvtepi32_epi8(q1));
    b[i].d = d;
    b[i].s = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, src += kQKK) {
    __m512 m = _mm512_setzero_ps();
    for (int g = 0; g < kQKK / 16; ++g) m = _mm512_max_ps(m, abs16(_mm512_loadu_ps(src + 16 * g)));
    const float amax = _mm512_reduce_max_ps(m);
    b[i].d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int g = 0; g < kQKK / 16; ++g) {
      const __m512i q = quantize16(_mm512_loadu_ps(src + 16 * g), id);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16 * g), _mm512_cvtepi32_epi8(q));
      b[i].bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
  }
}

}  // namespace deepinfer::cpu::quants::avx512

DEEPINFER_ISA_END

#endif  // DEEPINFER_QUANTS_AVX512
