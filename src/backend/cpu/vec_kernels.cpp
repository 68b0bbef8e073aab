#include "backend/cpu/vec_kernels.h"

#include "backend/cpu/vec.h"

namespace deepinfer::cpu {

namespace vec_avx2 {
void dot_strided_f32(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  vec::dot_strided(q, k, stride, count, n, out);
}
void dot_strided_f16(const float* q, const uint16_t* k, int64_t stride, int64_t count, int64_t n, float* out) {
  vec::dot_strided(q, k, stride, count, n, out);
}
void accumulate_strided_f32(float* acc, const float* w, const float* v, int64_t stride, int64_t count, int64_t n) {
  vec::accumulate_strided(acc, w, v, stride, count, n);
}
void accumulate_strided_f16(float* acc, const float* w, const uint16_t* v, int64_t stride, int64_t count,
                            int64_t n) {
  vec::accumulate_strided(acc, w, v, stride, count, n);
}
float exp_shifted_sum(float* x, float max, int64_t n) { return vec::exp_shifted_sum(x, max, n); }
void silu_mul(float* out, const float* g, const float* u, int64_t n) { vec::silu_mul(out, g, u, n); }
void gelu_tanh_mul(float* out, const float* g, const float* u, int64_t n) { vec::gelu_tanh_mul(out, g, u, n); }
}  // namespace vec_avx2

const VecKernels& vec_kernels(CpuIsa isa) {
  static const VecKernels avx2{vec_avx2::dot_strided_f32,        vec_avx2::dot_strided_f16,
                               vec_avx2::accumulate_strided_f32, vec_avx2::accumulate_strided_f16,
                               vec_avx2::exp_shifted_sum,        vec_avx2::silu_mul,
                               vec_avx2::gelu_tanh_mul};
#if defined(__AVX2__) && defined(__x86_64__) && defined(__GNUC__)
  static const VecKernels avx512{vec_avx512::dot_strided_f32,        vec_avx512::dot_strided_f16,
                                 vec_avx512::accumulate_strided_f32, vec_avx512::accumulate_strided_f16,
                                 vec_avx512::exp_shifted_sum,        vec_avx512::silu_mul,
                                 vec_avx512::gelu_tanh_mul};
  if (isa >= CpuIsa::Avx512) return avx512;
#endif
  // The scalar level shares vec.h's loops: on an x86-64-v3 build they are AVX2
  // (the baseline), elsewhere portable C++.
  return avx2;
}

}  // namespace deepinfer::cpu
