// Launcher of the expert-count kernel (cuda_expert_counts.cu) behind
// Backend::count_experts; plain types only, like cuda_kernels.h, so the host
// code compiled by the C++ compiler can include it.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// Device error bit: an expert id outside [0, n_experts) reached
// count_experts (it is not counted). Clear of ErrorBits, kErrSampleLogits and
// kErrMoeExpertId.
constexpr uint32_t kErrExpertCountId = 1u << 18;

// counts[e] += (token t, choice j) pairs with ids[t, j] == e over rows whose
// slots[t] >= 0 (slots may be null: every row). ids: i32 rows of top_k.
void launch_count_experts(RowView ids, const int32_t* slots, int32_t* counts, int n_experts, uint32_t* err,
                          Stream stream);

}  // namespace deepinfer::cuda
