// Launcher of the sampling kernel (cuda_sampling.cu); plain types only, like
// cuda_kernels.h, so the host code compiled by the C++ compiler can include it.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// Device error bit: a non-greedy row has a +inf logit. A high bit, clear of
// ErrorBits, which other kernels extend.
constexpr uint32_t kErrSampleLogits = 1u << 16;

// One token per row of f32 logits (Backend::sample): params points to
// logits.rows SamplingRowParams on the device, tokens to logits.rows i32.
void launch_sample(RowView logits, const void* params, int32_t* tokens, uint32_t* err, Stream stream);

}  // namespace deepinfer::cuda
