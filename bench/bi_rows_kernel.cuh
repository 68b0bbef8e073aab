// An experiment kept for bench_bi_linear: products of a few activation rows
// (at most 16) on tensor cores with the weights loaded from global memory
// straight into mma fragments, never staged in shared memory, with the bits
// of the batch-invariant GEMM (cuda_mma_gemm.cuh).
//
// The idea: the mode's bits are those of the mma.sync chain, each output
// adding its k16 steps in order from k = 0 into one f32 accumulator; at one
// row the GEMM stages every weight byte through shared memory and streams
// ~15% slower than the default path's gemv. Here a warp owns 8 weight rows
// (8 output columns) over all of k: each lane loads 16 contiguous bytes of one
// weight row, a quad of lanes covers 32 elements (two k16 steps), and a
// transpose of 32-bit words inside the quad (four shuffles) leaves every lane
// the words the m16n8k16 fragment layout gives it.
//
// What it measured (H100, runs 75-76, docs/benchmarks.md): the same bits as
// the GEMM on every shape, but slower (Llama-3-8B o projection at one row:
// 21 us against 16.4), because a warp may not split k (that would change the
// bits), so only n / 8 warps stream and each holds too few bytes in flight
// in registers; the GEMM's shared-memory ring holds ~57 KiB an SM. So the
// mode does not use it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_mma_gemm.cuh"

namespace deepinfer::bench::mma_rows {

using namespace deepinfer::cuda;

// Elements of a row one quad of lanes loads at a time: two k16 steps.
constexpr int kChunk = 32;

// w[i] holds word i (elements 2i, 2i + 1) of the 16 bytes lane t of a quad
// loaded; afterwards w[s] holds word t of lane s's 16 bytes. Two butterflies
// (lane bit 0, then bit 1), each swapping the two words the partner needs.
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int lane) {
  const bool odd = lane & 1, high = lane & 2;
#pragma unroll
  for (int b = 0; b < 4; b += 2) {
    const uint32_t recv = __shfl_xor_sync(0xffffffffu, odd ? w[b] : w[b + 1], 1);
    if (odd) {
      w[b] = recv;
    } else {
      w[b + 1] = recv;
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint32_t recv = __shfl_xor_sync(0xffffffffu, high ? w[j] : w[j + 2], 2);
    if (high) {
      w[j] = recv;
    } else {
      w[j + 2] = recv;
    }
  }
}

__device__ __forceinline__ void words_of(const uint4& v, uint32_t (&w)[4]) {
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

// What one lane reads for a chain of products: the activation rows of its
// fragment (row lane / 4 of the warp's 16, and that row + 8) and its weight
// row (output column lane / 4 of the warp's 8). nullptr reads as zeros: a
// row or column past the end.
template <int kB>
struct ChainOperands {
  const char* a_lo[kB];
  const char* a_hi[kB];
  const char* w[kB];
};

// acc[b] (an m16n8 f32 fragment) += A_b W_b^T over k elements, k a multiple
// of 8: for each chain b, the k16 steps in order from 0 (zeros past k, which
// add nothing), exactly as mma_gemm_kernel orders them. kU chunks of 32
// elements are loaded ahead of the ones in use, for every chain. kHi: some
// lane has a row in 8..15 (warp-uniform; otherwise those rows are zeros and
// are not loaded). kWait: weights are read-only, so the first chunks of them
// load before waiting for the kernel that writes the activations (launch_chained).
//
// The activation rows are few and served by L1/L2, so each lane loads its
// fragment words of them directly (four 4-byte loads a row and chunk, no
// shuffles). A stage's weight transposes all come before its mma chain: the
// chain (two dependent mma a chunk) is what bounds a warp, and shuffles
// interleaved with it would add their latency to every link.
template <typename T, int kB, int kU, bool kHi, bool kWait>
__device__ __forceinline__ void mma_chain(const ChainOperands<kB>& op, int64_t k, int lane, float (&acc)[kB][4]) {
  struct Stage {
    uint4 w[kB][kU];
    uint32_t lo[kB][kU][4], hi[kB][kU][4];
  };
  const int seg = (lane & 3) * 8;    // this lane's 8 weight elements of each 32-element chunk
  const int word = (lane & 3) * 2;   // its fragment word's element in each 8-element segment
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load_w = [&](Stage& s, int64_t k0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t at = k0 + u * kChunk + seg;
#pragma unroll
      for (int b = 0; b < kB; ++b) s.w[b][u] = op.w[b] != nullptr && at < k ? load_stream(op.w[b] + at * 2) : zero;
    }
  };
  // Word j of a row's chunk: elements 8j + 2t, + 1 (segment j's word t).
  auto load_row = [&](const char* row, int64_t k0, uint32_t (&dst)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t at = k0 + 8 * j;
      dst[j] = row != nullptr && at < k ? __ldg(reinterpret_cast<const uint32_t*>(row + (at + word) * 2)) : 0u;
    }
  };
  auto load_a = [&](Stage& s, int64_t k0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        load_row(op.a_lo[b], k0 + u * kChunk, s.lo[b][u]);
        if constexpr (kHi) load_row(op.a_hi[b], k0 + u * kChunk, s.hi[b][u]);
      }
    }
  };
  auto compute = [&](const Stage& s) {
    uint32_t w[kB][kU][4];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        words_of(s.w[b][u], w[b][u]);
        quad_transpose(w[b][u], lane);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        // A: rows lane / 4 and + 8 at k 2t and 2t + 8 of each step; B: the
        // weight row's same k (t = lane % 4). Word j is segment j's.
        const uint32_t* lo = s.lo[b][u];
        const uint32_t hi[4] = {kHi ? s.hi[b][u][0] : 0u, kHi ? s.hi[b][u][1] : 0u, kHi ? s.hi[b][u][2] : 0u,
                                kHi ? s.hi[b][u][3] : 0u};
        const uint32_t a0[4] = {lo[0], hi[0], lo[1], hi[1]};
        const uint32_t a1[4] = {lo[2], hi[2], lo[3], hi[3]};
        mma16816<T>(acc[b], a0, w[b][u][0], w[b][u][1]);
        mma16816<T>(acc[b], a1, w[b][u][2], w[b][u][3]);
      }
    }
  };
  constexpr int64_t kStep = int64_t{kU} * kChunk;
  Stage cur, next;
  load_w(cur, 0);
  if constexpr (kWait) {
    wait_for_prior_kernel();
    release_next_kernel();
  }
  load_a(cur, 0);
  for (int64_t k0 = 0; k0 < k; k0 += kStep) {
    if (k0 + kStep < k) {
      load_w(next, k0 + kStep);
      load_a(next, k0 + kStep);
    }
    compute(cur);
    cur = next;
  }
}

using mma_gemm::GemmArgs;
using mma_gemm::GemmOut;

// The dense product out[n, m] = a[n, k] w[m, k]^T of at most 16 rows (a
// tile of 16 per grid row otherwise), with the GEMM's epilogues: a block of
// kWarps warps takes 8 x kWarps output columns; kU: 32-element chunks in
// flight per lane and product beyond the ones in use. Launched chained: the
// first weights load while the kernel before still writes the activations.
template <typename T, GemmOut kOut, int kWarps, int kU, bool kHi>
__global__ void __launch_bounds__(32 * kWarps) dense_kernel(GemmArgs g) {
  constexpr int kB = kOut == GemmOut::GatedAct ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int64_t col0 = (int64_t{blockIdx.y} * kWarps + (threadIdx.x >> 5)) * 8;
  const int64_t row0 = int64_t{blockIdx.x} * 16 + (lane >> 2);
  const int64_t col = col0 + (lane >> 2);
  ChainOperands<kB> op;
#pragma unroll
  for (int b = 0; b < kB; ++b) {
    const MoeWeightView& w = b == 0 ? g.w0 : g.w1;
    op.w[b] = col < g.n_cols ? w.base + col * w.row_stride : nullptr;
    op.a_lo[b] = row0 < g.n_rows ? g.a_base + row0 * g.a_stride : nullptr;
    op.a_hi[b] = row0 + 8 < g.n_rows ? g.a_base + (row0 + 8) * g.a_stride : nullptr;
  }
  float acc[kB][4] = {};
  mma_chain<T, kB, kU, kHi, true>(op, g.k, lane, acc);
  // c0, c1: row lane / 4, columns 2 (lane % 4) + {0, 1}; c2, c3 eight rows below.
  const int64_t out_col = col0 + (lane & 3) * 2;
  if (out_col >= g.n_cols) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + half * 8;
    if (row >= g.n_rows) continue;
    float v[2][2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      v[b][0] = acc[b < kB ? b : 0][2 * half];
      v[b][1] = acc[b < kB ? b : 0][2 * half + 1];
    }
    mma_gemm::store_pair<T, kOut, true>(g, 0, row, out_col, v);
  }
}

template <typename T, GemmOut kOut, int kWarps, int kU>
void launch_dense(const GemmArgs& g, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((g.n_rows + 15) / 16),
                  static_cast<unsigned>((g.n_cols + 8 * kWarps - 1) / (8 * kWarps)));
  if (g.n_rows > 8) {
    launch_chained(dense_kernel<T, kOut, kWarps, kU, true>, grid, 32 * kWarps, 0, s, g);
  } else {
    launch_chained(dense_kernel<T, kOut, kWarps, kU, false>, grid, 32 * kWarps, 0, s, g);
  }
}

}  // namespace deepinfer::bench::mma_rows
