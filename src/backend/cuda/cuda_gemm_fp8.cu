// FP8 x FP8 tensor-core GEMM for FP8 row-block weights (DType::F8E4M3_B64
// in split rows) at batches the FP8 gemv does not serve: prefill and large
// decode batches. The activations are quantised on the fly to e4m3 with one
// scale per 64 elements of a row (the weights' own block shape), so a
// 64-element block of a product is one pair of wgmma k32 steps on codes,
// scaled once by activation scale x weight scale and added to f32
// accumulators (the same two-level sum as DeepSeek-V3's FP8 GEMMs, on finer
// blocks). Twice the tensor-core rate of bf16 and half the weight bytes; the
// price is the activations' e4m3 rounding (3 mantissa bits, a relative
// 2^-4 per element at most), reported in docs/quantization.md.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma_gemm.cuh"
#include "backend/cuda/cuda_wgmma_gemm.cuh"

namespace deepinfer::cuda {

namespace {

using mma_gemm::GemmArgs;
using mma_gemm::GemmOut;
using wgmma_gemm::sw128_desc;
using wgmma_gemm::sw128_offset;

constexpr int kBlock = 64;  // elements per scale, activations and weights alike

// One warp per 64-element block of a row: two elements a lane. scale =
// max |x| / 448 (0 for a block of zeros, whose codes are then 0).
template <typename T>
__global__ void quantize_rows_f8_kernel(const char* x, int64_t x_stride, int64_t n, int64_t k, uint8_t* codes,
                                        float* scales) {
  const int64_t blocks = k / kBlock;
  const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= n * blocks) return;
  const int64_t row = warp / blocks, b = warp % blocks;
  const T* src = reinterpret_cast<const T*>(x + row * x_stride) + b * kBlock;
  const float v0 = to_f(src[2 * lane]), v1 = to_f(src[2 * lane + 1]);
  float amax = fmaxf(fabsf(v0), fabsf(v1));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax / 448.0f;
  const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
  const __nv_fp8x2_storage_t pair = __nv_cvt_float2_to_fp8x2(make_float2(v0 * inv, v1 * inv), __NV_SATFINITE, __NV_E4M3);
  reinterpret_cast<__nv_fp8x2_storage_t*>(codes + row * k + b * kBlock)[lane] = pair;
  if (lane == 0) scales[row * blocks + b] = scale;
}

// Two warpgroups of 64 rows x BN weight rows; k tiles of 128 codes (two scale
// blocks) in a ring of cp.async stages, the codes in the 128-byte swizzle the
// descriptors name, the tile's scales (2 per row of a and of w) beside them.
// MinBlocks: blocks an SM should hold (registers and shared memory allow
// 2 for BN = 64), so that one block's scaling overlaps another's products.
// Overlap: both blocks of a k tile go to the tensor cores before the first
// is scaled (two sets of partial sums: BN = 64 only, for registers).
template <int BN, int Stages, int MinBlocks, bool Overlap>
struct F8Tiles {
  static constexpr int kBM = 128, kBN = BN, kBK = 128, kStages = Stages, kThreads = 256;
  static constexpr int kMinBlocks = MinBlocks, kParts = Overlap ? 2 : 1;
  static constexpr bool kOverlap = Overlap;
  static constexpr uint32_t kCodeBytes = (kBM + BN) * kBK;  // one stage's codes: whole swizzle atoms
  static constexpr uint32_t kScaleBytes = (kBM + BN) * 2 * sizeof(float);
  static constexpr size_t smem_bytes() { return size_t{Stages} * (kCodeBytes + kScaleBytes) + 1024; }
  static_assert(!Overlap || BN <= 64, "two sets of partial sums fit the registers up to 64 columns");
};

// Where a's scales are ([n, k / 64] f32) and w's (after each split row's codes).
struct F8Scales {
  const float* a = nullptr;
  int64_t blocks = 0;  // k / 64
};

template <typename T, class C, GemmOut kOut>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) gemm_f8_kernel(GemmArgs g, F8Scales sc) {
  constexpr int kRows = C::kBM + C::kBN;
  constexpr int kChunksPerRow = C::kBK / 16;
  constexpr int kLoads = kRows * kChunksPerRow / C::kThreads;
  static_assert(kRows * kChunksPerRow % C::kThreads == 0, "stage loads split evenly");
  static_assert(kRows <= C::kThreads, "one scale pair a thread per stage");
  extern __shared__ __align__(16) char smem[];
  const uint32_t s_base = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t s_scales = s_base + C::kStages * C::kCodeBytes;
  const float* scale_ring = reinterpret_cast<const float*>(smem + (s_scales - smem_addr(smem)));
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid & 31;
  const int64_t row0 = int64_t{blockIdx.x} * C::kBM, n0 = int64_t{blockIdx.y} * C::kBN;

  mma_gemm::StageCopies<kLoads, 1> copies;
  copies.template resolve<C::kBM, C::kBN, C::kThreads, kChunksPerRow, false, true>(
      g, 0, row0, n0, tid, [](int r, int ch) { return sw128_offset(r, ch); });
  // This thread's scale row of every stage: a's row tid (tid < BM) or w's
  // (threads past BM + BN have none).
  const float* scale_src = sc.a;
  bool scale_row_ok = false;
  if (tid < C::kBM) {
    scale_row_ok = row0 + tid < g.n_rows;
    scale_src = sc.a + (scale_row_ok ? row0 + tid : 0) * sc.blocks;
  } else if (tid < kRows) {
    const int64_t col = n0 + tid - C::kBM;
    scale_row_ok = col < g.n_cols;
    scale_src = reinterpret_cast<const float*>(g.w0.base + (scale_row_ok ? col : 0) * g.w0.row_stride + g.k);
  }
  const int k_tiles = static_cast<int>((g.k + C::kBK - 1) / C::kBK);
  auto load = [&](int kt) {
    const int slot = kt % C::kStages;
    copies.copy(g, s_base + slot * C::kCodeBytes, int64_t{kt} * C::kBK);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (tid >= kRows) break;
      const int64_t kb = 2 * int64_t{kt} + h;
      const bool ok = scale_row_ok && kb < sc.blocks;
      const uint32_t dst = s_scales + slot * C::kScaleBytes + (tid * 2 + h) * 4;
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst),
                   "l"(ok ? scale_src + kb : sc.a), "r"(ok ? 4 : 0));
    }
  };

  float acc[C::kBN / 2], part[C::kParts][C::kBN / 2];
#pragma unroll
  for (int i = 0; i < C::kBN / 2; ++i) {
    acc[i] = 0.0f;
#pragma unroll
    for (int p = 0; p < C::kParts; ++p) part[p][i] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < k_tiles) load(s);
    cp_async_commit();
  }
  // Accumulator layout (per warpgroup, m64 x N): part[4j + {0, 1}] at row
  // 16 * warp + lane / 4, columns 8j + 2 * (lane % 4) + {0, 1}; part[4j + {2, 3}]
  // eight rows below.
  const int a_row = wg * 64 + warp * 16 + (lane >> 2);
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<C::kStages - 2>();
    wgmma_gemm::fence_proxy_async();
    __syncthreads();
    // The slot this overwrites was last read in iteration kt - 1, which every
    // warpgroup finished (wgmma waited, scales read) before the barrier.
    if (kt + C::kStages - 1 < k_tiles) load(kt + C::kStages - 1);
    cp_async_commit();
    const int slot = kt % C::kStages;
    const uint32_t stage = s_base + slot * C::kCodeBytes;
    const float* tile_scales = scale_ring + slot * (C::kScaleBytes / sizeof(float));
    const uint64_t desc_a = sw128_desc(stage + wg * 64 * C::kBK);
    const uint64_t desc_b = sw128_desc(stage + C::kBM * C::kBK);
    const bool second = 2 * int64_t{kt} + 1 < sc.blocks;  // else the tile is one block (k % 128 == 64)
    // acc += block h's sums on codes (p) x activation scale x weight scale.
    auto scale_in = [&](const float (&p)[C::kBN / 2], int h) {
      const float sa0 = tile_scales[a_row * 2 + h], sa1 = tile_scales[(a_row + 8) * 2 + h];
#pragma unroll
      for (int j = 0; j < C::kBN / 8; ++j) {
        const int c = C::kBM + j * 8 + (lane & 3) * 2;
        const float sw0 = tile_scales[c * 2 + h], sw1 = tile_scales[(c + 1) * 2 + h];
        acc[4 * j] = fmaf(p[4 * j], sa0 * sw0, acc[4 * j]);
        acc[4 * j + 1] = fmaf(p[4 * j + 1], sa0 * sw1, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(p[4 * j + 2], sa1 * sw0, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(p[4 * j + 3], sa1 * sw1, acc[4 * j + 3]);
      }
    };
    // Block h is bytes 64h..64h+63 of each swizzled row: k32 steps 2h, 2h + 1.
    auto block_products = [&](float (&p)[C::kBN / 2], int h) {
      wgmma_gemm::wgmma_k32_e4m3<C::kBN>(p, desc_a + 4 * h, desc_b + 4 * h, 0);
      wgmma_gemm::wgmma_k32_e4m3<C::kBN>(p, desc_a + 4 * h + 2, desc_b + 4 * h + 2, 1);
    };
    if constexpr (C::kOverlap) {
      wgmma_gemm::wgmma_fence();
      block_products(part[0], 0);
      wgmma_gemm::wgmma_commit();
      if (second) block_products(part[C::kParts - 1], 1);
      wgmma_gemm::wgmma_commit();
      wgmma_gemm::wgmma_wait<1>();
      scale_in(part[0], 0);
      wgmma_gemm::wgmma_wait<0>();
      if (second) scale_in(part[C::kParts - 1], 1);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && !second) break;
        wgmma_gemm::wgmma_fence();
        block_products(part[0], h);
        wgmma_gemm::wgmma_commit();
        wgmma_gemm::wgmma_wait<0>();
        scale_in(part[0], h);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int j = 0; j < C::kBN / 8; ++j) {
    const int64_t col = n0 + j * 8 + (lane & 3) * 2;
    if (col >= g.n_cols) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + a_row + half * 8;
      if (row >= g.n_rows) continue;
      const float v[2][2] = {{acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]}, {0.0f, 0.0f}};
      mma_gemm::store_pair<T, kOut, true>(g, 0, row, col, v);
    }
  }
}

template <typename T, class C, GemmOut kOut>
void launch_gemm(const GemmArgs& g, const F8Scales& sc, cudaStream_t stream) {
  constexpr size_t smem = C::smem_bytes();
  auto kernel = gemm_f8_kernel<T, C, kOut>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>((g.n_rows + C::kBM - 1) / C::kBM),
                  static_cast<unsigned>((g.n_cols + C::kBN - 1) / C::kBN));
  kernel<<<grid, C::kThreads, smem, stream>>>(g, sc);
}

// bench_fp8_gemm times each configuration (launch_gemm_f8's `tiles`); the
// backend picks by width from its H100 figures.
using Tiles128 = F8Tiles<128, 4, 1, false>;
using Tiles64x2 = F8Tiles<64, 4, 2, false>;
using Tiles64Overlap = F8Tiles<64, 4, 1, true>;
using Tiles64Overlapx2 = F8Tiles<64, 4, 2, true>;

template <typename T, class C>
void launch_out(const GemmArgs& g, const F8Scales& sc, bool out_f32, cudaStream_t s) {
  if (out_f32) {
    launch_gemm<T, C, GemmOut::F32>(g, sc, s);
  } else {
    launch_gemm<T, C, GemmOut::Elem>(g, sc, s);
  }
}

template <typename T>
void launch_typed(const GemmArgs& g, const F8Scales& sc, bool out_f32, int tiles, cudaStream_t s) {
  switch (tiles) {
    case 1: launch_out<T, Tiles64x2>(g, sc, out_f32, s); break;
    case 2: launch_out<T, Tiles64Overlap>(g, sc, out_f32, s); break;
    case 3: launch_out<T, Tiles64Overlapx2>(g, sc, out_f32, s); break;
    default: launch_out<T, Tiles128>(g, sc, out_f32, s); break;
  }
}

}  // namespace

bool gemm_f8_fits(int64_t k, int64_t m, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                  const char* out, int64_t out_stride) {
  // 16-byte chunks of x's and w's codes, w's scales 4-byte aligned, pairs of output columns.
  return k % kBlock == 0 && m % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0 && x_stride % 4 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && w_stride % 16 == 0 &&
         reinterpret_cast<uintptr_t>(out) % 8 == 0 && out_stride % 8 == 0;
}

size_t gemm_f8_scratch_bytes(int64_t n, int64_t k) {
  return static_cast<size_t>(n * k) + static_cast<size_t>(n * (k / kBlock)) * sizeof(float) + 16;
}

void launch_gemm_f8(ElemType x_type, int64_t n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                    int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                    char* scratch, Stream stream, int tiles) {
  auto s = static_cast<cudaStream_t>(stream);
  auto* codes = reinterpret_cast<uint8_t*>(scratch);
  // The scales after the codes, 16-byte aligned (n * k is a multiple of 64).
  auto* scales = reinterpret_cast<float*>(scratch + n * k);
  const int64_t warps = n * (k / kBlock);
  const unsigned blocks = static_cast<unsigned>((warps * 32 + 255) / 256);
  if (x_type == ElemType::BF16) {
    quantize_rows_f8_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(x, x_stride, n, k, codes, scales);
  } else {
    quantize_rows_f8_kernel<__half><<<blocks, 256, 0, s>>>(x, x_stride, n, k, codes, scales);
  }
  const GemmArgs g =
      mma_gemm::dense_args(n, reinterpret_cast<const char*>(codes), k, w, w_stride, m, k, bias, out, out_stride);
  const F8Scales sc{scales, k / kBlock};
  if (x_type == ElemType::BF16) {
    launch_typed<__nv_bfloat16>(g, sc, out_f32, tiles, s);
  } else {
    launch_typed<__half>(g, sc, out_f32, tiles, s);
  }
}

}  // namespace deepinfer::cuda
