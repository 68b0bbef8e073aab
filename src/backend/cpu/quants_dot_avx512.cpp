// AVX-512 + VNNI kernels for the float weights, the 32-element block formats
// and the activation quantisers. The block formats work on groups of up to 16
// blocks: the blocks' scales are gathered into one 16-lane vector each, and
// every pair of blocks becomes one 512-bit vector of bytes (block A in int32
// lanes 0..7, block B in 8..15) multiplied with the Q8_1 activations by
// vpdpbusd; the pair's two scales are spread over those lanes by one permute.
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX512)

#include <cstring>

#include "core/half.h"
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

// Pair p of a group (blocks 2p and 2p + 1; a lone last block pairs with
// itself and its copy's scale is zero): acc + scales * dots, the scales taken
// from `scale` (and `scale16`, scale / 16) by one permute.
template <Kind K>
inline __m512 pair_step(const typename Format<K>::Block* b, const BlockQ8_1* a, int count, int p, __m512 scale,
                        __m512 scale16, __m512 acc) {
  const int ia = 2 * p, ib = 2 * p + 1 < count ? 2 * p + 1 : 2 * p;
  const __m512 dot = _mm512_cvtepi32_ps(pair_dot<K>(b[ia], b[ib], a[ia], a[ib]));
  __m512 sc;
  if constexpr (Format<K>::kSixteenths) {
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 16, 16, 16, 16, 1, 1, 1, 1, 17, 17, 17, 17);
    sc = _mm512_permutex2var_ps(scale, _mm512_add_epi32(lanes, _mm512_set1_epi32(2 * p)), scale16);
  } else {
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    sc = _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(2 * p)), scale);
  }
  return _mm512_fmadd_ps(sc, dot, acc);
}

// Per-group state: the float accumulators of the block sums and of the
// offset/min terms.
struct Sums {
  __m512 acc0, acc1, extra;
};

// Blocks 0 .. count - 1 of b and a (1 <= count <= 16; 16 when kFull, which
// unrolls the pairs). The scales come from masked gathers: lanes past count
// are zero.
template <Kind K, bool kFull>
inline void group(const typename Format<K>::Block* b, const BlockQ8_1* a, int tail, Sums& s) {
  using F = Format<K>;
  const int count = kFull ? 16 : tail;
  const __mmask16 live = count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i w_off = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(sizeof(typename F::Block))));
  const __m512i a_off = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(sizeof(BlockQ8_1))));
  const __m512i zero = _mm512_setzero_si512();
  // d (and m) of each weight block: the first 4 bytes.
  const __m512i dm = _mm512_mask_i32gather_epi32(zero, live, w_off, b, 1);
  const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
  const __m512 da = _mm512_castsi512_ps(_mm512_mask_i32gather_epi32(zero, live, a_off, &a->d, 1));
  const __m512 sa = _mm512_castsi512_ps(_mm512_mask_i32gather_epi32(zero, live, a_off, &a->s, 1));
  if constexpr (F::kMin) {
    const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
    s.extra = _mm512_fmadd_ps(mw, sa, s.extra);
  } else if constexpr (F::kOffset != 0) {
    s.extra = _mm512_fmadd_ps(dw, sa, s.extra);
  }
  const __m512 scale = _mm512_mul_ps(dw, da);
  const __m512 scale16 = _mm512_mul_ps(scale, _mm512_set1_ps(1.0f / 16));
  prefetch_weights(b, 16 * sizeof(typename F::Block));
  const int pairs = (count + 1) / 2;
  int p = 0;
#pragma GCC unroll 4
  for (; p + 2 <= pairs; p += 2) {
    s.acc0 = pair_step<K>(b, a, count, p, scale, scale16, s.acc0);
    s.acc1 = pair_step<K>(b, a, count, p + 1, scale, scale16, s.acc1);
  }
  if (p < pairs) s.acc0 = pair_step<K>(b, a, count, p, scale, scale16, s.acc0);
}

template <Kind K>
float dot_blocks(const void* w, const void* x, int64_t n) {
  using F = Format<K>;
  const auto* b = blocks_of<typename F::Block>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  const int64_t nb = n / kQK;
  Sums s{_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 16 <= nb; i += 16) group<K, true>(b + i, a + i, 16, s);
  if (i < nb) group<K, false>(b + i, a + i, static_cast<int>(nb - i), s);
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(s.acc0, s.acc1));
  if constexpr (F::kMin) return sum + _mm512_reduce_add_ps(s.extra);
  if constexpr (F::kOffset != 0) return sum - static_cast<float>(F::kOffset) * _mm512_reduce_add_ps(s.extra);
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
// Q8_0 reads 34 bytes per 32 elements, so it streams at memory speed unless
// the per-block work is small: two blocks per vector as in pair_dot, but the
// two scales broadcast from scalars rather than gathered and permuted per 16
// blocks (on an EPYC core the gathers cost more than they save: 20 GB/s
// against the AVX2 kernel's 25 at 128 MiB, bench_quants).
float dot_q8_0(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ8_0>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  const int64_t nb = n / kQK;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  auto pair = [&](int64_t i, __m512 acc) {
    const __m512i dot = pair_dot<Kind::Q8_0>(b[i], b[i + 1], a[i], a[i + 1]);
    const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(f16_to_f32(b[i].d) * a[i].d),
                                            _mm256_set1_ps(f16_to_f32(b[i + 1].d) * a[i + 1].d), 1);
    return _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc);
  };
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    prefetch_weights(b + i, 4 * sizeof(BlockQ8_0));
    acc0 = pair(i, acc0);
    acc1 = pair(i + 2, acc1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < nb; ++i) {  // at most 3 blocks
    const __m256i wq = load256(b[i].qs), xq = load256(a[i].qs);
    const __m256i xs = _mm256_mask_sub_epi8(xq, _mm256_movepi8_mask(wq), _mm256_setzero_si256(), xq);
    const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wq), xs);
    sum += f16_to_f32(b[i].d) * a[i].d * _mm512_reduce_add_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(dot)));
  }
  return sum;
}

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
