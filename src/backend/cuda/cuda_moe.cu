// Mixture-of-experts kernels: the experts as grouped GEMMs (routing:
// cuda_moe_route.cu).
// A few slots (decode) take cuda_moe_decode.cu's gemv kernels instead (see
// moe_decode_applies); everything else runs here.
//
// moe_experts runs four kernels, none of which syncs with the host, so a
// decode step stays capturable in a CUDA graph:
//  1. index (one block): counts the (token, choice) slots per expert, lays the
//     experts out one after another with each expert's rows padded to the row
//     tile BM, and writes a table of which expert owns each row tile, the token
//     of each sorted row (-1 for padding) and the sorted row of each slot.
//  2. gate/up GEMM: a block takes (row tile, column tile), reads its expert
//     from the table (blocks past the real tile count exit; the grid is sized
//     from the bound n*top_k/BM + n_experts) and writes act(gate) * up.
//  3. down GEMM: the same kernel with one weight stack, f32 results.
//  4. combine: each token sums its experts' rows in slot order, so results do
//     not depend on how slots were placed inside an expert's rows.
// The batch-invariant mode's decode batches (at most kMoeDecodeMaxSlots
// slots, tensor cores) skip the index: one 16-row tile per slot, whose
// expert the GEMMs read from the ids (GemmArgs::slot_tiles).
// Weights of experts nobody chose are never read; in decode each chosen
// expert's matrices stream once through a deep cp.async pipeline. bf16/f16
// activations with weights of the same dtype use tensor cores (mma.sync
// m16n8k16, f32 accumulation, act(gate) * up rounded to the dtype between the
// two products); other combinations (the f32 op tests) a SIMT kernel in f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_mma_gemm.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_moe_common.cuh"

namespace deepinfer::cuda {

namespace {

constexpr size_t kAlign = 256;

using moe_detail::bias_at;
using moe_detail::glu;
using mma_gemm::DecodeTiles;
using mma_gemm::GemmArgs;
using mma_gemm::GemmOut;
using mma_gemm::MidTiles;
using mma_gemm::PrefillTiles;

// The grouped GEMMs: gate/up (gathered rows, act(gate) * up) and down (f32).
template <typename T, class C>
void launch_expert_gemms(const GemmArgs& up, const GemmArgs& down, int64_t max_tiles, cudaStream_t s) {
  mma_gemm::launch_mma_gemm<T, C, GemmOut::GatedAct, true, false>(up, max_tiles, s);
  mma_gemm::launch_mma_gemm<T, C, GemmOut::F32, false, false>(down, max_tiles, s);
}

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Row tile: small for decode-like batches (few rows per expert), larger for
// prefill. Each row tile of an expert streams that expert's weights once, so
// at 13-24 rows per expert on average (batch-256 decode of Qwen3-30B-A3B and
// DeepSeek-V2-Lite) 32-row tiles read most experts once where 16-row tiles
// read them twice (H200 run 39: the 16-row gate/up kernel at ~45% of copy
// bandwidth at DeepSeek-V2-Lite's batch 256).
int moe_row_tile(int64_t rows, int n_experts) {
  if (rows <= int64_t{12} * n_experts) return 16;
  return rows <= int64_t{24} * n_experts ? 32 : 64;
}

struct MoeLayout {
  int bm = 16;
  int64_t rows = 0;       // n * top_k slots
  int64_t max_tiles = 0;  // bound on the padded row tiles
  size_t tile_expert = 0, row_token = 0, slot_row = 0, act = 0, y = 0, total = 0;

  MoeLayout(int64_t n, int top_k, int n_experts, int64_t hidden, int64_t ffn) {
    rows = n * top_k;
    bm = moe_row_tile(rows, n_experts);
    // Only experts that own a row are padded, at most min(E, rows) of them.
    max_tiles = (rows + bm - 1) / bm + std::min<int64_t>(n_experts, rows);
    // Slot tiles (decode batches in the batch-invariant mode) take 16 rows a slot.
    const size_t padded = std::max(static_cast<size_t>(max_tiles) * bm,
                                   static_cast<size_t>(std::min(rows, kMoeDecodeMaxSlots)) * DecodeTiles::kBM);
    size_t at = 0;
    auto take = [&](size_t bytes) {
      size_t start = at;
      at += aligned(bytes);
      return start;
    };
    tile_expert = take(static_cast<size_t>(max_tiles) * 4);
    row_token = take(padded * 4);
    slot_row = take(static_cast<size_t>(rows) * 4);
    act = take(padded * static_cast<size_t>(ffn) * 4);  // f32 on the SIMT path, half of it used otherwise
    y = take(padded * static_cast<size_t>(hidden) * 4);
    total = at;
  }
};

// ---------------------------------------------------------------- index

__global__ void moe_index_kernel(RowView ids, int64_t n, int top_k, int n_experts, int bm, int64_t max_tiles,
                                 int32_t* tile_expert, int32_t* row_token, int32_t* slot_row, uint32_t* err) {
  extern __shared__ int32_t counts[];  // [E] counts, then [E] cursors, then the padded total
  int32_t* cursor = counts + n_experts;
  int32_t* total = cursor + n_experts;
  const int64_t rows = n * top_k;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  auto expert_of = [&](int64_t s, bool report) {
    return moe_detail::expert_at(ids, s / top_k, static_cast<int>(s % top_k), n_experts, report, err);
  };
  for (int64_t s = threadIdx.x; s < rows; s += blockDim.x) atomicAdd(&counts[expert_of(s, true)], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0;
    for (int e = 0; e < n_experts; ++e) {
      cursor[e] = at;
      at += (counts[e] + bm - 1) / bm * bm;
    }
    *total = at;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    const int32_t start = cursor[e], used = start + counts[e], end = start + (counts[e] + bm - 1) / bm * bm;
    for (int32_t i = start / bm; i < end / bm; ++i) tile_expert[i] = e;
    for (int32_t r = used; r < end; ++r) row_token[r] = -1;
  }
  for (int64_t i = *total / bm + threadIdx.x; i < max_tiles; i += blockDim.x) tile_expert[i] = -1;
  __syncthreads();
  // Placement inside an expert's rows is arbitrary: every row is computed on
  // its own and the combine reads rows by slot.
  for (int64_t s = threadIdx.x; s < rows; s += blockDim.x) {
    const int32_t r = atomicAdd(&cursor[expert_of(s, false)], 1);
    row_token[r] = static_cast<int32_t>(s / top_k);
    slot_row[s] = r;
  }
}

// ---------------------------------------------------------------- SIMT path

// One warp per output column of a row tile; f32 arithmetic, f32 results.
template <typename TA, typename TW, bool kGated, bool kGather>
__global__ void moe_simt_kernel(GemmArgs g, int bm) {
  const int expert = g.tile_expert[blockIdx.x];
  if (expert < 0) return;
  const int lane = threadIdx.x & 31;
  const int64_t col = int64_t{blockIdx.y} * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (col >= g.n_cols) return;
  const TW* w0 = reinterpret_cast<const TW*>(g.w0.base + expert * g.w0.expert_stride + col * g.w0.row_stride);
  const TW* w1 = reinterpret_cast<const TW*>(g.w1.base + expert * g.w1.expert_stride + col * g.w1.row_stride);
  for (int i = 0; i < bm; ++i) {
    const int64_t row = int64_t{blockIdx.x} * bm + i;
    int64_t a_row = row;
    if constexpr (kGather) a_row = g.row_token[row];
    float s0 = 0.0f, s1 = 0.0f;
    if (a_row >= 0) {
      const TA* a = reinterpret_cast<const TA*>(g.a_base + a_row * g.a_stride);
      for (int64_t k = lane; k < g.k; k += 32) {
        const float x = to_f(a[k]);
        s0 += x * to_f(w0[k]);
        if constexpr (kGated) s1 += x * to_f(w1[k]);
      }
    }
    s0 = warp_sum(s0) + bias_at(g.bias0, g.bias_type, expert * g.n_cols + col);
    if constexpr (kGated) s1 = warp_sum(s1) + bias_at(g.bias1, g.bias_type, expert * g.n_cols + col);
    if (lane == 0) {
      reinterpret_cast<float*>(g.out + row * g.out_stride)[col] = kGated ? glu(g.glu, s0, s1) : s0;
    }
  }
}

constexpr int kSimtWarps = 8;

template <typename TA, typename TW, bool kGated, bool kGather>
void launch_simt(const GemmArgs& g, int bm, int64_t max_tiles, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>((g.n_cols + kSimtWarps - 1) / kSimtWarps));
  moe_simt_kernel<TA, TW, kGated, kGather><<<grid, 32 * kSimtWarps, 0, stream>>>(g, bm);
}

// ---------------------------------------------------------------- combine

// slot_row: the row of y holding each slot's result; null with slot tiles
// (slot s in row s * tile_rows).
template <typename T>
__global__ void moe_combine_kernel(RowView out, RowView weights, const int32_t* slot_row, int tile_rows,
                                   const float* y, int64_t hidden, int top_k, bool accumulate) {
  const int64_t t = blockIdx.x;
  T* o = row_as<T>(out, t);
  const float* w = row_as<const float>(weights, t);
  auto row = [&](int j) -> int64_t {
    return slot_row != nullptr ? slot_row[t * top_k + j] : (t * top_k + j) * tile_rows;
  };
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float acc = accumulate ? to_f(o[i]) : 0.0f;
    for (int j = 0; j < top_k; ++j) acc += w[j] * y[row(j) * hidden + i];
    o[i] = from_f<T>(acc);
  }
}

bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

}  // namespace

size_t moe_experts_workspace_bytes(int64_t n, int top_k, int n_experts, int64_t hidden, int64_t ffn) {
  return std::max(MoeLayout(n, top_k, n_experts, hidden, ffn).total, moe_decode_workspace_bytes(n, top_k, ffn));
}

void launch_moe_experts(const MoeExpertsLaunch& m, Stream stream) {
  if (m.n == 0) return;
  if (!m.batch_invariant && moe_decode_applies(m)) {
    launch_moe_experts_decode(m, stream);
    return;
  }
  auto s = static_cast<cudaStream_t>(stream);
  const MoeLayout lay(m.n, m.top_k, m.n_experts, m.hidden, m.ffn);
  auto* tile_expert = reinterpret_cast<int32_t*>(m.workspace + lay.tile_expert);
  auto* row_token = reinterpret_cast<int32_t*>(m.workspace + lay.row_token);
  auto* slot_row = reinterpret_cast<int32_t*>(m.workspace + lay.slot_row);
  char* act = m.workspace + lay.act;
  auto* y = reinterpret_cast<float*>(m.workspace + lay.y);

  const int64_t x_stride = m.x.nouter == 0 ? 0 : m.x.stride[0];
  const bool mma = m.x_type == m.w_type && m.w_type != ElemType::F32 && m.hidden % 8 == 0 && m.ffn % 8 == 0 &&
                   aligned16(m.x.base, x_stride) && aligned16(m.workspace, 0) &&
                   aligned16(m.gate.base, m.gate.expert_stride) && m.gate.row_stride % 16 == 0 &&
                   aligned16(m.up.base, m.up.expert_stride) && m.up.row_stride % 16 == 0 &&
                   aligned16(m.down.base, m.down.expert_stride) && m.down.row_stride % 16 == 0;
  // The batch-invariant mode's decode batches: one row tile per slot, no
  // index pass (its kernel and launch gap were a third of the mode's extra
  // time per MoE layer at batch 1, docs/benchmarks.md runs 75-79). The
  // default runs these batches on the gemv path.
  const bool slot_tiles = m.batch_invariant && mma && lay.rows <= kMoeDecodeMaxSlots;
  if (!slot_tiles) {
    moe_index_kernel<<<1, 1024, (2 * m.n_experts + 1) * sizeof(int32_t), s>>>(
        m.ids, m.n, m.top_k, m.n_experts, lay.bm, lay.max_tiles, tile_expert, row_token, slot_row, m.err);
  }
  GemmArgs up;
  up.tile_expert = tile_expert;
  up.row_token = row_token;
  up.a_base = m.x.base;
  up.a_stride = x_stride;
  up.w0 = m.gate;
  up.w1 = m.up;
  up.n_cols = m.ffn;
  up.k = m.hidden;
  up.out = act;
  up.glu = m.glu;
  up.bias0 = m.gate_bias;
  up.bias1 = m.up_bias;
  up.bias_type = m.bias_type;
  GemmArgs down;
  down.tile_expert = tile_expert;
  down.a_base = act;
  down.w0 = m.down;
  down.w1 = m.down;
  down.bias0 = m.down_bias;
  down.bias_type = m.bias_type;
  down.n_cols = m.hidden;
  down.k = m.ffn;
  down.out = reinterpret_cast<char*>(y);
  down.out_stride = m.hidden * 4;
  if (slot_tiles) {
    for (GemmArgs* g : {&up, &down}) {
      g->slot_tiles = true;
      g->slot_ids = m.ids;
      g->top_k = m.top_k;
      g->n_experts = m.n_experts;
      g->err = m.err;
    }
  }
  if (mma) {
    up.out_stride = down.a_stride = m.ffn * 2;
    DI_DISPATCH_ELEM(m.w_type, T, {
      if constexpr (!std::is_same_v<T, float>) {
        if (slot_tiles) {
          launch_expert_gemms<T, DecodeTiles>(up, down, lay.rows, s);
        } else if (lay.bm == DecodeTiles::kBM) {
          launch_expert_gemms<T, DecodeTiles>(up, down, lay.max_tiles, s);
        } else if (lay.bm == MidTiles::kBM) {
          launch_expert_gemms<T, MidTiles>(up, down, lay.max_tiles, s);
        } else {
          launch_expert_gemms<T, PrefillTiles>(up, down, lay.max_tiles, s);
        }
      }
    });
  } else {
    up.out_stride = down.a_stride = m.ffn * 4;
    DI_DISPATCH_ELEM(m.x_type, TA, DI_DISPATCH_ELEM(m.w_type, TW, {
      launch_simt<TA, TW, true, true>(up, lay.bm, lay.max_tiles, s);
      launch_simt<float, TW, false, false>(down, lay.bm, lay.max_tiles, s);
    }));
  }
  DI_DISPATCH_ELEM(m.x_type, T,
                   (moe_combine_kernel<T><<<static_cast<unsigned>(m.n), 256, 0, s>>>(
                       m.out, m.weights, slot_tiles ? nullptr : slot_row, DecodeTiles::kBM, y, m.hidden, m.top_k,
                       m.accumulate)));
}

}  // namespace deepinfer::cuda
