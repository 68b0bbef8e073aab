// A Hopper (wgmma) tensor-core GEMM with the reduction order of the
// batch-invariant GEMM of cuda_mma_gemm.cuh: out[r, c] = sum_k a[r, k] *
// w[c, k], each output adding its k16 products in order from k = 0 with f32
// accumulators. Whether a wgmma's k16 step rounds exactly as mma.sync's
// m16n8k16 does is the hardware's business: bench/bench_bi_bits.cu and the
// batch-invariance op tests compare the two bit for bit before the linear
// uses this kernel for larger batches (cuda_linear_mma.cu).
//
// A block is kWarpGroups warpgroups of 64 rows of a (tokens) by BN columns
// (weight rows); k moves in 64-element (128-byte) tiles through a ring of
// shared-memory stages filled by cp.async in the 128-byte swizzle that the
// wgmma descriptors name, so both operands are read by the tensor cores
// straight from shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_mma_gemm.cuh"

namespace deepinfer::cuda::wgmma_gemm {

using mma_gemm::GemmArgs;
using mma_gemm::GemmOut;

template <int BN, int WarpGroups, int Stages>
struct TileConfig {
  static constexpr int kBM = 64 * WarpGroups, kBN = BN, kBK = 64, kStages = Stages;
  static constexpr int kThreads = 128 * WarpGroups;
  static constexpr int kRowBytes = kBK * 2;  // one 128-byte swizzle row per tile row
  template <bool kGated>
  static constexpr uint32_t stage_bytes() { return (kBM + (kGated ? 2 : 1) * BN) * kRowBytes; }
  // + 1 KiB to align the ring to the swizzle's 1,024-byte pattern.
  template <bool kGated>
  static constexpr size_t smem_bytes() { return size_t{Stages} * stage_bytes<kGated>() + 1024; }
  static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "wgmma n is a multiple of 8 up to 256");
};

// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle:
// rows of 128 bytes, 8-row (1,024-byte) swizzle atoms stacked along M/N.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_byte_addr) {
  uint64_t d = (smem_byte_addr & 0x3FFFF) >> 4;  // start address
  d |= uint64_t{1} << 16;                       // leading byte offset (unused by swizzled K-major)
  d |= uint64_t{1024 >> 4} << 32;               // stride byte offset: one 8-row atom
  d |= uint64_t{1} << 62;                       // 128-byte swizzle
  return d;
}

// The byte offset of 16-byte chunk `chunk` (0..7) of tile row `row` in the
// 128-byte swizzle (the XOR the descriptors' swizzle mode undoes).
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy, wgmma reads it
// through the async proxy: each writer fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d (m64 x N accumulators of one warpgroup) += A (64 x 16) * B (16 x N), both
// K-major in shared memory.
template <int N, typename T>
__device__ __forceinline__ void wgmma_k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b);

// The asm of one m64 x N wgmma on shared-memory descriptors desc_a and desc_b
// into the N / 2 f32 registers a thread holds in `d`: INSTR the instruction
// (shape and types), TAIL its immediate operands after scale-d, SCALE_D an
// int (0: d = A B, else d += A B). The operand lists are written once per N.
#define DEEPINFER_WGMMA_D32_REGS                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DEEPINFER_WGMMA_D32_OUT                                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define DEEPINFER_WGMMA_ASM_N64(INSTR, TAIL, SCALE_D)                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" INSTR " {" DEEPINFER_WGMMA_D32_REGS        \
               "}, %32, %33, p, " TAIL ";\n}\n"                                                         \
               : DEEPINFER_WGMMA_D32_OUT                                                                \
               : "l"(desc_a), "l"(desc_b), "r"(SCALE_D))
#define DEEPINFER_WGMMA_ASM_N128(INSTR, TAIL, SCALE_D)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" INSTR " {" DEEPINFER_WGMMA_D32_REGS ", "      \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"           \
               "}, %64, %65, p, " TAIL ";\n}\n"                                                            \
               : DEEPINFER_WGMMA_D32_OUT, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), \
                 "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
                 "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
                 "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
                 "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])               \
               : "l"(desc_a), "l"(desc_b), "r"(SCALE_D))

// One specialisation per (N, 16-bit element type), accumulating; no
// transposes (both operands K-major).
#define DEEPINFER_WGMMA_K16(N, T, PTX_TYPE)                                                                      \
  template <>                                                                                                    \
  __device__ __forceinline__ void wgmma_k16<N, T>(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {         \
    DEEPINFER_WGMMA_ASM_N##N("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE, "1, 1, 0, 0", \
                             1);                                                                                 \
  }
DEEPINFER_WGMMA_K16(64, __nv_bfloat16, "bf16")
DEEPINFER_WGMMA_K16(64, __half, "f16")
DEEPINFER_WGMMA_K16(128, __nv_bfloat16, "bf16")
DEEPINFER_WGMMA_K16(128, __half, "f16")
#undef DEEPINFER_WGMMA_K16

// d (m64 x N) = (accumulate ? d : 0) + A (64 x 32) * B (32 x N), e4m3 codes
// K-major in shared memory (the only layout wgmma takes for 8-bit types); a
// k32 step spans the same 32 bytes of a swizzled row as a 16-bit k16 step.
template <int N>
__device__ __forceinline__ void wgmma_k32_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate);
template <>
__device__ __forceinline__ void wgmma_k32_e4m3<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  DEEPINFER_WGMMA_ASM_N64("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3", "1, 1", accumulate);
}
template <>
__device__ __forceinline__ void wgmma_k32_e4m3<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  DEEPINFER_WGMMA_ASM_N128("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3", "1, 1", accumulate);
}
#undef DEEPINFER_WGMMA_ASM_N64
#undef DEEPINFER_WGMMA_ASM_N128
#undef DEEPINFER_WGMMA_D32_REGS
#undef DEEPINFER_WGMMA_D32_OUT

template <typename T, class C, GemmOut kOut>
__global__ void __launch_bounds__(C::kThreads) wgmma_gemm_kernel(GemmArgs g) {
  constexpr bool kGated = kOut == GemmOut::GatedAct;
  constexpr int kB = kGated ? 2 : 1;
  constexpr int kRows = C::kBM + kB * C::kBN;
  constexpr int kChunksPerRow = C::kBK / 8;
  static_assert(kRows * kChunksPerRow % C::kThreads == 0, "stage loads split evenly");
  constexpr int kLoads = kRows * kChunksPerRow / C::kThreads;
  constexpr uint32_t kStageBytes = C::template stage_bytes<kGated>();
  extern __shared__ __align__(16) char smem[];
  const uint32_t s_base = (smem_addr(smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid & 31;
  const int64_t row0 = int64_t{blockIdx.x} * C::kBM, n0 = int64_t{blockIdx.y} * C::kBN;

  // Each thread copies the same chunks of every stage: resolve their rows once.
  mma_gemm::StageCopies<kLoads> copies;
  copies.template resolve<C::kBM, C::kBN, C::kThreads, kChunksPerRow, false, true>(
      g, 0, row0, n0, tid, [](int r, int ch) { return sw128_offset(r, ch); });
  const int k_tiles = static_cast<int>((g.k + C::kBK - 1) / C::kBK);
  auto load = [&](int kt) { copies.copy(g, s_base + (kt % C::kStages) * kStageBytes, int64_t{kt} * C::kBK); };

  float acc[kB][C::kBN / 2];
#pragma unroll
  for (int b = 0; b < kB; ++b) {
#pragma unroll
    for (int i = 0; i < C::kBN / 2; ++i) acc[b][i] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < k_tiles) load(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<C::kStages - 2>();
    fence_proxy_async();
    __syncthreads();
    // The stage this overwrites was read by the previous tile's wgmmas, which
    // every warpgroup waited for before the barrier above.
    if (kt + C::kStages - 1 < k_tiles) load(kt + C::kStages - 1);
    cp_async_commit();  // empty groups keep the wait count uniform
    const uint32_t stage = s_base + (kt % C::kStages) * kStageBytes;
    const uint64_t desc_a = sw128_desc(stage + wg * 64 * C::kRowBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kBK / 16; ++kk) {
      // A k16 step starts 32 bytes further along the swizzled rows.
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const uint64_t desc_b = sw128_desc(stage + (C::kBM + b * C::kBN) * C::kRowBytes);
        wgmma_k16<C::kBN, T>(acc[b], desc_a + 2 * kk, desc_b + 2 * kk);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
  }
  cp_async_wait<0>();

  // Accumulator layout (per warpgroup, m64 x N): acc[4j + {0, 1}] at row
  // 16 * warp + lane / 4, columns 8j + 2 * (lane % 4) + {0, 1}; acc[4j + {2, 3}]
  // eight rows below.
#pragma unroll
  for (int j = 0; j < C::kBN / 8; ++j) {
    const int64_t col = n0 + j * 8 + (lane & 3) * 2;
    if (col >= g.n_cols) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + wg * 64 + warp * 16 + (lane >> 2) + half * 8;
      if (row >= g.n_rows) continue;
      float v[2][2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        v[b][0] = acc[b < kB ? b : 0][4 * j + 2 * half];
        v[b][1] = acc[b < kB ? b : 0][4 * j + 2 * half + 1];
      }
      mma_gemm::store_pair<T, kOut, true>(g, 0, row, col, v);
    }
  }
}

template <typename T, class C, GemmOut kOut>
void launch_wgmma_gemm(const GemmArgs& g, cudaStream_t stream) {
  constexpr size_t smem = C::template smem_bytes<kOut == GemmOut::GatedAct>();
  auto kernel = wgmma_gemm_kernel<T, C, kOut>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>((g.n_rows + C::kBM - 1) / C::kBM),
                  static_cast<unsigned>((g.n_cols + C::kBN - 1) / C::kBN));
  kernel<<<grid, C::kThreads, smem, stream>>>(g);
}

}  // namespace deepinfer::cuda::wgmma_gemm
