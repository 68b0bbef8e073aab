// The start every cuBLAS-comparing GEMM benchmark shares: a CUDA device, a
// stream and a cuBLAS handle on it with a 32 MiB workspace.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_bench.h"

namespace deepinfer::bench {

struct GemmBench {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
};

// False when there is no CUDA device (said on stdout: nothing to measure);
// exits on a CUDA or cuBLAS error.
inline bool open_gemm_bench(GemmBench& b) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return false;
  }
  check(cudaStreamCreate(&b.stream), "stream");
  if (cublasCreate(&b.cublas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  cublasSetStream(b.cublas, b.stream);
  constexpr size_t kWorkspace = size_t{32} << 20;
  void* ws = nullptr;
  check(cudaMalloc(&ws, kWorkspace), "malloc");
  cublasSetWorkspace(b.cublas, ws, kWorkspace);
  return true;
}

}  // namespace deepinfer::bench
