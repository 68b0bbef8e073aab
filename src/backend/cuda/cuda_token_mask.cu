// Grammar token masks on the device (Backend::apply_token_bitmask). A block
// covers one mask row and one chunk of the vocabulary; thread k of the block
// handles tokens chunk + k, chunk + k + kThreads, ... so that each warp reads
// one mask word (a broadcast) and writes 32 consecutive logits. Allowed
// tokens are never touched and masked ones are only written, never read, so
// the traffic is the mask plus the -inf stores. Nothing is allocated and
// nothing syncs with the host: the kernel can be captured into a graph.
//
// Measured on an H200 (m = 256 rows of a 256k vocabulary): ~95 us when every
// token is masked (~2.8 TB/s of stores), ~210 us with a random 12% allowed
// (nearly every 32-byte sector then gets a partial write). 8 tokens per
// thread instead of 32 was twice as slow: each store waits on its mask load,
// so the loads are issued together up front and more of them per thread
// hide more latency. float4 stores on 16-byte aligned rows gained nothing.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_token_mask.h"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTokensPerThread = 32;
// 8,192 tokens (256 mask words) per block: a 256k vocabulary is 32 blocks per
// mask row.
constexpr int64_t kChunkTokens = int64_t{kThreads} * kTokensPerThread;
constexpr int64_t kMaxGridY = 65535;

__global__ void __launch_bounds__(kThreads)
    apply_token_bitmask_kernel(RowView logits, const uint32_t* __restrict__ bitmask, int64_t words,
                               const int32_t* __restrict__ rows, int64_t m, uint32_t* err) {
  // The mask and the row indices are usually uploaded by a copy just before,
  // and the logits come out of the previous kernel.
  wait_for_prior_kernel();
  release_next_kernel();
  const int64_t vocab = logits.cols;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kChunkTokens;
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
    const uint32_t* mask = bitmask + i * words;
    uint32_t bits[kTokensPerThread];
#pragma unroll
    for (int k = 0; k < kTokensPerThread; ++k) {
      const int64_t w = (chunk + k * kThreads + threadIdx.x) >> 5;
      // A token past the mask's words is not allowed (padded vocabulary).
      bits[k] = w < words ? mask[w] : 0u;
    }
    const int32_t row = rows[i];
    if (row < 0 || row >= logits.rows) {
      // Skip rather than write out of bounds; synchronize() reports it.
      if (blockIdx.x == 0 && threadIdx.x == 0) atomicOr(err, kErrTokenMaskRow);
      continue;
    }
    float* x = row_as<float>(logits, row);
    // chunk and k * kThreads are multiples of 32: token t's bit is the lane's.
    const unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < kTokensPerThread; ++k) {
      const int64_t t = chunk + k * kThreads + threadIdx.x;
      if (t < vocab && ((bits[k] >> lane) & 1u) == 0) x[t] = -INFINITY;
    }
  }
}

}  // namespace

void launch_apply_token_bitmask(RowView logits, const uint32_t* bitmask, int64_t words, const int32_t* rows,
                                int64_t m, uint32_t* err, Stream stream) {
  if (m == 0 || logits.cols == 0) return;
  // More mask rows than a grid's y extent take turns (the kernel loops over i).
  const dim3 grid(static_cast<unsigned>((logits.cols + kChunkTokens - 1) / kChunkTokens),
                  static_cast<unsigned>(m < kMaxGridY ? m : kMaxGridY));
  launch_chained(apply_token_bitmask_kernel, grid, kThreads, 0, static_cast<cudaStream_t>(stream), logits, bitmask,
                 words, rows, m, err);
}

}  // namespace deepinfer::cuda
