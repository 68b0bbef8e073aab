// The tensor-core GEMM shared by the MoE experts (cuda_moe.cu: grouped, one
// expert per row tile, rows gathered by token) and the batch-invariant dense
// linear (cuda_linear_mma.cu: DEEPINFER_BATCH_INVARIANT=1).
//
// out[r, c] = sum_k a[r, k] * w[c, k] with mma.sync m16n8k16 and f32
// accumulators. Every output element accumulates its k16 steps in order from
// k = 0, whatever the tile shape (BM, BN, BK only change what is staged
// together), and the mma of one row does not depend on the other rows of its
// tile: so a row's result is the same bits whatever the number of rows, the
// tile config chosen for them, or the row's place in the batch. That is what
// makes the dense linear batch-invariant (and the MoE experts' results
// independent of how many tokens chose an expert). The dense gated product
// (gate-up with its activation) is the batch-invariant mode's gated MLP.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_moe_common.cuh"

namespace deepinfer::cuda::mma_gemm {

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
// The dense linear (cuda_linear_mma.cu) picks its own tiles by row count.

// What a tile writes: act(gate) * up rounded to T (the MoE gate/up product),
// f32, or the output rounded to T.
enum class GemmOut : uint8_t { GatedAct, F32, Elem };

struct GemmArgs {
  const int32_t* tile_expert = nullptr;  // grouped: the expert of each row tile (-1: past the last)
  const int32_t* row_token = nullptr;    // gathered A: row r reads a_base + row_token[r] * a_stride
  int64_t n_rows = 0;                    // dense: rows of A and out (grouped: unused)
  const char* a_base = nullptr;
  int64_t a_stride = 0;
  MoeWeightView w0, w1;  // w1: the up stack when gated
  const char* bias0 = nullptr;  // optional [E, n_cols] biases of w0 and w1
  const char* bias1 = nullptr;
  ElemType bias_type = ElemType::F32;
  int64_t n_cols = 0, k = 0;
  char* out = nullptr;
  int64_t out_stride = 0;
  MoeGlu glu = MoeGlu::Silu;
  // Grouped, one row tile per (token, choice) slot instead of the index
  // kernel's tables: tile s computes slot s in its row 0 (the other rows are
  // padding), its expert read from slot_ids [n, top_k] (ids outside
  // [0, n_experts) clamped and reported in err). A row's result does not
  // depend on the other rows of its tile, so this gives the grouped bits.
  bool slot_tiles = false;
  RowView slot_ids;
  int top_k = 1, n_experts = 1;
  uint32_t* err = nullptr;
};

// A dense product's arguments: out[n, m] = a[n, k] w[m, k]^T (+ an f32 bias,
// or none), rows a_stride, w_stride and out_stride bytes apart.
inline GemmArgs dense_args(int64_t n, const char* a, int64_t a_stride, const char* w, int64_t w_stride, int64_t m,
                           int64_t k, const float* bias, char* out, int64_t out_stride) {
  GemmArgs g;
  g.n_rows = n;
  g.a_base = a;
  g.a_stride = a_stride;
  g.w0 = MoeWeightView{w, 0, w_stride};
  g.w1 = g.w0;
  g.bias0 = reinterpret_cast<const char*>(bias);
  g.bias_type = ElemType::F32;
  g.n_cols = m;
  g.k = k;
  g.out = out;
  g.out_stride = out_stride;
  return g;
}

// Writes two adjacent outputs of a row: v[b][j] is the sum of column col + j
// for w0 (b = 0) and w1 (b = 1, gated). The dense gated product rounds gate
// and up to T before the activation, as a linear followed by
// gated_activation does (Backend::gated_linear's contract).
template <typename T, GemmOut kOut, bool kDense>
__device__ __forceinline__ void store_pair(const GemmArgs& g, int expert, int64_t row, int64_t col,
                                           const float (&v)[2][2]) {
  const int64_t b_at = expert * g.n_cols + col;
  const float v0 = v[0][0] + moe_detail::bias_at(g.bias0, g.bias_type, b_at);
  const float v1 = v[0][1] + moe_detail::bias_at(g.bias0, g.bias_type, b_at + 1);
  char* o = g.out + row * g.out_stride;
  if constexpr (kOut == GemmOut::GatedAct) {
    const float u0 = v[1][0] + moe_detail::bias_at(g.bias1, g.bias_type, b_at);
    const float u1 = v[1][1] + moe_detail::bias_at(g.bias1, g.bias_type, b_at + 1);
    T pair[2];
    if constexpr (kDense) {
      const bool gelu = g.glu == MoeGlu::GeluTanh;
      const float g0 = to_f(from_f<T>(v0)), g1 = to_f(from_f<T>(v1));
      pair[0] = from_f<T>((gelu ? gelu_tanh(g0) : silu(g0)) * to_f(from_f<T>(u0)));
      pair[1] = from_f<T>((gelu ? gelu_tanh(g1) : silu(g1)) * to_f(from_f<T>(u1)));
    } else {
      pair[0] = from_f<T>(moe_detail::glu(g.glu, v0, u0));
      pair[1] = from_f<T>(moe_detail::glu(g.glu, v1, u1));
    }
    *reinterpret_cast<uint32_t*>(o + col * 2) = *reinterpret_cast<uint32_t*>(pair);
  } else if constexpr (kOut == GemmOut::Elem) {
    // n_cols is even for this output (the launcher checks), so col + 1 is in range.
    T pair[2] = {from_f<T>(v0), from_f<T>(v1)};
    *reinterpret_cast<uint32_t*>(o + col * 2) = *reinterpret_cast<uint32_t*>(pair);
  } else {
    *reinterpret_cast<float2*>(o + col * 4) = make_float2(v0, v1);
  }
}

// The cp.async copies one thread issues for every stage of a tile: its
// 16-byte chunks of the stage's rows (BM rows of a, then BN weight rows of
// w0 and, gated, of w1), resolved once per tile. DstOf maps (stage row,
// chunk) to the chunk's byte offset in a stage (the mma kernel's padded
// rows, the wgmma kernel's 128-byte swizzle). kElemBytes: 2 for 16-bit
// operands, 1 for FP8 codes (k and the chunks' k offsets count elements).
template <int kLoads, int kElemBytes = 2>
struct StageCopies {
  const char* src[kLoads];
  bool row_ok[kLoads];
  uint32_t dst[kLoads];
  int chunk_k[kLoads];

  template <int BM, int BN, int kThreads, int kChunksPerRow, bool kGather, bool kDense, class DstOf>
  __device__ __forceinline__ void resolve(const GemmArgs& g, int expert, int64_t row0, int64_t n0, int tid,
                                          DstOf dst_of) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = tid + i * kThreads, r = c / kChunksPerRow, ch = c % kChunksPerRow;
      chunk_k[i] = ch * (16 / kElemBytes);
      dst[i] = dst_of(r, ch);
      if (r < BM) {
        int64_t a_row = row0 + r;
        row_ok[i] = true;
        if constexpr (kGather) {
          const int32_t token = !g.slot_tiles           ? g.row_token[a_row]
                                : a_row % BM == 0 ? static_cast<int32_t>(a_row / BM / g.top_k)
                                                  : -1;
          row_ok[i] = token >= 0;
          a_row = token >= 0 ? token : 0;
        }
        if constexpr (kDense) {
          row_ok[i] = a_row < g.n_rows;
          if (!row_ok[i]) a_row = 0;
        }
        src[i] = g.a_base + a_row * g.a_stride + ch * 16;
      } else {
        const int b = (r - BM) / BN;
        const int64_t col = n0 + (r - BM) % BN;
        const MoeWeightView& w = b == 0 ? g.w0 : g.w1;
        row_ok[i] = col < g.n_cols;
        src[i] = w.base + expert * w.expert_stride + (row_ok[i] ? col : 0) * w.row_stride + ch * 16;
      }
    }
  }

  // The copies of the k tile starting at k0 into the stage at `stage`
  // (zeros past k and for missing rows).
  __device__ __forceinline__ void copy(const GemmArgs& g, uint32_t stage, int64_t k0) const {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const bool ok = row_ok[i] && k0 + chunk_k[i] < g.k;
      cp_async16(stage + dst[i], ok ? src[i] + k0 * kElemBytes : g.a_base, ok);
    }
  }
};

template <typename T, class C, GemmOut kOut, bool kGather, bool kDense>
__global__ void __launch_bounds__(C::kThreads) mma_gemm_kernel(GemmArgs g) {
  constexpr bool kGated = kOut == GemmOut::GatedAct;
  const int tile = blockIdx.x;
  int expert = 0;
  if constexpr (!kDense) {
    if (g.slot_tiles) {
      expert = moe_detail::expert_at(g.slot_ids, tile / g.top_k, tile % g.top_k, g.n_experts,
                                     kGather && blockIdx.y == 0 && threadIdx.x == 0, g.err);
    } else {
      expert = g.tile_expert[tile];
      if (expert < 0) return;
    }
  }
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
  StageCopies<kLoads> copies;
  copies.template resolve<C::kBM, C::kBN, C::kThreads, kChunksPerRow, kGather, kDense>(
      g, expert, row0, n0, tid, [](int r, int ch) { return static_cast<uint32_t>((r * C::kPitch + ch * 8) * 2); });
  const int k_tiles = static_cast<int>((g.k + C::kBK - 1) / C::kBK);
  auto load = [&](int kt) { copies.copy(g, s_base + (kt % C::kStages) * kStageBytes, int64_t{kt} * C::kBK); };

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
        if (kDense && row >= g.n_rows) continue;
        float v[2][2];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          v[b][0] = acc[b < kB ? b : 0][mt][nt][2 * half];
          v[b][1] = acc[b < kB ? b : 0][mt][nt][2 * half + 1];
        }
        store_pair<T, kOut, kDense>(g, expert, row, col, v);
      }
    }
  }
}

// tiles: row tiles in the grid (grouped: the bound on the padded tiles).
template <typename T, class C, GemmOut kOut, bool kGather, bool kDense>
void launch_mma_gemm(const GemmArgs& g, int64_t tiles, cudaStream_t stream) {
  constexpr size_t smem = C::template smem_bytes<kOut == GemmOut::GatedAct>();
  auto kernel = mma_gemm_kernel<T, C, kOut, kGather, kDense>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((g.n_cols + C::kBN - 1) / C::kBN));
  kernel<<<grid, C::kThreads, smem, stream>>>(g);
}

}  // namespace deepinfer::cuda::mma_gemm
