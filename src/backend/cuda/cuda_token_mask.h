// Launcher of the token-bitmask kernel (cuda_token_mask.cu) behind
// Backend::apply_token_bitmask; plain types only, like cuda_kernels.h, so the
// host code compiled by the C++ compiler can include it.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

// Device error bit: apply_token_bitmask was given a logits row outside
// [0, rows) (that mask row is skipped). Clear of ErrorBits and the bits of the
// sampling, MoE, expert-count and penalty kernels.
constexpr uint32_t kErrTokenMaskRow = 1u << 20;

// logits: rows of f32 (vocab = logits.cols); bitmask: m contiguous rows of
// `words` 32-bit words; rows: m i32 logits row indices (on the device).
void launch_apply_token_bitmask(RowView logits, const uint32_t* bitmask, int64_t words, const int32_t* rows,
                                int64_t m, uint32_t* err, Stream stream);

}  // namespace deepinfer::cuda
