// Does cuBLAS compute a row's product with the same bits as the
// batch-invariant tensor-core GEMM (cuda_mma_gemm.cuh)? If some cuBLAS
// kernels (Hopper's wgmma, no split of k) sum each output's k16 steps in the
// same order with the same rounding, the batch-invariant mode could hand
// large batches to them and keep its own kernel for small ones. For each
// Llama-3-8B projection shape and row count: the rows' bf16 outputs of
// cublasGemmEx and of every algorithm cublasLt's heuristic offers, against
// the invariant GEMM's, as the number of differing elements (with each
// algorithm's id, tile, stages and split of k).
// Usage: bench_bi_bits
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_mma_gemm.cuh"
#include "backend/cuda/cuda_wgmma_gemm.cuh"
#include "cuda_bench.h"

using namespace deepinfer::cuda;
namespace mg = deepinfer::cuda::mma_gemm;

namespace {

using deepinfer::bench::check;

std::vector<__nv_bfloat16> random_bf16(size_t n, float scale, std::mt19937& gen) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(d(gen));
  return v;
}

size_t differing(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, size_t count) {
  size_t d = 0;
  for (size_t i = 0; i < count; ++i) d += a[i] != b[i];
  return d;
}

std::vector<uint16_t> download(const void* p, size_t count) {
  std::vector<uint16_t> h(count);
  check(cudaMemcpy(h.data(), p, count * 2, cudaMemcpyDeviceToHost), "download");
  return h;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to compare\n");
    return 0;
  }
  cublasHandle_t h;
  cublasLtHandle_t lt;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  const size_t ws_bytes = size_t{64} << 20;
  void* ws = nullptr;
  check(cudaMalloc(&ws, ws_bytes), "malloc");
  cublasSetWorkspace(h, ws, ws_bytes);
  std::mt19937 gen(11);

  struct Shape {
    const char* name;
    int m, k;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate-up", 28672, 4096}, {"down", 4096, 14336}};
  const int max_n = 4096;
  for (const Shape& sh : shapes) {
    const auto xh = random_bf16(size_t(max_n) * sh.k, 1.0f, gen);
    const auto wh = random_bf16(size_t(sh.m) * sh.k, 0.05f, gen);
    __nv_bfloat16 *x, *w, *ref, *out;
    check(cudaMalloc(&x, xh.size() * 2), "malloc");
    check(cudaMalloc(&w, wh.size() * 2), "malloc");
    check(cudaMalloc(&ref, size_t(max_n) * sh.m * 2), "malloc");
    check(cudaMalloc(&out, size_t(max_n) * sh.m * 2), "malloc");
    check(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(w, wh.data(), wh.size() * 2, cudaMemcpyHostToDevice), "upload");
    // The invariant GEMM over all rows (its rows do not depend on the count).
    mg::GemmArgs g;
    g.n_rows = max_n;
    g.a_base = reinterpret_cast<const char*>(x);
    g.a_stride = int64_t{sh.k} * 2;
    g.w0 = MoeWeightView{reinterpret_cast<const char*>(w), 0, int64_t{sh.k} * 2};
    g.w1 = g.w0;
    g.n_cols = sh.m;
    g.k = sh.k;
    g.out = reinterpret_cast<char*>(ref);
    g.out_stride = int64_t{sh.m} * 2;
    mg::launch_mma_gemm<__nv_bfloat16, mg::TileConfig<128, 128, 64, 2, 4, 3>, mg::GemmOut::Elem, false, true>(g, max_n / 128, nullptr);
    check(cudaDeviceSynchronize(), "invariant gemm");
    const auto ref_h = download(ref, size_t(max_n) * sh.m);

    // Our wgmma GEMM (cuda_wgmma_gemm.cuh) on the same rows: 4,096 and a
    // partial last tile.
    for (int n : {4096, 200}) {
      const size_t elems = size_t(n) * sh.m;
      check(cudaMemset(out, 0xff, elems * 2), "memset");
      mg::GemmArgs gw = g;
      gw.n_rows = n;
      gw.out = reinterpret_cast<char*>(out);
      wgmma_gemm::launch_wgmma_gemm<__nv_bfloat16, wgmma_gemm::TileConfig<128, 2, 4>, mg::GemmOut::Elem>(gw, nullptr);
      check(cudaDeviceSynchronize(), "wgmma gemm");
      std::printf("%s n=%d wgmma 128x128: %zu of %zu differ\n", sh.name, n,
                  differing(download(out, elems), ref_h, elems), elems);
    }
    if (sh.m % 2 == 0) {
      // The gated product (gate = first half of the rows, up = second) of both kernels.
      const int n = 300, f = sh.m / 2;
      mg::GemmArgs gg = g;
      gg.n_rows = n;
      gg.n_cols = f;
      gg.w1 = MoeWeightView{reinterpret_cast<const char*>(w) + size_t(f) * sh.k * 2, 0, int64_t{sh.k} * 2};
      gg.out_stride = int64_t{f} * 2;
      gg.out = reinterpret_cast<char*>(out);
      mg::launch_mma_gemm<__nv_bfloat16, mg::TileConfig<128, 64, 32, 4, 2, 4>, mg::GemmOut::GatedAct, false, true>(
          gg, (n + 127) / 128, nullptr);
      check(cudaDeviceSynchronize(), "gated mma gemm");
      const auto gated_ref = download(out, size_t(n) * f);
      check(cudaMemset(out, 0xff, size_t(n) * f * 2), "memset");
      wgmma_gemm::launch_wgmma_gemm<__nv_bfloat16, wgmma_gemm::TileConfig<64, 2, 4>, mg::GemmOut::GatedAct>(gg, nullptr);
      check(cudaDeviceSynchronize(), "gated wgmma gemm");
      std::printf("%s n=%d gated wgmma 128x64: %zu of %zu differ\n", sh.name, n,
                  differing(download(out, size_t(n) * f), gated_ref, size_t(n) * f), size_t(n) * f);
    }

    for (int n : {1, 16, 64, 256, 4096}) {
      const size_t elems = size_t(n) * sh.m;
      const float alpha = 1.0f, beta = 0.0f;
      check(cudaMemset(out, 0xff, elems * 2), "memset");
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.m, n, sh.k, &alpha, w, CUDA_R_16BF, sh.k, x, CUDA_R_16BF, sh.k, &beta,
                   out, CUDA_R_16BF, sh.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      check(cudaDeviceSynchronize(), "cublasGemmEx");
      std::printf("%s n=%d cublasGemmEx: %zu of %zu differ\n", sh.name, n, differing(download(out, elems), ref_h, elems),
                  elems);

      cublasLtMatmulDesc_t desc;
      cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
      cublasLtMatrixLayout_t la, lb, lc;
      cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.k, sh.m, sh.k);
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.k, n, sh.k);
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, sh.m, n, sh.m);
      cublasLtMatmulPreference_t pref;
      cublasLtMatmulPreferenceCreate(&pref);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
      cublasLtMatmulHeuristicResult_t res[16];
      int found = 0;
      cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 16, res, &found);
      for (int i = 0; i < found; ++i) {
        int algo_id = -1, tile = -1, stages = -1, splitk = -1, reduction = -1;
        size_t wr = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof algo_id, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                             sizeof reduction, &wr);
        check(cudaMemset(out, 0xff, elems * 2), "memset");
        const cublasStatus_t st = cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, out, lc, out, lc, &res[i].algo,
                                                 ws, ws_bytes, nullptr);
        check(cudaDeviceSynchronize(), "cublasLtMatmul");
        std::printf("  lt[%d] algo=%d tile=%d stages=%d splitk=%d reduction=%d status=%d: %zu differ\n", i, algo_id, tile,
                    stages, splitk, reduction, static_cast<int>(st),
                    st == CUBLAS_STATUS_SUCCESS ? differing(download(out, elems), ref_h, elems) : elems);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
      std::fflush(stdout);
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(ref);
    cudaFree(out);
  }
  return 0;
}
