#include "backend/cuda/cuda_unsplit_gemm.h"

#include "core/error.h"

namespace deepinfer::cuda {

namespace {

int config_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t what) {
  int value = -1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, what, &value, sizeof value, &written) != CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return value;
}

}  // namespace

UnsplitGemm::~UnsplitGemm() {
  for (auto& [key, p] : plans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  if (lt_) cublasLtDestroy(lt_);
}

void UnsplitGemm::init(void* workspace, size_t workspace_bytes) {
  DI_CHECK(cublasLtCreate(&lt_) == CUBLAS_STATUS_SUCCESS, "CUDA backend: cublasLtCreate failed");
  workspace_ = workspace;
  workspace_bytes_ = workspace_bytes;
}

UnsplitGemm::Plan& UnsplitGemm::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan& p = plans_[key];
  const auto [ab_i, c_i, n, m, k, ldx, ldw, ldo] = key;
  const auto ab = static_cast<cudaDataType_t>(ab_i), c = static_cast<cudaDataType_t>(c_i);
  // Column-major, as in the backend's cuBLAS linear: out^T[m, n] = W[m, k]
  // (its row-major [m, k] read transposed) times x^T[k, n].
  cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  cublasLtMatrixLayoutCreate(&p.a, ab, static_cast<uint64_t>(k), static_cast<uint64_t>(m), ldw);
  cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(k), static_cast<uint64_t>(n), ldx);
  cublasLtMatrixLayoutCreate(&p.c, c, static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldo);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof workspace_bytes_);
  constexpr int kAsked = 16;
  cublasLtMatmulHeuristicResult_t results[kAsked];
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, kAsked, results, &found) ==
      CUBLAS_STATUS_SUCCESS) {
    // The heuristic's order is its guess at speed: the first without a split.
    for (int i = 0; i < found && !p.found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      if (config_attribute(results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) != 1) continue;
      if (config_attribute(results[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != CUBLASLT_REDUCTION_SCHEME_NONE) {
        continue;
      }
      p.algo = results[i].algo;
      p.found = true;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return p;
}

bool UnsplitGemm::run(cudaDataType_t ab, cudaDataType_t c, int64_t n, int64_t m, int64_t k, const void* x,
                      int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, cudaStream_t stream) {
  if (lt_ == nullptr) return false;
  Plan& p = plan_for(Key{static_cast<int>(ab), static_cast<int>(c), n, m, k, ldx, ldw, ldo});
  if (!p.found) return false;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(lt_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo, workspace_,
                        workspace_bytes_, stream) == CUBLAS_STATUS_SUCCESS;
}

}  // namespace deepinfer::cuda
