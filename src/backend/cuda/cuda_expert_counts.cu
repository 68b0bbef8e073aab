// Per-expert routing counts for the EPLB load statistics. Each block builds a
// histogram of its share of the (token, choice) pairs in shared memory and
// adds its non-zero bins to the global counts, so a hot expert costs one
// global atomic per block rather than one per token. Integer atomics commute:
// the result does not depend on the order blocks run in. No allocation, no
// host sync: the kernel is captured into the decode graphs as is.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_expert_counts.h"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 256;
// Experts a block histogram holds in the default 48 KiB of dynamic shared
// memory; more experts count straight into global memory.
constexpr int kSharedBins = 48 * 1024 / 4;
constexpr int64_t kMaxBlocks = 264;

__global__ void count_experts_kernel(RowView ids, const int32_t* slots, int32_t* counts, int n_experts,
                                     bool shared_bins, uint32_t* err) {
  extern __shared__ int32_t bins[];
  if (shared_bins) {
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) bins[e] = 0;
    __syncthreads();
  }
  int32_t* target = shared_bins ? bins : counts;
  const int64_t top_k = ids.cols;
  const int64_t items = ids.rows * top_k;
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < items; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / top_k;
    if (slots != nullptr && slots[t] < 0) continue;  // padding row of a graph batch
    const int32_t e = row_as<const int32_t>(ids, t)[i - t * top_k];
    if (e < 0 || e >= n_experts) {
      bad = true;
      continue;
    }
    atomicAdd(target + e, 1);
  }
  if (bad) atomicOr(err, kErrExpertCountId);
  if (!shared_bins) return;
  __syncthreads();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    if (bins[e] != 0) atomicAdd(counts + e, bins[e]);
  }
}

}  // namespace

void launch_count_experts(RowView ids, const int32_t* slots, int32_t* counts, int n_experts, uint32_t* err,
                          Stream stream) {
  const int64_t items = ids.rows * ids.cols;
  if (items == 0) return;
  const bool shared_bins = n_experts <= kSharedBins;
  const size_t smem = shared_bins ? static_cast<size_t>(n_experts) * sizeof(int32_t) : 0;
  const unsigned blocks = blocks_for(items, kThreads * 4, kMaxBlocks);
  count_experts_kernel<<<blocks, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(ids, slots, counts, n_experts,
                                                                                     shared_bins, err);
}

}  // namespace deepinfer::cuda
