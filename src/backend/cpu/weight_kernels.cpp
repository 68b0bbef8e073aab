#include "backend/cpu/weight_kernels.h"

#include <cstring>

#include "backend/cpu/vec.h"
#include "core/error.h"

namespace deepinfer::cpu {

namespace {

void f32_dequantize(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
float f32_dot(const void* w, const void* x, int64_t n) {
  return vec::dot(static_cast<const float*>(w), static_cast<const float*>(x), n);
}

void f16_dequantize(const void* src, float* dst, int64_t n) {
  vec::f16_to_f32_row(static_cast<const uint16_t*>(src), dst, n);
}
float f16_dot(const void* w, const void* x, int64_t n) {
  return vec::dot_f16(static_cast<const uint16_t*>(w), static_cast<const float*>(x), n);
}

void bf16_dequantize(const void* src, float* dst, int64_t n) {
  vec::bf16_to_f32_row(static_cast<const uint16_t*>(src), dst, n);
}
float bf16_dot(const void* w, const void* x, int64_t n) {
  return vec::dot_bf16(static_cast<const uint16_t*>(w), static_cast<const float*>(x), n);
}

const QuantKernels kF32{DType::F32, DType::F32, f32_dequantize, nullptr, f32_dot};
const QuantKernels kF16{DType::F16, DType::F32, f16_dequantize, nullptr, f16_dot};
const QuantKernels kBF16{DType::BF16, DType::F32, bf16_dequantize, nullptr, bf16_dot};

}  // namespace

const QuantKernels& weight_kernels(DType weight) {
  switch (weight) {
    case DType::F32: return kF32;
    case DType::F16: return kF16;
    case DType::BF16: return kBF16;
    default: break;
  }
  DI_CHECK(is_quantized(weight), "the CPU backend has no weight kernels for {}", dtype_name(weight));
  return quant_kernels(weight);
}

}  // namespace deepinfer::cpu
