// Vectorised inner loops shared by the CPU ops: AVX2/FMA when the compiler
// targets it, scalar otherwise. n is any non-negative length.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/vec_kernels.h"
#include "core/half.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DEEPINFER_CPU_AVX2 1
#endif

namespace deepinfer::cpu::vec {

#if DEEPINFER_CPU_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load_bf16(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if DEEPINFER_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline float dot_f16(const uint16_t* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if DEEPINFER_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load_f16(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(load_f16(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_f16(a + i), _mm256_loadu_ps(b + i), acc0);
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += f16_to_f32(a[i]) * b[i];
  return sum;
}

inline float dot_bf16(const uint16_t* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if DEEPINFER_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(load_bf16(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_bf16(a + i), _mm256_loadu_ps(b + i), acc0);
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += bf16_to_f32(a[i]) * b[i];
  return sum;
}

inline void f16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16(src + i));
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

inline void bf16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(src + i));
#endif
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Loads of 8 cache elements as f32: f32 itself, or f16 (IEEE half, as the
// CPU KV cache holds it) widened exactly.
#if DEEPINFER_CPU_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return load_f16(p); }
#endif
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return f16_to_f32(*p); }

// out[j] = dot(q, k + j * stride) for j < count: the attention logits of a
// run of keys (f32 or f16). Eight keys at a time keep eight accumulators and
// reduce them together (a transposing tree of hadds), instead of one
// horizontal sum per key.
template <typename T>
inline void dot_strided(const float* q, const T* k, int64_t stride, int64_t count, int64_t n, float* out) {
  int64_t j = 0;
#if DEEPINFER_CPU_AVX2
  if (n % 8 == 0) {
    for (; j + 8 <= count; j += 8) {
      const T* kj = k + j * stride;
      __m256 acc[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t i = 0; i < n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, load8(kj + r * stride + i), acc[r]);
      }
      const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
      const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
      const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
      // lo = [keys 0-3 of the low half-lanes | keys 0-3 of the high ones], hi the same for keys 4-7.
      const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
      _mm256_storeu_ps(out + j, sums);
    }
  }
#endif
  for (; j < count; ++j) {
    const T* kj = k + j * stride;
    if constexpr (std::is_same_v<T, float>) {
      out[j] = dot(q, kj, n);
    } else {
      out[j] = dot_f16(kj, q, n);
    }
  }
}

// acc[i] += sum_j w[j] * v[j * stride + i] for i < n, j < count (v f32 or
// f16), adding the terms in order of j as count axpy calls would, but with 64
// accumulators at a time held in registers across the rows instead of stored
// after each.
template <typename T>
inline void accumulate_strided(float* acc, const float* w, const T* v, int64_t stride, int64_t count, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  for (; i + 64 <= n; i += 64) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm256_loadu_ps(acc + i + 8 * r);
    for (int64_t j = 0; j < count; ++j) {
      const __m256 wj = _mm256_set1_ps(w[j]);
      const T* vj = v + j * stride + i;
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(wj, load8(vj + 8 * r), a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(acc + i + 8 * r, a[r]);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(acc + i);
    for (int64_t j = 0; j < count; ++j) a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), load8(v + j * stride + i), a);
    _mm256_storeu_ps(acc + i, a);
  }
#endif
  for (; i < n; ++i) {
    for (int64_t j = 0; j < count; ++j) acc[i] += w[j] * load1(v + j * stride + i);
  }
}

// f32 -> f16 (round to nearest even, as f32_to_f16).
inline void f32_to_f16_row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

// y[i] = y[i] * s + a * x[i]
inline void scale_add(float* y, float s, float a, const float* x, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  __m256 vs = _mm256_set1_ps(s), va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    __m256 vy = _mm256_mul_ps(_mm256_loadu_ps(y + i), vs);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), vy));
  }
#endif
  for (; i < n; ++i) y[i] = y[i] * s + a * x[i];
}

// y[i] += a * x[i]
inline void axpy(float* y, float a, const float* x, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

inline void scale(float* y, float s, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  __m256 vs = _mm256_set1_ps(s);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
#endif
  for (; i < n; ++i) y[i] *= s;
}

// Sixteen partial sums keep the f32 rounding error small for hidden-state rows.
inline float sum_squares(const float* x, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if DEEPINFER_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(x + i);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
  }
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

#if DEEPINFER_CPU_AVX2
// e^x for every lane, within 2 ulp of expf on [-87.3, 88.7]; below that it
// returns 0 (where expf goes subnormal), above it saturates at e^88.7. Range
// reduction x = k ln2 + r with |r| <= ln2/2 (ln2 split in two so that k ln2
// is exact), a degree-6 polynomial for e^r, and 2^k put into the exponent.
inline __m256 exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(vec_constants::kExpMax), lo = _mm256_set1_ps(vec_constants::kExpMin);
  const __m256 too_small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(vec_constants::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(vec_constants::kLn2Hi), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(vec_constants::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(vec_constants::kExpPoly[0]);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vec_constants::kExpPoly[1]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vec_constants::kExpPoly[2]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vec_constants::kExpPoly[3]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vec_constants::kExpPoly[4]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(vec_constants::kExpPoly[5]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^k: k in [-126, 128] here; 2^128 is split as 2^127 * 2 to stay finite.
  const __m256i ki = _mm256_cvtps_epi32(k);
  const __m256i half = _mm256_srai_epi32(ki, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ki, half), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(too_small, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}
#endif

// Applies f (a function of __m256 on AVX2 builds, of float otherwise) to n
// floats. The tail goes through the vector code too, padded, so that every
// element gets the same arithmetic wherever it sits in a row.
template <typename VectorFn, typename ScalarFn>
inline void map(float* out, const float* a, const float* b, int64_t n, VectorFn vf, ScalarFn sf) {
#if DEEPINFER_CPU_AVX2
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, vf(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    alignas(32) float ta[8] = {}, tb[8] = {}, to[8];
    for (int64_t j = i; j < n; ++j) ta[j - i] = a[j], tb[j - i] = b[j];
    _mm256_store_ps(to, vf(_mm256_load_ps(ta), _mm256_load_ps(tb)));
    for (int64_t j = i; j < n; ++j) out[j] = to[j - i];
  }
#else
  for (int64_t i = 0; i < n; ++i) out[i] = sf(a[i], b[i]);
#endif
}

// x[i] = e^(x[i] - max) for i < n; returns their sum, added in index order.
inline float exp_shifted_sum(float* x, float max, int64_t n) {
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  const __m256 vmax = _mm256_set1_ps(max);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax)));
  if (i < n) {
    alignas(32) float t[8] = {};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    _mm256_store_ps(t, exp(_mm256_sub_ps(_mm256_load_ps(t), vmax)));
    for (int64_t j = i; j < n; ++j) x[j] = t[j - i];
  }
#else
  for (; i < n; ++i) x[i] = std::exp(x[i] - max);
#endif
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  return sum;
}

// out = silu(g) * u = g / (1 + e^-g) * u
inline void silu_mul(float* out, const float* g, const float* u, int64_t n) {
  map(out, g, u, n,
#if DEEPINFER_CPU_AVX2
      [](__m256 vg, __m256 vu) {
        const __m256 one = _mm256_set1_ps(1.0f);
        const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), vg));
        return _mm256_mul_ps(_mm256_div_ps(vg, _mm256_add_ps(one, e)), vu);
      },
#else
      nullptr,
#endif
      [](float vg, float vu) { return vg / (1.0f + std::exp(-vg)) * vu; });
}

// out = gelu_tanh(g) * u. 0.5 g (1 + tanh z) equals g / (1 + e^(-2z)), one
// exponential instead of a tanh; z = sqrt(2/pi) (g + 0.044715 g^3).
inline void gelu_tanh_mul(float* out, const float* g, const float* u, int64_t n) {
  constexpr float kTwoSqrt2OverPi = vec_constants::kGeluTwoSqrt2OverPi;
  map(out, g, u, n,
#if DEEPINFER_CPU_AVX2
      [](__m256 vg, __m256 vu) {
        const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(vg, vg), vg);
        const __m256 z2 = _mm256_mul_ps(_mm256_set1_ps(kTwoSqrt2OverPi),
                                        _mm256_fmadd_ps(_mm256_set1_ps(vec_constants::kGeluCubic), g3, vg));
        const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), z2));
        return _mm256_mul_ps(_mm256_div_ps(vg, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), vu);
      },
#else
      nullptr,
#endif
      [](float vg, float vu) {
        const float z2 = kTwoSqrt2OverPi * (vg + vec_constants::kGeluCubic * vg * vg * vg);
        return vg / (1.0f + std::exp(-z2)) * vu;
      });
}

}  // namespace deepinfer::cpu::vec
