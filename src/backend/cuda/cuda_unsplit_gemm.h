// cuBLASLt products restricted to algorithms that do not split k: each
// output then adds its k16 tensor-core steps in order from k = 0 in f32, as
// the batch-invariant GEMM of cuda_mma_gemm.cuh does. On an H100 every such
// algorithm cuBLASLt offered for the Llama-3-8B projections gave the
// mma.sync GEMM's bits at every row count, and every split-k one differed
// (bench/bench_bi_bits.cu, run 71). So the batch-invariant mode can hand
// larger batches to cuBLAS's kernels, as fast as the default path, as long
// as a start-up probe confirms the bits on the GPU at hand (the backend's
// probe_unsplit_gemm).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace deepinfer::cuda {

class UnsplitGemm {
 public:
  UnsplitGemm() = default;
  ~UnsplitGemm();
  UnsplitGemm(const UnsplitGemm&) = delete;
  UnsplitGemm& operator=(const UnsplitGemm&) = delete;

  // The workspace is shared with the stream's other cuBLAS calls (stream-ordered).
  void init(void* workspace, size_t workspace_bytes);

  // out[n, m] = x[n, k] W[m, k]^T for row-major x, W and out with leading
  // dimensions (elements) ldx, ldw, ldo; ab: x's and W's type (16-bit), c:
  // out's (f32 or ab). False, with nothing launched, when cuBLASLt offers no
  // algorithm without a split of k for the shape.
  bool run(cudaDataType_t ab, cudaDataType_t c, int64_t n, int64_t m, int64_t k, const void* x, int64_t ldx,
           const void* w, int64_t ldw, void* out, int64_t ldo, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;
  };
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  Plan& plan_for(const Key& key);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;  // one per shape, types and leading dimensions
};

}  // namespace deepinfer::cuda
