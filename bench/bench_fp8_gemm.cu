// FP8 row-block weights at batches past the FP8 gemv: the FP8 x FP8 GEMM
// (cuda_gemm_fp8.cu, its activation quantiser included) against the path it
// replaces (weights dequantised to bf16, then cuBLAS) and against cuBLAS on
// bf16 weights, per Llama-3-8B projection shape and row count. Each launch
// reads another copy of the weights (L2 would otherwise hold them).
// Reported: microseconds (the GEMM under each tile configuration of
// launch_gemm_f8) and TFLOP/s of the best (2 n m k per product).
// Usage: bench_fp8_gemm [reps=20]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_kernels.h"
#include "cuda_gemm_bench.h"

using namespace deepinfer::cuda;

namespace {

using deepinfer::bench::check;
using deepinfer::bench::median_launch_us;

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  deepinfer::bench::GemmBench bench;
  if (!deepinfer::bench::open_gemm_bench(bench)) return 0;
  cudaStream_t s = bench.stream;
  cublasHandle_t h = bench.cublas;

  const size_t w_total = size_t{1} << 30;
  const int64_t max_rows = 4096, max_k = 14336, max_m = 28672;
  char *w8 = nullptr, *w16 = nullptr, *deq = nullptr, *x = nullptr, *out = nullptr, *scratch = nullptr;
  check(cudaMalloc(&w8, w_total), "malloc");
  check(cudaMalloc(&w16, w_total), "malloc");
  check(cudaMalloc(&deq, size_t(max_m) * max_k * 2), "malloc");
  check(cudaMalloc(&x, size_t(max_rows) * max_k * 2), "malloc");
  check(cudaMalloc(&out, size_t(max_rows) * max_m * 2), "malloc");
  check(cudaMalloc(&scratch, gemm_f8_scratch_bytes(max_rows, max_k)), "malloc");
  check(cudaMemset(w8, 0, w_total), "memset");
  check(cudaMemset(w16, 0, w_total), "memset");
  check(cudaMemset(x, 0, size_t(max_rows) * max_k * 2), "memset");

  struct Shape {
    const char* name;
    int64_t m, k;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate-up", 28672, 4096}, {"down", 4096, 14336}};
  std::printf("| shape | rows | cuBLAS bf16 us | dequant + cuBLAS us | FP8 GEMM us, tiles 0 / 1 / 2 / 3 | best | "
              "FP8 TFLOP/s | x cuBLAS bf16 | x dequant |\n|---|---|---|---|---|---|---|---|---|\n");
  const float alpha = 1.0f, beta = 0.0f;
  for (const Shape& sh : shapes) {
    const int64_t stride8 = sh.k + sh.k / 16;  // split rows: codes, then one f32 scale per 64
    const size_t span8 = (size_t(sh.m) * stride8 + 4095) / 4096 * 4096;
    const size_t span16 = (size_t(sh.m) * sh.k * 2 + 4095) / 4096 * 4096;
    const size_t copies8 = std::max<size_t>(1, w_total / span8), copies16 = std::max<size_t>(1, w_total / span16);
    for (int64_t n : {64, 128, 256, 512, 1024, 4096}) {
      size_t next8 = 0, next16 = 0;
      auto weights8 = [&] { return w8 + (next8++ % copies8) * span8; };
      auto weights16 = [&] { return w16 + (next16++ % copies16) * span16; };
      auto cublas = [&](const char* w) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.m), static_cast<int>(n), static_cast<int>(sh.k),
                     &alpha, w, CUDA_R_16BF, static_cast<int>(sh.k), x, CUDA_R_16BF, static_cast<int>(sh.k), &beta,
                     out, CUDA_R_16BF, static_cast<int>(sh.m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      const double bf16_us = median_launch_us(reps, s, [&] { cublas(weights16()); });
      const double deq_us = median_launch_us(reps, s, [&] {
        launch_dequant_f8(weights8(), stride8, sh.m, sh.k, ElemType::BF16, deq, sh.k * 2, s);
        cublas(deq);
      });
      double f8_us[4];
      for (int tiles = 0; tiles < 4; ++tiles) {
        f8_us[tiles] = median_launch_us(reps, s, [&] {
          launch_gemm_f8(ElemType::BF16, n, x, sh.k * 2, weights8(), stride8, sh.m, sh.k, nullptr, false, out,
                         sh.m * 2, scratch, s, tiles);
        });
      }
      check(cudaGetLastError(), "launch");
      const int best = static_cast<int>(std::min_element(f8_us, f8_us + 4) - f8_us);
      const double flops = 2.0 * double(n) * double(sh.m) * double(sh.k);
      std::printf("| %s | %lld | %.1f | %.1f | %.1f / %.1f / %.1f / %.1f | %d | %.0f | %.2f | %.2f |\n", sh.name,
                  static_cast<long long>(n), bf16_us, deq_us, f8_us[0], f8_us[1], f8_us[2], f8_us[3], best,
                  flops / f8_us[best] / 1e6, bf16_us / f8_us[best], deq_us / f8_us[best]);
    }
  }
  check(cudaStreamSynchronize(s), "sync");
  return 0;
}
