// Device helpers shared by the two MoE expert paths (cuda_moe.cu's grouped
// GEMMs, cuda_moe_decode.cu's gemv kernels), so that both apply the same
// activation, biases and expert-id checks and their results agree.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe.h"

namespace deepinfer::cuda::moe_detail {

// Backend.h's kClampedSwigluAlpha/Limit (the .cu files do not see that header).
constexpr float kClampedSwigluAlpha = 1.702f;
constexpr float kClampedSwigluLimit = 7.0f;

__device__ __forceinline__ float bias_at(const char* b, ElemType type, int64_t i) {
  if (b == nullptr) return 0.0f;
  switch (type) {
    case ElemType::F16: return __half2float(reinterpret_cast<const __half*>(b)[i]);
    case ElemType::BF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(b)[i]);
    default: return reinterpret_cast<const float*>(b)[i];
  }
}

__device__ __forceinline__ float glu(MoeGlu kind, float g, float u) {
  switch (kind) {
    case MoeGlu::ClampedSwiglu: {
      // gpt-oss, in transformers' order of operations (as the CPU backend).
      const float gc = fminf(g, kClampedSwigluLimit), uc = fminf(fmaxf(u, -kClampedSwigluLimit), kClampedSwigluLimit);
      return (uc + 1.0f) * (gc * (1.0f / (1.0f + expf(-gc * kClampedSwigluAlpha))));
    }
    case MoeGlu::GeluTanh: {
      const float k = 0.7978845608028654f;
      return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
    }
    default: return g / (1.0f + expf(-g)) * u;
  }
}

// Expert id of a slot, clamped into range so that nothing is read out of
// bounds; an id outside it raises kErrMoeExpertId when `report`.
__device__ __forceinline__ int expert_at(const RowView& ids, int64_t token, int choice, int n_experts, bool report,
                                         uint32_t* err) {
  int e = row_as<const int32_t>(ids, token)[choice];
  if (e < 0 || e >= n_experts) {
    if (report) atomicOr(err, kErrMoeExpertId);
    e = e < 0 ? 0 : n_experts - 1;
  }
  return e;
}

}  // namespace deepinfer::cuda::moe_detail
