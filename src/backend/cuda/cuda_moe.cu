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
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_moe_common.cuh"

namespace deepinfer::cuda {

namespace {

constexpr size_t kAlign = 256;

using moe_detail::bias_at;
using moe_detail::glu;

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
    const size_t padded = static_cast<size_t>(max_tiles) * bm;
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

// ---------------------------------------------------------------- tensor-core GEMM

// Tile shapes. Decode: 16-row tiles, narrow column tiles (many blocks), and
// long k tiles (256 contiguous bytes of each weight row per stage, which HBM
// serves better than short scattered reads) so that enough weight bytes are in
// flight to saturate HBM.
// Prefill: 64 x 64 tiles, 2 x 2 warps of 32 x 32.
template <int BM, int BN, int BK, int WarpsM, int WarpsN, int Stages>
struct TileConfig {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kStages = Stages;
  static constexpr int kWarpsN = WarpsN, kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWM = BM / WarpsM, kWN = BN / WarpsN, kMT = kWM / 16, kNT = kWN / 8;
  static constexpr int kPitch = BK + 8;  // elements; 16 spare bytes keep ldmatrix rows on distinct banks
  static_assert(kWM % 16 == 0 && kWN % 16 == 0 && BK % 16 == 0, "warp tiles are whole m16 x n16 x k16 steps");
  template <bool kGated>
  static constexpr int stage_rows() { return BM + (kGated ? 2 : 1) * BN; }
  template <bool kGated>
  static constexpr size_t smem_bytes() { return size_t{Stages} * stage_rows<kGated>() * kPitch * 2; }
};
using DecodeTiles = TileConfig<16, 32, 128, 1, 2, 4>;
using MidTiles = TileConfig<32, 32, 128, 2, 2, 4>;
using PrefillTiles = TileConfig<64, 64, 32, 2, 2, 4>;

struct GemmArgs {
  const int32_t* tile_expert = nullptr;
  const int32_t* row_token = nullptr;  // gathered A: row r reads a_base + row_token[r] * a_stride
  const char* a_base = nullptr;
  int64_t a_stride = 0;
  MoeWeightView w0, w1;  // w1: the up stack when gated
  const char* bias0 = nullptr;  // optional [E, n_cols] biases of w0 and w1
  const char* bias1 = nullptr;
  ElemType bias_type = ElemType::F32;
  int64_t n_cols = 0, k = 0;
  char* out = nullptr;  // gated: T act rows; else f32 rows
  int64_t out_stride = 0;
  MoeGlu glu = MoeGlu::Silu;
};

template <typename T, class C, bool kGated, bool kGather>
__global__ void __launch_bounds__(C::kThreads) moe_mma_kernel(GemmArgs g) {
  const int tile = blockIdx.x;
  const int expert = g.tile_expert[tile];
  if (expert < 0) return;
  extern __shared__ __align__(16) char smem[];
  constexpr int kB = kGated ? 2 : 1;
  constexpr int kRows = C::template stage_rows<kGated>();
  constexpr int kChunksPerRow = C::kBK / 8;
  constexpr int kLoads = kRows * kChunksPerRow / C::kThreads;
  static_assert(kRows * kChunksPerRow % C::kThreads == 0, "stage loads split evenly");
  constexpr uint32_t kStageBytes = kRows * C::kPitch * 2;
  const uint32_t s_base = smem_addr(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const int64_t row0 = int64_t{tile} * C::kBM, n0 = int64_t{blockIdx.y} * C::kBN;

  // Each thread copies the same chunks of every stage: resolve their rows once.
  const char* src[kLoads];
  bool row_ok[kLoads];
  uint32_t dst[kLoads];
  int chunk_k[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int c = tid + i * C::kThreads, r = c / kChunksPerRow, ch = c % kChunksPerRow;
    chunk_k[i] = ch * 8;
    dst[i] = static_cast<uint32_t>((r * C::kPitch + ch * 8) * 2);
    if (r < C::kBM) {
      int64_t a_row = row0 + r;
      row_ok[i] = true;
      if constexpr (kGather) {
        const int32_t token = g.row_token[a_row];
        row_ok[i] = token >= 0;
        a_row = token >= 0 ? token : 0;
      }
      src[i] = g.a_base + a_row * g.a_stride + ch * 16;
    } else {
      const int b = (r - C::kBM) / C::kBN;
      const int64_t col = n0 + (r - C::kBM) % C::kBN;
      const MoeWeightView& w = b == 0 ? g.w0 : g.w1;
      row_ok[i] = col < g.n_cols;
      src[i] = w.base + expert * w.expert_stride + (row_ok[i] ? col : 0) * w.row_stride + ch * 16;
    }
  }
  const int k_tiles = static_cast<int>((g.k + C::kBK - 1) / C::kBK);
  auto load = [&](int kt) {
    const uint32_t stage = s_base + (kt % C::kStages) * kStageBytes;
    const int64_t k0 = int64_t{kt} * C::kBK;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const bool ok = row_ok[i] && k0 + chunk_k[i] < g.k;
      cp_async16(stage + dst[i], ok ? src[i] + k0 * 2 : g.a_base, ok);
    }
  };

  float acc[kB][C::kMT][C::kNT][4] = {};
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < k_tiles) load(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    if (kt + C::kStages - 1 < k_tiles) load(kt + C::kStages - 1);
    cp_async_commit();  // empty groups keep the wait count uniform
    const uint32_t stage = s_base + (kt % C::kStages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < C::kBK; kk += 16) {
      uint32_t a[C::kMT][4];
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt) {
        const int r = wm * C::kWM + mt * 16 + (lane & 15);
        ldmatrix_x4(a[mt], stage + (r * C::kPitch + kk + (lane >> 4) * 8) * 2);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
#pragma unroll
        for (int np = 0; np < C::kNT / 2; ++np) {
          const int r = C::kBM + b * C::kBN + wn * C::kWN + np * 16 + (lane & 7) + (lane >> 4) * 8;
          uint32_t w[4];
          ldmatrix_x4(w, stage + (r * C::kPitch + kk + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
          for (int mt = 0; mt < C::kMT; ++mt) {
            mma16816<T>(acc[b][mt][2 * np], a[mt], w[0], w[1]);
            mma16816<T>(acc[b][mt][2 * np + 1], a[mt], w[2], w[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Fragment layout: c0, c1 at (lane / 4, 2 * (lane % 4) + {0, 1}); c2, c3 eight rows below.
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt) {
      const int64_t col = n0 + wn * C::kWN + nt * 8 + (lane & 3) * 2;
      if (col >= g.n_cols) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = row0 + wm * C::kWM + mt * 16 + (lane >> 2) + half * 8;
        const float* c0 = &acc[0][mt][nt][2 * half];
        const int64_t b_at = expert * g.n_cols + col;
        const float v0 = c0[0] + bias_at(g.bias0, g.bias_type, b_at), v1 = c0[1] + bias_at(g.bias0, g.bias_type, b_at + 1);
        char* o = g.out + row * g.out_stride;
        if constexpr (kGated) {
          const float* c1 = &acc[kB - 1][mt][nt][2 * half];
          const float u0 = c1[0] + bias_at(g.bias1, g.bias_type, b_at), u1 = c1[1] + bias_at(g.bias1, g.bias_type, b_at + 1);
          T pair[2] = {from_f<T>(glu(g.glu, v0, u0)), from_f<T>(glu(g.glu, v1, u1))};
          *reinterpret_cast<uint32_t*>(o + col * 2) = *reinterpret_cast<uint32_t*>(pair);
        } else {
          *reinterpret_cast<float2*>(o + col * 4) = make_float2(v0, v1);
        }
      }
    }
  }
}

template <typename T, class C, bool kGated, bool kGather>
void launch_mma(const GemmArgs& g, int64_t max_tiles, cudaStream_t stream) {
  constexpr size_t smem = C::template smem_bytes<kGated>();
  auto kernel = moe_mma_kernel<T, C, kGated, kGather>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>((g.n_cols + C::kBN - 1) / C::kBN));
  kernel<<<grid, C::kThreads, smem, stream>>>(g);
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

template <typename T>
__global__ void moe_combine_kernel(RowView out, RowView weights, const int32_t* slot_row, const float* y,
                                   int64_t hidden, int top_k, bool accumulate) {
  const int64_t t = blockIdx.x;
  T* o = row_as<T>(out, t);
  const float* w = row_as<const float>(weights, t);
  const int32_t* rows = slot_row + t * top_k;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float acc = accumulate ? to_f(o[i]) : 0.0f;
    for (int j = 0; j < top_k; ++j) acc += w[j] * y[rows[j] * hidden + i];
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
  if (moe_decode_applies(m)) {
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

  moe_index_kernel<<<1, 1024, (2 * m.n_experts + 1) * sizeof(int32_t), s>>>(
      m.ids, m.n, m.top_k, m.n_experts, lay.bm, lay.max_tiles, tile_expert, row_token, slot_row, m.err);

  const int64_t x_stride = m.x.nouter == 0 ? 0 : m.x.stride[0];
  const bool mma = m.x_type == m.w_type && m.w_type != ElemType::F32 && m.hidden % 8 == 0 && m.ffn % 8 == 0 &&
                   aligned16(m.x.base, x_stride) && aligned16(m.workspace, 0) &&
                   aligned16(m.gate.base, m.gate.expert_stride) && m.gate.row_stride % 16 == 0 &&
                   aligned16(m.up.base, m.up.expert_stride) && m.up.row_stride % 16 == 0 &&
                   aligned16(m.down.base, m.down.expert_stride) && m.down.row_stride % 16 == 0;
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
  if (mma) {
    up.out_stride = down.a_stride = m.ffn * 2;
    DI_DISPATCH_ELEM(m.w_type, T, {
      if constexpr (!std::is_same_v<T, float>) {
        if (lay.bm == DecodeTiles::kBM) {
          launch_mma<T, DecodeTiles, true, true>(up, lay.max_tiles, s);
          launch_mma<T, DecodeTiles, false, false>(down, lay.max_tiles, s);
        } else if (lay.bm == MidTiles::kBM) {
          launch_mma<T, MidTiles, true, true>(up, lay.max_tiles, s);
          launch_mma<T, MidTiles, false, false>(down, lay.max_tiles, s);
        } else {
          launch_mma<T, PrefillTiles, true, true>(up, lay.max_tiles, s);
          launch_mma<T, PrefillTiles, false, false>(down, lay.max_tiles, s);
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
                       m.out, m.weights, slot_row, y, m.hidden, m.top_k, m.accumulate)));
}

}  // namespace deepinfer::cuda
