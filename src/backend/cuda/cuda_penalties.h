// Launcher of the penalty kernel (cuda_penalties.cu) behind
// Backend::apply_penalties; plain types only, like cuda_kernels.h, so the host
// code compiled by the C++ compiler can include it.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// Device error bit: a row's entry range, an entry's token id or order, or a
// pending index or token was out of range in apply_penalties. Clear of
// ErrorBits and the bits of the sampling, MoE and expert-count kernels.
constexpr uint32_t kErrPenaltyData = 1u << 19;

// logits: rows of f32; params: logits.rows PenaltyRowParams; entries:
// n_entries PenaltyEntry; pending: n_pending i32 (may be null when 0).
void launch_apply_penalties(RowView logits, const void* params, const void* entries, int64_t n_entries,
                            const int32_t* pending, int64_t n_pending, uint32_t* err, Stream stream);

}  // namespace deepinfer::cuda
