// AVX-512 + VNNI kernels: placeholder that forwards to the AVX2 kernels until
// the AVX-512 ones land.
#include "backend/cpu/quants_internal.h"

#if defined(DEEPINFER_QUANTS_AVX512)

namespace deepinfer::cpu::quants::avx512 {

float dot_f32(const void* w, const void* x, int64_t n) { return avx2::dot_f32(w, x, n); }
float dot_f16(const void* w, const void* x, int64_t n) { return avx2::dot_f16(w, x, n); }
float dot_bf16(const void* w, const void* x, int64_t n) { return avx2::dot_bf16(w, x, n); }
float dot_q4_0(const void* w, const void* x, int64_t n) { return avx2::dot_q4_0(w, x, n); }
float dot_q4_1(const void* w, const void* x, int64_t n) { return avx2::dot_q4_1(w, x, n); }
float dot_q5_0(const void* w, const void* x, int64_t n) { return avx2::dot_q5_0(w, x, n); }
float dot_q5_1(const void* w, const void* x, int64_t n) { return avx2::dot_q5_1(w, x, n); }
float dot_q8_0(const void* w, const void* x, int64_t n) { return avx2::dot_q8_0(w, x, n); }
float dot_q2_k(const void* w, const void* x, int64_t n) { return avx2::dot_q2_k(w, x, n); }
float dot_q3_k(const void* w, const void* x, int64_t n) { return avx2::dot_q3_k(w, x, n); }
float dot_q4_k(const void* w, const void* x, int64_t n) { return avx2::dot_q4_k(w, x, n); }
float dot_q5_k(const void* w, const void* x, int64_t n) { return avx2::dot_q5_k(w, x, n); }
float dot_q6_k(const void* w, const void* x, int64_t n) { return avx2::dot_q6_k(w, x, n); }
void quantize_q8_1(const float* src, void* dst, int64_t n) { avx2::quantize_q8_1(src, dst, n); }
void quantize_q8_k(const float* src, void* dst, int64_t n) { avx2::quantize_q8_k(src, dst, n); }

}  // namespace deepinfer::cpu::quants::avx512

#endif
