// The batch-invariant mode's MoE experts for decode-sized batches (the
// batches moe_decode_applies gives the gemv path by default). The grouped
// GEMMs of cuda_moe.cu are the mode's arithmetic, but at a few tokens their
// row tiles are mostly padding and they pay an index pass; these three
// chained kernels give the same bits without either:
//  1. gate/up: a warp takes (slot, 8 ffn columns) and runs the slot's x row
//     against its expert's gate and up rows (cuda_mma_rows.cuh: weights
//     straight into mma fragments, k16 steps in order from 0, as the GEMM),
//     writing act(gate) * up rounded to the dtype into h[slot] through the
//     GEMM's own epilogue.
//  2. down: a warp takes (slot, 8 hidden columns) and runs h[slot] against the
//     expert's down rows, f32 results (+ bias) into y[slot].
//  3. the combine the grouped path runs, over y in slot order.
// Consecutive warps take the same columns of different slots, so slots that
// share an expert read its rows at about the same time (all but the first
// from L2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma_gemm.cuh"
#include "backend/cuda/cuda_mma_rows.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_moe_common.cuh"

namespace deepinfer::cuda {

namespace {

using mma_gemm::GemmArgs;
using mma_gemm::GemmOut;

constexpr int kWarps = 4;  // per block
constexpr int kUpUnroll = 4, kDownUnroll = 8;
constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The workspace: h [slots, ffn] of the dtype, then y f32 [slots, hidden].
size_t h_bytes(int64_t slots, int64_t ffn) { return aligned(static_cast<size_t>(slots * ffn) * 2); }

// Writes one slot's 8 columns from lanes 0-3 (row 0 of the fragment) with the
// grouped GEMM's epilogue for that product.
template <typename T, GemmOut kOut, int kB>
__device__ __forceinline__ void store_row(const GemmArgs& g, int expert, int64_t slot, int64_t col0, int lane,
                                          const float (&acc)[kB][4]) {
  const int64_t col = col0 + (lane & 3) * 2;
  if (lane >= 4 || col >= g.n_cols) return;
  float v[2][2];
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    v[b][0] = acc[b < kB ? b : 0][0];
    v[b][1] = acc[b < kB ? b : 0][1];
  }
  mma_gemm::store_pair<T, kOut, false>(g, expert, slot, col, v);
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) moe_rows_up_kernel(MoeExpertsLaunch m, GemmArgs g) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int lane = threadIdx.x & 31;
  const int64_t slots = m.n * m.top_k;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t slot = warp % slots, col0 = warp / slots * 8;
  if (col0 >= m.ffn) return;
  const int64_t t = slot / m.top_k;
  const int e =
      moe_detail::expert_at(m.ids, t, static_cast<int>(slot % m.top_k), m.n_experts, col0 == 0 && lane == 0, m.err);
  const int64_t col = col0 + (lane >> 2);
  mma_rows::ChainOperands<2> op;
  op.w[0] = col < m.ffn ? m.gate.base + e * m.gate.expert_stride + col * m.gate.row_stride : nullptr;
  op.w[1] = col < m.ffn ? m.up.base + e * m.up.expert_stride + col * m.up.row_stride : nullptr;
  op.a_lo[0] = op.a_lo[1] = lane < 4 ? row_ptr(m.x, t) : nullptr;  // the slot is row 0 of the fragment
  op.a_hi[0] = op.a_hi[1] = nullptr;
  float acc[2][4] = {};
  mma_rows::mma_chain<T, 2, kUpUnroll, false, false>(op, m.hidden, lane, acc);
  store_row<T, GemmOut::GatedAct, 2>(g, e, slot, col0, lane, acc);
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) moe_rows_down_kernel(MoeExpertsLaunch m, GemmArgs g) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int lane = threadIdx.x & 31;
  const int64_t slots = m.n * m.top_k;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t slot = warp % slots, col0 = warp / slots * 8;
  if (col0 >= m.hidden) return;
  const int e = moe_detail::expert_at(m.ids, slot / m.top_k, static_cast<int>(slot % m.top_k), m.n_experts, false,
                                      m.err);
  const int64_t col = col0 + (lane >> 2);
  mma_rows::ChainOperands<1> op;
  op.w[0] = col < m.hidden ? m.down.base + e * m.down.expert_stride + col * m.down.row_stride : nullptr;
  op.a_lo[0] = lane < 4 ? g.a_base + slot * g.a_stride : nullptr;
  op.a_hi[0] = nullptr;
  float acc[1][4] = {};
  mma_rows::mma_chain<T, 1, kDownUnroll, false, false>(op, m.ffn, lane, acc);
  store_row<T, GemmOut::F32, 1>(g, e, slot, col0, lane, acc);
}

template <typename T>
void launch_rows(const MoeExpertsLaunch& m, cudaStream_t s) {
  const int64_t slots = m.n * m.top_k;
  char* h = m.workspace;
  auto* y = reinterpret_cast<float*>(m.workspace + h_bytes(slots, m.ffn));
  // The grouped GEMMs' arguments, for their epilogues (biases, activation, output rows).
  GemmArgs up;
  up.bias0 = m.gate_bias;
  up.bias1 = m.up_bias;
  up.bias_type = m.bias_type;
  up.n_cols = m.ffn;
  up.k = m.hidden;
  up.out = h;
  up.out_stride = m.ffn * 2;
  up.glu = m.glu;
  GemmArgs down;
  down.a_base = h;
  down.a_stride = m.ffn * 2;
  down.bias0 = m.down_bias;
  down.bias_type = m.bias_type;
  down.n_cols = m.hidden;
  down.k = m.ffn;
  down.out = reinterpret_cast<char*>(y);
  down.out_stride = m.hidden * 4;
  auto blocks = [&](int64_t cols) { return static_cast<unsigned>((slots * ((cols + 7) / 8) + kWarps - 1) / kWarps); };
  launch_chained(moe_rows_up_kernel<T>, blocks(m.ffn), 32 * kWarps, 0, s, m, up);
  launch_chained(moe_rows_down_kernel<T>, blocks(m.hidden), 32 * kWarps, 0, s, m, down);
  launch_moe_combine(m, nullptr, y, s);
}

}  // namespace

size_t moe_rows_workspace_bytes(int64_t n, int top_k, int64_t hidden, int64_t ffn) {
  const int64_t slots = n * top_k;
  return h_bytes(slots, ffn) + static_cast<size_t>(slots * hidden) * 4;
}

void launch_moe_experts_rows(const MoeExpertsLaunch& m, Stream stream) {
  // moe_decode_applies holds (the caller's check): 16-bit x and weights of one
  // dtype, 16-byte aligned rows, hidden and ffn multiples of 8.
  if (m.w_type == ElemType::BF16) {
    launch_rows<__nv_bfloat16>(m, static_cast<cudaStream_t>(stream));
  } else {
    launch_rows<__half>(m, static_cast<cudaStream_t>(stream));
  }
}

}  // namespace deepinfer::cuda
