// logit_bias, min_tokens mask and penalties on the device (Backend::
// apply_penalties). One block per row; its threads take the row's entries in
// turn (distinct token ids, so no two threads write one logit). Every step is
// an explicitly rounded f32 intrinsic (__fadd_rn, __fmul_rn, ...), which nvcc
// never contracts into a fused multiply-add: the logits are bit-identical to
// cpu::penalise_logit's. Nothing is allocated and nothing syncs with the host.
#include <cfloat>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_penalties.h"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 128;

// cpu::penalise_logit, step for step.
__device__ __forceinline__ float penalise_logit(float logit, const PenaltyRowParams& p, uint32_t flags, float bias,
                                                bool masked, int32_t count) {
  if (masked) logit = -INFINITY;
  if (flags & kPenaltyHasBias) logit = __fadd_rn(logit, bias);
  if (p.repetition != 1.0f && ((flags & kPenaltyInPrompt) || count > 0)) {
    logit = logit > 0.0f ? __fdiv_rn(logit, p.repetition) : __fmul_rn(logit, p.repetition);
  }
  if ((p.frequency != 0.0f || p.presence != 0.0f) && count > 0) {
    logit = __fsub_rn(logit, __fadd_rn(__fmul_rn(p.frequency, static_cast<float>(count)), p.presence));
  }
  return logit;
}

__global__ void __launch_bounds__(kThreads)
    apply_penalties_kernel(RowView logits, const PenaltyRowParams* params, const PenaltyEntry* entries,
                           int64_t n_entries, const int32_t* pending_tokens, int64_t n_pending, uint32_t* err) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int64_t row = blockIdx.x;
  const PenaltyRowParams p = params[row];
  const int64_t vocab = logits.cols;
  if (p.entries_begin < 0 || p.entries_begin > p.entries_end || p.entries_end > n_entries || p.pending < -1 ||
      p.pending >= n_pending) {
    if (threadIdx.x == 0) atomicOr(err, kErrPenaltyData);
    return;
  }
  const int32_t pending = p.pending >= 0 ? pending_tokens[p.pending] : -1;
  if (pending >= vocab) {
    if (threadIdx.x == 0) atomicOr(err, kErrPenaltyData);
    return;
  }
  float* x = row_as<float>(logits, row);
  bool bad = false, found = false;
  for (int32_t i = p.entries_begin + static_cast<int32_t>(threadIdx.x); i < p.entries_end; i += kThreads) {
    const PenaltyEntry e = entries[i];
    if (e.token < 0 || e.token >= vocab || (i > p.entries_begin && entries[i - 1].token >= e.token)) {
      bad = true;
      continue;
    }
    const bool masked = p.mask_min_tokens != 0 && (e.flags & kPenaltyMinTokensMask) != 0;
    const bool is_pending = e.token == pending;
    found |= is_pending;
    x[e.token] = penalise_logit(x[e.token], p, e.flags, e.bias, masked, e.output_count + (is_pending ? 1 : 0));
  }
  if (bad) atomicOr(err, kErrPenaltyData);
  // A pending token without an entry: a first output occurrence.
  if (!__syncthreads_or(found) && pending >= 0 && threadIdx.x == 0) {
    x[pending] = penalise_logit(x[pending], p, 0, 0.0f, false, 1);
  }
}

}  // namespace

void launch_apply_penalties(RowView logits, const void* params, const void* entries, int64_t n_entries,
                            const int32_t* pending, int64_t n_pending, uint32_t* err, Stream stream) {
  if (logits.rows == 0) return;
  launch_chained(apply_penalties_kernel, static_cast<unsigned>(logits.rows), kThreads, 0,
                 static_cast<cudaStream_t>(stream), logits, static_cast<const PenaltyRowParams*>(params),
                 static_cast<const PenaltyEntry*>(entries), n_entries, pending, n_pending, err);
}

}  // namespace deepinfer::cuda
