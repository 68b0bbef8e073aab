// FP8 weights in 64-element row blocks (DType::F8E4M3_B64, core/fp8_blocks.h)
// on the GPU, in split rows (CudaBackend::copy converts them): a row's k
// codes, then its k / 64 f32 scales, the same bytes per row as the host's
// blocks but with the codes 16-byte aligned wherever the row stride is.
//
// gemv_f8 (decode, up to kGemvF8MaxRows activation rows): tensor cores
// (mma.sync m16n8k16, f32 accumulators) on 16 weight rows x 8 activation rows
// per tile. The reduction over k does not care in which order k is visited,
// so each lane feeds the mma from the bytes it can load in one piece instead
// of the fragment's canonical columns: lane (g, t) of a warp holds codes
// 16t..16t+15 of one FP8 block of rows g and g + 8 (one 16-byte load each)
// and the same 16 activations of token g (two 16-byte loads); mma step s
// (of 4) takes codes 4s..4s+3 as its k slots {2t, 2t+1, 2t+8, 2t+9}, on both
// A and B. Four steps cover exactly one block, so the block's partial sums
// come out of the mma unscaled and are added times their row's scale (exact
// codes in bf16/f16, one multiply per block). The warps of a CTA split the
// blocks of k; a shared-memory sum ends the tile.
//
// Measured on the H200 (8B shape, batch 1, ms/token, bf16 weights 4.47): a
// scalar kernel on the host's block layout (one FMA per code) 6.1; this
// kernel on that layout (four 4-byte loads per 16 codes) 4.39.
//
// dequant_f8 (prefill): rows of blocks to bf16/f16 rows, for cuBLAS.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kBlockElems = 64;
constexpr int kMmaWarps = 8;       // warps of a CTA, splitting the blocks of k
constexpr int kMmaTileTokens = 8;  // the mma's n
constexpr int kMaxTiles = 4;       // token tiles per CTA (32 activation rows)

__device__ __forceinline__ float2 codes_to_float2(uint32_t two_codes) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(raw));
}

// Two e4m3 codes (the low 16 bits) as one register of two T, exactly (every
// e4m3 value is a bf16 and an f16).
template <typename T>
__device__ __forceinline__ uint32_t codes_to_pair(uint32_t two_codes) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(raw.x) | (static_cast<uint32_t>(raw.y) << 16);
  } else {
    const float2 f = __half22float2(__half2(raw));
    return pack2<__nv_bfloat16>(f.x, f.y);
  }
}

// The end of a 16-row x NT-tile CTA of both gemv kernels: the warps'
// accumulators (partial[warp][tile][c][lane], mma C layout: rows g / g + 8,
// tokens 2t / 2t + 1) summed in warp order, plus the bias, written out.
template <typename TO, int NT>
__device__ __forceinline__ void write_tile_sums(const float (*partial)[NT][4][32], int64_t row0, int tok0, int64_t m,
                                                int n, const float* bias, char* out, int64_t out_stride) {
  for (int e = threadIdx.x; e < NT * 4 * 32; e += kMmaWarps * 32) {
    const int i = e / 128, c = (e / 32) % 4, ln = e % 32;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kMmaWarps; ++v) sum += partial[v][i][c][ln];
    const int64_t row = row0 + ln / 4 + (c >= 2 ? 8 : 0);
    const int tok = tok0 + i * kMmaTileTokens + 2 * (ln % 4) + (c & 1);
    if (row < m && tok < n) {
      if (bias) sum += bias[row];
      reinterpret_cast<TO*>(out + tok * out_stride)[row] = from_f<TO>(sum);
    }
  }
}

// One FP8 block of k (64 codes) of a 16-row x NT-tile CTA: the lane's 16
// codes of rows g and g + 8 (codes[r][4]) against its 16 activations of token
// g per tile (x[i][2]), four mma steps from zero, the partial sums added
// times their rows' scales. Both gemv kernels reduce a block with this, so
// they give the same bits.
template <typename T, int NT>
__device__ __forceinline__ void accumulate_block(float (&acc)[NT][4], const uint32_t (&codes)[2][4],
                                                 const uint4 (&x)[NT][2], float scale_g, float scale_g8) {
  float part[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) part[i][c] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    // A: rows g / g+8 at k slots {2t, 2t+1} = codes 4s, 4s+1 and
    // {2t+8, 2t+9} = codes 4s+2, 4s+3 of the lane's 16.
    const uint32_t a[4] = {codes_to_pair<T>(codes[0][s]), codes_to_pair<T>(codes[1][s]),
                           codes_to_pair<T>(codes[0][s] >> 16), codes_to_pair<T>(codes[1][s] >> 16)};
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      // B: the same k of token g: activations 4s, 4s+1 and 4s+2, 4s+3.
      const uint4& lo = x[i][s / 2];
      mma16816<T>(part[i], a, s % 2 == 0 ? lo.x : lo.z, s % 2 == 0 ? lo.y : lo.w);
    }
  }
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    // C: rows g (c0, c1) and g+8 (c2, c3), tokens 2t and 2t+1.
    acc[i][0] = fmaf(scale_g, part[i][0], acc[i][0]);
    acc[i][1] = fmaf(scale_g, part[i][1], acc[i][1]);
    acc[i][2] = fmaf(scale_g8, part[i][2], acc[i][2]);
    acc[i][3] = fmaf(scale_g8, part[i][3], acc[i][3]);
  }
}

// What one warp loads for U blocks of k: the codes and scales of rows g and
// g + 8 and 16 activations of token g per token tile.
template <int NT, int U>
struct F8Fragments {
  uint32_t codes[U][2][4];
  float scale[U][2];
  uint4 x[U][NT][2];
};

// Loads the U blocks b0, b0 + 8, ... of a warp; every load unconditional:
// blocks past the end read the last block (the caller does not add them).
template <typename T, int NT, int U, bool kVec>
__device__ __forceinline__ void load_fragments(F8Fragments<NT, U>& f, int b0, int nb, int64_t k, const char* const* wrow,
                                               const T* const* xrow, int t) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int b = min(b0 + u * kMmaWarps, nb - 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      f.scale[u][r] = __ldg(reinterpret_cast<const float*>(wrow[r] + k) + b);
      const char* c = wrow[r] + b * kBlockElems + 16 * t;
      if constexpr (kVec) {
        const uint4 v = load_stream(c);
        f.codes[u][r][0] = v.x;
        f.codes[u][r][1] = v.y;
        f.codes[u][r][2] = v.z;
        f.codes[u][r][3] = v.w;
      } else {
#pragma unroll
        for (int s = 0; s < 4; ++s) f.codes[u][r][s] = __ldg(reinterpret_cast<const uint32_t*>(c) + s);
      }
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const uint4* xp = reinterpret_cast<const uint4*>(xrow[i] + b * kBlockElems + 16 * t);
      f.x[u][i][0] = __ldg(xp);
      f.x[u][i][1] = __ldg(xp + 1);
    }
  }
}

// NT token tiles (8 activation rows each) of one CTA; U blocks per warp and
// group; kVec: rows 16-byte aligned (codes in one load per lane and block).
// Software-pipelined: the next group's loads are issued before this group's
// arithmetic (left to itself the compiler placed each block's loads next to
// their use: one block in flight per warp, 1.1-2.8 TB/s on the 8B shapes).
// Rows past m and tokens past n read row m - 1 and token n - 1 instead (the
// mma keeps rows and columns apart, and their outputs are not written).
template <typename T, typename TO, int NT, int U, bool kVec>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_f8_kernel(int n, const char* x, int64_t x_stride, const char* w,
                                                                 int64_t w_stride, int64_t m, int64_t k,
                                                                 const float* bias, char* out, int64_t out_stride,
                                                                 int chunks) {
  __shared__ float partial[kMmaWarps][NT][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Consecutive CTAs share a weight tile (its token chunks), so the tile
  // comes from memory once and from L2 after.
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / chunks) * 16;
  const int tok0 = static_cast<int>(blockIdx.x % chunks) * NT * kMmaTileTokens;
  const int nb = static_cast<int>(k / kBlockElems);
  const char* wrow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) wrow[r] = w + std::min(row0 + g + 8 * r, m - 1) * w_stride;
  const T* xrow[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int tok = std::min(tok0 + i * kMmaTileTokens + g, n - 1);
    xrow[i] = reinterpret_cast<const T*>(x + tok * x_stride);
  }
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
  }
  wait_for_prior_kernel();
  release_next_kernel();
  constexpr int kGroup = kMmaWarps * U;  // blocks of k per loop iteration of the CTA
  F8Fragments<NT, U> cur;
  if (warp < nb) load_fragments<T, NT, U, kVec>(cur, warp, nb, k, wrow, xrow, t);
  for (int b0 = warp; b0 < nb; b0 += kGroup) {
    F8Fragments<NT, U> next;
    if (b0 + kGroup < nb) load_fragments<T, NT, U, kVec>(next, b0 + kGroup, nb, k, wrow, xrow, t);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b0 + u * kMmaWarps >= nb) break;  // warp-uniform
      accumulate_block<T, NT>(acc, cur.codes[u], cur.x[u], cur.scale[u][0], cur.scale[u][1]);
    }
    cur = next;
  }
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) partial[warp][i][c][lane] = acc[i][c];
  }
  __syncthreads();
  write_tile_sums<TO, NT>(partial, row0, tok0, m, n, bias, out, out_stride);
}

template <typename T, typename TO, int NT, int U>
void launch_tiles(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k, const float* bias,
                  char* out, int64_t os, cudaStream_t s) {
  const int chunks = (n + NT * kMmaTileTokens - 1) / (NT * kMmaTileTokens);
  const dim3 blocks(static_cast<unsigned>((m + 15) / 16 * chunks));
  if (reinterpret_cast<uintptr_t>(w) % 16 == 0 && ws % 16 == 0) {
    launch_chained(gemv_f8_kernel<T, TO, NT, U, true>, blocks, dim3(kMmaWarps * 32), 0, s, n, x, xs, w, ws, m, k,
                   bias, out, os, chunks);
  } else {
    launch_chained(gemv_f8_kernel<T, TO, NT, U, false>, blocks, dim3(kMmaWarps * 32), 0, s, n, x, xs, w, ws, m, k,
                   bias, out, os, chunks);
  }
}

// The register kernel with `group_codes` codes a warp loads at once (U =
// group_codes / 64 blocks; 2 for 3 or 4 token tiles); otherwise 2 blocks
// (the registers hold two groups. H200, 8B shape, batch 1: 3.36 ms a step
// with 2 blocks, 4.12 with 4: 174 registers a thread, one CTA per SM).
template <typename T, typename TO, int NT>
void launch_register(int group_codes, int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m,
                     int64_t k, const float* bias, char* out, int64_t os, cudaStream_t s) {
  const int u = group_codes == 128 || group_codes == 256 ? group_codes / kBlockElems : 2;
  if constexpr (NT <= 2) {  // two groups of 4 blocks for 3 or 4 tiles would spill
    if (u == 4) return launch_tiles<T, TO, NT, 4>(n, x, xs, w, ws, m, k, bias, out, os, s);
  }
  launch_tiles<T, TO, NT, 2>(n, x, xs, w, ws, m, k, bias, out, os, s);
}

// The weights streamed through shared memory: each CTA owns 16 weight rows
// (and NT token tiles of 8 rows of x) and walks k in stages of kStageCodes
// codes a row, kStages of them in flight (cp.async, no registers held while
// they travel), where the register kernel above holds two groups of blocks
// in registers (as many bytes in flight as its registers allow).
// The first stages are issued before the wait for the previous kernel:
// weights never depend on it, so their latency overlaps its tail. Warp w
// reduces the blocks b with b % 8 == w in increasing order, as the register
// kernel does, and the warps are summed in the same order: the two give the
// same bits.
template <int kStageCodes>
struct F8PipeLayout {
  static constexpr int kBlocks = kStageCodes / kBlockElems;  // per row and stage
  // Rows 64 bytes off a multiple of 128 apart: the 16-byte reads of rows g
  // and g + 1 (a quarter warp) fall in different banks.
  static constexpr int kPitch = kStageCodes + 64;
  static constexpr int kCodeBytes = 16 * kPitch;
  static constexpr int kStageBytes = kCodeBytes + 16 * kBlocks * 4;  // codes, then 16 rows of scales
  static_assert(kBlocks % kMmaWarps == 0 && kBlocks % 4 == 0, "a stage's blocks split evenly over the warps");
};

// kGlu: the gated MLP's input side over a stacked [2m, k] gate-up weight:
// a CTA's 16 rows are 8 gate rows (mma rows g) and the same 8 up rows (g +
// 8), so one lane ends with both products of an output and writes act(gate)
// * up, each product rounded to T first as linear + gated_activation do.
template <typename T, typename TO, int kStageCodes, int kStages, int NT, bool kGlu>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_f8_pipe_kernel(int n, const char* x, int64_t x_stride,
                                                                      const char* w, int64_t w_stride, int64_t m,
                                                                      int64_t k, const float* bias, char* out,
                                                                      int64_t out_stride, int chunks, bool gelu) {
  using L = F8PipeLayout<kStageCodes>;
  constexpr int kPerWarp = L::kBlocks / kMmaWarps;  // blocks of a stage each warp reduces
  extern __shared__ __align__(16) char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Consecutive CTAs share a weight tile (its token chunks): from L2 after the first.
  constexpr int kOutRows = kGlu ? 8 : 16;  // outputs of a weight tile
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / chunks) * kOutRows;
  // Tile row r's weight row; rows past m (the last tile) read row m - 1
  // again, and their sums are not written.
  auto weight_row = [&](int r) -> int64_t {
    if constexpr (kGlu) return r < 8 ? min(row0 + r, m - 1) : m + min(row0 + r - 8, m - 1);
    return min(row0 + r, m - 1);
  };
  const int tok0 = static_cast<int>(blockIdx.x % chunks) * NT * kMmaTileTokens;
  const int nb = static_cast<int>(k / kBlockElems);
  const int stages = (nb + L::kBlocks - 1) / L::kBlocks;
  // Each thread copies the same chunks of every stage (kCodeCopies 16-byte
  // pieces of codes, and threads below kScaleCopies one piece of 4 scales):
  // their sources and places are resolved once, so that issuing a stage is a
  // few cp.async and no loop (computing them per stage cost more
  // instructions than the stage's arithmetic).
  constexpr int kChunksPerRow = kStageCodes / 16;
  constexpr int kCodeCopies = 16 * kChunksPerRow / (kMmaWarps * 32);
  constexpr int kScaleChunksPerRow = L::kBlocks / 4;  // 4 scales a copy (nb % 4 == 0: launcher)
  constexpr int kScaleCopies = 16 * kScaleChunksPerRow;
  static_assert(16 * kChunksPerRow % (kMmaWarps * 32) == 0 && kScaleCopies <= kMmaWarps * 32, "copies split evenly");
  const char* code_src[kCodeCopies];
  uint32_t code_dst[kCodeCopies];
  int code_col[kCodeCopies];
#pragma unroll
  for (int j = 0; j < kCodeCopies; ++j) {
    const int c = threadIdx.x + j * kMmaWarps * 32, r = c / kChunksPerRow;
    code_col[j] = (c % kChunksPerRow) * 16;
    code_src[j] = w + weight_row(r) * w_stride + code_col[j];
    code_dst[j] = static_cast<uint32_t>(r * L::kPitch + code_col[j]);
  }
  const bool copies_scales = threadIdx.x < kScaleCopies;
  const int scale_r = threadIdx.x / kScaleChunksPerRow, scale_q = (threadIdx.x % kScaleChunksPerRow) * 4;
  const char* scale_src = w + weight_row(copies_scales ? scale_r : 0) * w_stride + k + int64_t{scale_q} * 4;
  const uint32_t scale_dst = static_cast<uint32_t>(L::kCodeBytes + (scale_r * L::kBlocks + scale_q) * 4);
  const uint32_t smem_base = smem_addr(smem);
  auto issue = [&](int stage) {
    if (stage >= stages) return;
    const uint32_t dst = smem_base + (stage % kStages) * L::kStageBytes;
    const int64_t code0 = static_cast<int64_t>(stage) * kStageCodes;
#pragma unroll
    for (int j = 0; j < kCodeCopies; ++j) {
      const bool ok = code0 + code_col[j] < k;
      cp_async16(dst + code_dst[j], ok ? code_src[j] + code0 : w, ok);
    }
    if (copies_scales) {
      const int b = stage * L::kBlocks + scale_q;
      cp_async16(dst + scale_dst, b < nb ? scale_src + int64_t{stage} * L::kBlocks * 4 : w, b < nb);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue(s);
    cp_async_commit();
  }
  wait_for_prior_kernel();
  release_next_kernel();
  // Tokens past n read token n - 1 (their columns are not written).
  const T* xrow[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int tok = min(tok0 + i * kMmaTileTokens + g, n - 1);
    xrow[i] = reinterpret_cast<const T*>(x + tok * x_stride) + 16 * t;
  }
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
  }
  for (int it = 0; it < stages; ++it) {
    // This stage's activations (L1/L2) are requested before waiting for its
    // weights; blocks past the end read the last block (and are not added).
    uint4 xv[kPerWarp][NT][2];
#pragma unroll
    for (int u = 0; u < kPerWarp; ++u) {
      const int b = min(it * L::kBlocks + warp + u * kMmaWarps, nb - 1);
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const uint4* xp = reinterpret_cast<const uint4*>(xrow[i] + int64_t{b} * kBlockElems);
        xv[u][i][0] = __ldg(xp);
        xv[u][i][1] = __ldg(xp + 1);
      }
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage `it` is in, and every warp is done with the buffer refilled next
    issue(it + kStages - 1);
    cp_async_commit();  // empty groups keep the wait count uniform
    const char* st = smem + (it % kStages) * L::kStageBytes;
    const float* sc = reinterpret_cast<const float*>(st + L::kCodeBytes);
#pragma unroll
    for (int u = 0; u < kPerWarp; ++u) {
      const int bb = warp + u * kMmaWarps;
      if (it * L::kBlocks + bb >= nb) break;
      const uint4 c0 = *reinterpret_cast<const uint4*>(st + g * L::kPitch + bb * kBlockElems + 16 * t);
      const uint4 c1 = *reinterpret_cast<const uint4*>(st + (g + 8) * L::kPitch + bb * kBlockElems + 16 * t);
      const uint32_t codes[2][4] = {{c0.x, c0.y, c0.z, c0.w}, {c1.x, c1.y, c1.z, c1.w}};
      accumulate_block<T, NT>(acc, codes, xv[u], sc[g * L::kBlocks + bb], sc[(g + 8) * L::kBlocks + bb]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are free: the warps' partial sums go there
  float(*partial)[NT][4][32] = reinterpret_cast<float(*)[NT][4][32]>(smem);
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) partial[warp][i][c][lane] = acc[i][c];
  }
  __syncthreads();
  if constexpr (kGlu) {
    // Accumulators c (0, 1: gate) and c + 2 (up) of lane ln are one output.
    for (int e = threadIdx.x; e < NT * 2 * 32; e += kMmaWarps * 32) {
      const int i = e / 64, c = (e / 32) % 2, ln = e % 32;
      float gate = 0.0f, up = 0.0f;
#pragma unroll
      for (int v = 0; v < kMmaWarps; ++v) {
        gate += partial[v][i][c][ln];
        up += partial[v][i][c + 2][ln];
      }
      const int64_t row = row0 + ln / 4;
      const int tok = tok0 + i * kMmaTileTokens + 2 * (ln % 4) + c;
      if (row < m && tok < n) {
        const float g = to_f(from_f<T>(gate)), u = to_f(from_f<T>(up));
        reinterpret_cast<TO*>(out + tok * out_stride)[row] = from_f<TO>((gelu ? gelu_tanh(g) : silu(g)) * u);
      }
    }
  } else {
    write_tile_sums<TO, NT>(partial, row0, tok0, m, n, bias, out, out_stride);
  }
}

template <typename T, typename TO, int kStageCodes, int kStages, int NT, bool kGlu = false>
void launch_pipe(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k,
                 const float* bias, char* out, int64_t os, cudaStream_t s, bool gelu = false) {
  constexpr size_t kSmem = size_t{kStages} * F8PipeLayout<kStageCodes>::kStageBytes;
  static_assert(kSmem >= sizeof(float) * kMmaWarps * NT * 4 * 32, "the partial sums reuse the stages");
  auto kernel = gemv_f8_pipe_kernel<T, TO, kStageCodes, kStages, NT, kGlu>;
  static const bool attribute_set = [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
    return true;
  }();
  (void)attribute_set;
  const int chunks = (n + NT * kMmaTileTokens - 1) / (NT * kMmaTileTokens);
  constexpr int kOutRows = kGlu ? 8 : 16;
  launch_chained(kernel, dim3(static_cast<unsigned>((m + kOutRows - 1) / kOutRows * chunks)), dim3(kMmaWarps * 32),
                 kSmem, s, n, x, xs, w, ws, m, k, bias, out, os, chunks, gelu);
}

// The shared-memory kernel's configurations (bench_gemv_cuda sweeps them):
// 512 x {4, 6} for any number of token tiles, 1024 x 4 for one (two stages'
// activations of several tiles would not fit the registers). False: none fits.
template <typename T, typename TO, int NT>
bool launch_pipe_config(GemvF8Config c, int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m,
                        int64_t k, const float* bias, char* out, int64_t os, cudaStream_t s) {
  if (c.stage_codes == 512 && c.stages == 4) {
    launch_pipe<T, TO, 512, 4, NT>(n, x, xs, w, ws, m, k, bias, out, os, s);
  } else if (c.stage_codes == 512 && c.stages == 6) {
    launch_pipe<T, TO, 512, 6, NT>(n, x, xs, w, ws, m, k, bias, out, os, s);
  } else if (NT == 1 && c.stage_codes == 1024 && c.stages == 4) {
    launch_pipe<T, TO, 1024, 4, 1>(n, x, xs, w, ws, m, k, bias, out, os, s);
  } else {
    return false;
  }
  return true;
}

// The launcher's configuration for `tiles` token tiles. Measured on the H200
// (8B shape, decode ms/step, one run): batch 1 3.63 with the register kernel
// against 3.77 with the shared-memory one (512 x 4, gate/up fused), batch 4
// 3.82 / 3.84, batch 32 7.63 / 5.87 (bf16 weights: 4.47, 4.84, 5.34). So one
// token tile takes the register kernel and more take the shared-memory one.
// DEEPINFER_GEMV_F8="stages,codes" sets one configuration for every batch
// (A/B runs; "0,512": the register kernel everywhere).
GemvF8Config default_config(int tiles) {
  static const GemvF8Config forced = [] {
    GemvF8Config c{-1, 512};
    if (const char* env = std::getenv("DEEPINFER_GEMV_F8")) {
      int stages = 0, codes = 0;
      if (std::sscanf(env, "%d,%d", &stages, &codes) == 2) c = GemvF8Config{stages, codes};
    }
    return c;
  }();
  if (forced.stages >= 0) return forced;
  return tiles == 1 ? GemvF8Config{0, 512} : GemvF8Config{4, 512};
}

template <typename T, typename TO>
void launch_typed(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k,
                  const float* bias, char* out, int64_t os, GemvF8Config c, cudaStream_t s) {
  const int tiles = std::min((n + kMmaTileTokens - 1) / kMmaTileTokens, kMaxTiles);
  // The shared-memory kernel: 16-byte aligned rows, whole 16-byte chunks of
  // scales (k a multiple of 256).
  const bool pipe_fits = reinterpret_cast<uintptr_t>(w) % 16 == 0 && ws % 16 == 0 && k % 256 == 0;
  if (c.stages < 0) c = default_config(tiles);
  if (pipe_fits && c.stages > 0) {
    bool launched = false;
    switch (tiles) {
      case 1: launched = launch_pipe_config<T, TO, 1>(c, n, x, xs, w, ws, m, k, bias, out, os, s); break;
      case 2: launched = launch_pipe_config<T, TO, 2>(c, n, x, xs, w, ws, m, k, bias, out, os, s); break;
      case 3: launched = launch_pipe_config<T, TO, 3>(c, n, x, xs, w, ws, m, k, bias, out, os, s); break;
      default: launched = launch_pipe_config<T, TO, 4>(c, n, x, xs, w, ws, m, k, bias, out, os, s); break;
    }
    if (launched) return;
  }
  const int g = c.stage_codes;
  switch (tiles) {
    case 1: launch_register<T, TO, 1>(g, n, x, xs, w, ws, m, k, bias, out, os, s); break;
    case 2: launch_register<T, TO, 2>(g, n, x, xs, w, ws, m, k, bias, out, os, s); break;
    case 3: launch_register<T, TO, 3>(g, n, x, xs, w, ws, m, k, bias, out, os, s); break;
    default: launch_register<T, TO, 4>(g, n, x, xs, w, ws, m, k, bias, out, os, s); break;
  }
}

template <typename TO>
__global__ void dequant_f8_kernel(const char* w, int64_t w_stride, int64_t rows, int64_t k, char* out,
                                  int64_t out_stride) {
  const int words = static_cast<int>(k / 4);  // 4 codes each
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(w + r * w_stride);
    const float* scales = reinterpret_cast<const float*>(w + r * w_stride + k);
    TO* o = reinterpret_cast<TO*>(out + r * out_stride);
    for (int idx = threadIdx.x; idx < words; idx += blockDim.x) {
      const uint32_t v = __ldg(codes + idx);
      const float scale = __ldg(scales + idx / (kBlockElems / 4));
      const float2 c01 = codes_to_float2(v), c23 = codes_to_float2(v >> 16);
      TO* dst = o + int64_t{idx} * 4;
      dst[0] = from_f<TO>(c01.x * scale);
      dst[1] = from_f<TO>(c01.y * scale);
      dst[2] = from_f<TO>(c23.x * scale);
      dst[3] = from_f<TO>(c23.y * scale);
    }
  }
}

}  // namespace

void launch_gemv_f8(ElemType x_type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                    int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                    Stream stream, GemvF8Config config) {
  if (n < 1 || m < 1) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GemvF8Config c = config;
  if (x_type == ElemType::F16) {
    if (out_f32) launch_typed<__half, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, c, s);
    else launch_typed<__half, __half>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, c, s);
  } else {
    if (out_f32) {
      launch_typed<__nv_bfloat16, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, c, s);
    } else {
      launch_typed<__nv_bfloat16, __nv_bfloat16>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, c, s);
    }
  }
}

bool launch_gemv_f8_glu(ElemType x_type, int n, const char* x, int64_t x_stride, const char* w_gate_up,
                        int64_t w_stride, int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride,
                        Stream stream, GemvF8Config config) {
  const bool fits = n >= 1 && n <= kMmaTileTokens && reinterpret_cast<uintptr_t>(w_gate_up) % 16 == 0 &&
                    w_stride % 16 == 0 && k % 256 == 0;
  const GemvF8Config c = config.stages < 0 ? default_config(1) : config;
  if (!fits || c.stages <= 0) return false;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto launch = [&](auto t) {
    using T = decltype(t);
    if (c.stage_codes == 1024) {
      launch_pipe<T, T, 1024, 4, 1, true>(n, x, x_stride, w_gate_up, w_stride, f, k, nullptr, out, out_stride, s, gelu);
    } else if (c.stages == 6) {
      launch_pipe<T, T, 512, 6, 1, true>(n, x, x_stride, w_gate_up, w_stride, f, k, nullptr, out, out_stride, s, gelu);
    } else {
      launch_pipe<T, T, 512, 4, 1, true>(n, x, x_stride, w_gate_up, w_stride, f, k, nullptr, out, out_stride, s, gelu);
    }
  };
  if (x_type == ElemType::F16) launch(__half{});
  else launch(__nv_bfloat16{});
  return true;
}

void launch_dequant_f8(const char* w, int64_t w_stride, int64_t rows, int64_t k, ElemType out_type, char* out,
                       int64_t out_stride, Stream stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  if (out_type == ElemType::F16) {
    dequant_f8_kernel<__half><<<blocks, 256, 0, s>>>(w, w_stride, rows, k, out, out_stride);
  } else {
    dequant_f8_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(w, w_stride, rows, k, out, out_stride);
  }
}

}  // namespace deepinfer::cuda
