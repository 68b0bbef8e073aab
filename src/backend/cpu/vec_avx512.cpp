// AVX-512 versions of the attention and element-wise inner loops
// (vec_kernels.h). Shapes they do not cover (rows that are not a multiple of
// 16 floats, tails) go to the AVX2 kernels - through their out-of-line
// baseline copies (vec_kernels.cpp), never an inline function instantiated
// inside the AVX-512 region, which the linker could share with baseline code.
#include "backend/cpu/vec_kernels.h"

#if defined(__AVX2__) && defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include "backend/cpu/isa_target.h"

DEEPINFER_ISA_BEGIN(DEEPINFER_AVX512_FEATURES)

namespace deepinfer::cpu::vec_avx512 {

namespace {

inline void avx2_dot_strided(const float* q, const float* k, int64_t s, int64_t c, int64_t n, float* o) {
  vec_avx2::dot_strided_f32(q, k, s, c, n, o);
}
inline void avx2_dot_strided(const float* q, const uint16_t* k, int64_t s, int64_t c, int64_t n, float* o) {
  vec_avx2::dot_strided_f16(q, k, s, c, n, o);
}
inline void avx2_accumulate_strided(float* a, const float* w, const float* v, int64_t s, int64_t c, int64_t n) {
  vec_avx2::accumulate_strided_f32(a, w, v, s, c, n);
}
inline void avx2_accumulate_strided(float* a, const float* w, const uint16_t* v, int64_t s, int64_t c, int64_t n) {
  vec_avx2::accumulate_strided_f16(a, w, v, s, c, n);
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// vec::exp with 16 lanes: the same operations lane for lane, so the same bits.
inline __m512 exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(vec_constants::kExpMax), lo = _mm512_set1_ps(vec_constants::kExpMin);
  const __mmask16 too_small = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(vec_constants::kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(vec_constants::kLn2Hi), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(vec_constants::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(vec_constants::kExpPoly[0]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vec_constants::kExpPoly[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vec_constants::kExpPoly[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vec_constants::kExpPoly[3]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vec_constants::kExpPoly[4]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(vec_constants::kExpPoly[5]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ki = _mm512_cvtps_epi32(k);
  const __m512i half = _mm512_srai_epi32(ki, 1);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ki, half), _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~too_small), _mm512_mul_ps(_mm512_mul_ps(p, s1), s2));
}

inline __m512 silu16(__m512 g, __m512 u) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

inline __m512 gelu16(__m512 g, __m512 u) {
  constexpr float kTwoSqrt2OverPi = vec_constants::kGeluTwoSqrt2OverPi;
  const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
  const __m512 z2 =
      _mm512_mul_ps(_mm512_set1_ps(kTwoSqrt2OverPi), _mm512_fmadd_ps(_mm512_set1_ps(vec_constants::kGeluCubic), g3, g));
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), z2));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

// out = f(a, b) elementwise; the tail through masked loads (padding lanes are
// computed and dropped).
template <typename F>
inline void map16(float* out, const float* a, const float* b, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, f(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, f(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

// The sum of 8 registers' lanes, one float per register: halves to 256 bits,
// then the AVX2 transposing tree of hadds.
inline __m256 sum8(const __m512* acc) {
  __m256 y[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    y[r] = _mm256_add_ps(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1));
  }
  const __m256 h01 = _mm256_hadd_ps(y[0], y[1]), h23 = _mm256_hadd_ps(y[2], y[3]);
  const __m256 h45 = _mm256_hadd_ps(y[4], y[5]), h67 = _mm256_hadd_ps(y[6], y[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

template <typename T>
void dot_strided(const float* q, const T* k, int64_t stride, int64_t count, int64_t n, float* out) {
  if (n % 16 != 0) return avx2_dot_strided(q, k, stride, count, n, out);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const T* kj = k + j * stride;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 qv = _mm512_loadu_ps(q + i);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) acc[r] = _mm512_fmadd_ps(qv, load16(kj + r * stride + i), acc[r]);
    }
    _mm256_storeu_ps(out + j, sum8(acc));
  }
  if (j < count) avx2_dot_strided(q, k + j * stride, stride, count - j, n, out + j);
}

// The terms of every element are added in order of j, as vec.h's AVX2 loop
// does, so both give the same bits.
template <typename T>
void accumulate_strided(float* acc, const float* w, const T* v, int64_t stride, int64_t count, int64_t n) {
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm512_loadu_ps(acc + i + 16 * r);
    for (int64_t j = 0; j < count; ++j) {
      const __m512 wj = _mm512_set1_ps(w[j]);
      const T* vj = v + j * stride + i;
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) a[r] = _mm512_fmadd_ps(wj, load16(vj + 16 * r), a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) _mm512_storeu_ps(acc + i + 16 * r, a[r]);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 a = _mm512_loadu_ps(acc + i);
    for (int64_t j = 0; j < count; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), load16(v + j * stride + i), a);
    _mm512_storeu_ps(acc + i, a);
  }
  if (i < n) avx2_accumulate_strided(acc + i, w, v + i, stride, count, n - i);
}

}  // namespace

void dot_strided_f32(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  dot_strided(q, k, stride, count, n, out);
}
void dot_strided_f16(const float* q, const uint16_t* k, int64_t stride, int64_t count, int64_t n, float* out) {
  dot_strided(q, k, stride, count, n, out);
}
void accumulate_strided_f32(float* acc, const float* w, const float* v, int64_t stride, int64_t count, int64_t n) {
  accumulate_strided(acc, w, v, stride, count, n);
}
void accumulate_strided_f16(float* acc, const float* w, const uint16_t* v, int64_t stride, int64_t count,
                            int64_t n) {
  accumulate_strided(acc, w, v, stride, count, n);
}

float exp_shifted_sum(float* x, float max, int64_t n) {
  // A page of keys (16) or less: the AVX2 loop was faster here (measured), with the same bits.
  if (n <= 32) return vec_avx2::exp_shifted_sum(x, max, n);
  const __m512 vmax = _mm512_set1_ps(max);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax)));
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  return sum;
}

void silu_mul(float* out, const float* g, const float* u, int64_t n) { map16(out, g, u, n, silu16); }
void gelu_tanh_mul(float* out, const float* g, const float* u, int64_t n) { map16(out, g, u, n, gelu16); }

}  // namespace deepinfer::cpu::vec_avx512

DEEPINFER_ISA_END

#endif
