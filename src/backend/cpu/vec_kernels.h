// The attention and element-wise inner loops of the CPU backend, per
// instruction-set level (cpu_isa.h): the AVX2 ones are vec.h's (the build's
// baseline), the AVX-512 ones (vec_avx512.cpp) do the same work 16 lanes at a
// time. The element-wise kernels compute every element with the same
// operations at both levels, so they give the same bits; the strided dot
// products and sums add in a different order (wider accumulators).
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_isa.h"

namespace deepinfer::cpu {

// The constants of the vector exponential and GELU, shared by the AVX2
// (vec.h) and AVX-512 (vec_avx512.cpp) code so that both compute the same bits.
namespace vec_constants {
constexpr float kExpMax = 88.7f;      // e^x saturates above
constexpr float kExpMin = -87.3f;     // e^x is 0 below (where expf turns subnormal)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in few bits
constexpr float kLn2Lo = -2.12194440e-4f;
// e^r ~ 1 + r + r^2 (c5 + r (c4 + r (c3 + r (c2 + r (c1 + r c0))))) on |r| <= ln2 / 2.
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr float kGeluTwoSqrt2OverPi = 2.0f * 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace vec_constants

struct VecKernels {
  // out[j] = dot(q, k + j * stride) for j < count, rows of n elements (f32 or f16 keys).
  void (*dot_strided_f32)(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out);
  void (*dot_strided_f16)(const float* q, const uint16_t* k, int64_t stride, int64_t count, int64_t n, float* out);
  // acc[i] += sum_j w[j] * v[j * stride + i] (f32 or f16 values).
  void (*accumulate_strided_f32)(float* acc, const float* w, const float* v, int64_t stride, int64_t count,
                                 int64_t n);
  void (*accumulate_strided_f16)(float* acc, const float* w, const uint16_t* v, int64_t stride, int64_t count,
                                 int64_t n);
  // x[i] = e^(x[i] - max); returns the sum in index order.
  float (*exp_shifted_sum)(float* x, float max, int64_t n);
  void (*silu_mul)(float* out, const float* g, const float* u, int64_t n);
  void (*gelu_tanh_mul)(float* out, const float* g, const float* u, int64_t n);
};

// The kernels of one level; levels above AVX2 that this build lacks fall back
// to the widest it has. Callers ask for a level the CPU runs (isa_available).
const VecKernels& vec_kernels(CpuIsa isa);

// One set per level, each with the VecKernels signatures. vec_avx2: vec.h's
// loops compiled out of line for the baseline (vec_kernels.cpp); vec_avx512:
// vec_avx512.cpp, x86-64 GCC/Clang builds only.
#define DEEPINFER_VEC_KERNELS                                                                                  \
  void dot_strided_f32(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out);    \
  void dot_strided_f16(const float* q, const uint16_t* k, int64_t stride, int64_t count, int64_t n, float* out); \
  void accumulate_strided_f32(float* acc, const float* w, const float* v, int64_t stride, int64_t count,         \
                              int64_t n);                                                                        \
  void accumulate_strided_f16(float* acc, const float* w, const uint16_t* v, int64_t stride, int64_t count,      \
                              int64_t n);                                                                        \
  float exp_shifted_sum(float* x, float max, int64_t n);                                                         \
  void silu_mul(float* out, const float* g, const float* u, int64_t n);                                          \
  void gelu_tanh_mul(float* out, const float* g, const float* u, int64_t n);

namespace vec_avx2 {
DEEPINFER_VEC_KERNELS
}  // namespace vec_avx2

namespace vec_avx512 {
DEEPINFER_VEC_KERNELS
}  // namespace vec_avx512

#undef DEEPINFER_VEC_KERNELS

}  // namespace deepinfer::cpu
