// The batch-invariant linear (DEEPINFER_BATCH_INVARIANT=1) against the
// default path, per Llama-3-8B projection shape and row count: cuBLAS (and
// the gemv for a few rows), then the invariant tensor-core GEMM of
// cuda_mma_gemm.cuh under each tile configuration below. Tiles only change
// what is staged together, never a row's order of accumulation (so any of
// them may serve any row count without changing a bit); this finds, per row
// count, the fastest, to set against cuBLAS. Each launch reads another copy
// of the weights (a 4096 x 4096 matrix would otherwise sit in L2).
// Reported: microseconds, TFLOP/s and GB/s of weights read.
// Usage: bench_bi_linear [reps=20] [row counts, comma-separated; default 1,8,16,32,64,128,256,512,4096]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma_gemm.cuh"
#include "backend/cuda/cuda_wgmma_gemm.cuh"
#include "bi_rows_kernel.cuh"
#include "cuda_gemm_bench.h"

using namespace deepinfer::cuda;
namespace mg = deepinfer::cuda::mma_gemm;
namespace mma_rows = deepinfer::bench::mma_rows;

namespace {

using deepinfer::bench::check;
using deepinfer::bench::median_launch_us;

struct Candidate {
  std::string name;
  bool gated_ok;
  std::function<void(const mg::GemmArgs&, bool gated, cudaStream_t)> launch;
};

template <int BM, int BN, int BK, int WM, int WN, int S>
Candidate candidate(bool gated_ok) {
  using C = mg::TileConfig<BM, BN, BK, WM, WN, S>;
  Candidate c;
  char name[64];
  std::snprintf(name, sizeof name, "%dx%dx%d w%dx%d s%d", BM, BN, BK, WM, WN, S);
  c.name = name;
  c.gated_ok = gated_ok;
  c.launch = [gated_ok](const mg::GemmArgs& g, bool gated, cudaStream_t s) {
    const int64_t tiles = (g.n_rows + BM - 1) / BM;
    if (gated) {
      if constexpr (C::kMT * C::kNT <= 8) {
        mg::launch_mma_gemm<__nv_bfloat16, C, mg::GemmOut::GatedAct, false, true>(g, tiles, s);
      }
    } else {
      mg::launch_mma_gemm<__nv_bfloat16, C, mg::GemmOut::Elem, false, true>(g, tiles, s);
    }
    (void)gated_ok;
  };
  return c;
}

// The wgmma GEMM (cuda_wgmma_gemm.cuh): BN columns, WG warpgroups of 64 rows.
template <int BN, int WG, int S>
Candidate wgmma_candidate() {
  using C = wgmma_gemm::TileConfig<BN, WG, S>;
  Candidate c;
  char name[64];
  std::snprintf(name, sizeof name, "wgmma %dx%d s%d", C::kBM, BN, S);
  c.name = name;
  c.gated_ok = BN <= 64;
  c.launch = [](const mg::GemmArgs& g, bool gated, cudaStream_t s) {
    if (gated) {
      if constexpr (BN <= 64) wgmma_gemm::launch_wgmma_gemm<__nv_bfloat16, C, mg::GemmOut::GatedAct>(g, s);
    } else {
      wgmma_gemm::launch_wgmma_gemm<__nv_bfloat16, C, mg::GemmOut::Elem>(g, s);
    }
  };
  return c;
}

// The few-row kernel (bi_rows_kernel.cuh): kWarps warps a block, kU chunks
// in flight (kUGated for the gated product's two weight rows).
template <int kWarps, int kU, int kUGated>
Candidate rows_candidate() {
  Candidate c;
  char name[64];
  std::snprintf(name, sizeof name, "rows w%d u%d/%d", kWarps, kU, kUGated);
  c.name = name;
  c.gated_ok = true;
  c.launch = [](const mg::GemmArgs& g, bool gated, cudaStream_t s) {
    if (gated) {
      mma_rows::launch_dense<__nv_bfloat16, mg::GemmOut::GatedAct, kWarps, kUGated>(g, s);
    } else {
      mma_rows::launch_dense<__nv_bfloat16, mg::GemmOut::Elem, kWarps, kU>(g, s);
    }
  };
  return c;
}

// Deterministic pseudo-random bf16 in [-scale, scale).
__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(scale * (static_cast<float>(h >> 8) / float(1 << 23) - 1.0f));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  std::vector<int64_t> row_counts = {1, 8, 16, 32, 64, 128, 256, 512, 4096};
  if (argc > 2) {
    row_counts.clear();
    for (const char* p = argv[2]; *p != '\0';) {
      char* end = nullptr;
      const long long v = std::strtoll(p, &end, 10);
      if (end == p || v < 1 || v > 4096) {
        std::fprintf(stderr, "bench_bi_linear: bad row count list '%s' (1..4096, comma-separated)\n", argv[2]);
        return 2;
      }
      row_counts.push_back(v);
      p = *end == ',' ? end + 1 : end;
    }
  }
  deepinfer::bench::GemmBench bench;
  if (!deepinfer::bench::open_gemm_bench(bench)) return 0;
  cudaStream_t s = bench.stream;
  cublasHandle_t h = bench.cublas;

  const size_t w_total = size_t{1} << 30;
  const int64_t max_rows = 4096, max_k = 14336, max_m = 28672;
  char *w = nullptr, *x = nullptr, *out = nullptr;
  check(cudaMalloc(&w, w_total), "malloc");
  check(cudaMalloc(&x, size_t(max_rows) * max_k * 2), "malloc");
  check(cudaMalloc(&out, size_t(max_rows) * max_m * 2), "malloc");
  check(cudaMemset(w, 0, w_total), "memset");
  check(cudaMemset(x, 0, size_t(max_rows) * max_k * 2), "memset");

  // The configurations in use (decode 16 x 32, mid 32 x 32, prefill 64 x 64,
  // large 128 x 128) and candidates. Gated products hold two sums per output,
  // so only tiles of at most 8 m16 x n8 sums a warp run gated.
  std::vector<Candidate> cands = {
      candidate<16, 32, 128, 1, 2, 4>(true),   candidate<32, 32, 128, 2, 2, 4>(true),
      candidate<64, 64, 32, 2, 2, 4>(true),    candidate<128, 128, 32, 2, 4, 4>(false),
      candidate<64, 32, 128, 4, 1, 3>(true),   candidate<32, 64, 128, 2, 2, 3>(true),
      candidate<64, 128, 64, 2, 4, 3>(true),   candidate<128, 64, 32, 4, 2, 4>(true),
      candidate<128, 128, 64, 2, 4, 3>(false), candidate<16, 64, 128, 1, 4, 4>(true),
      candidate<128, 256, 32, 2, 4, 3>(false), candidate<64, 64, 64, 2, 2, 4>(true),
      // Few rows: more weight bytes in flight per SM (narrower column tiles
      // for more blocks, deeper rings, longer k stages).
      candidate<16, 16, 128, 1, 1, 4>(true),   candidate<16, 16, 128, 1, 1, 8>(true),
      candidate<16, 32, 128, 1, 2, 8>(true),   candidate<16, 32, 256, 1, 2, 4>(true),
      candidate<16, 16, 256, 1, 1, 4>(true),
      // Weights straight into mma fragments, no shared memory (bi_rows_kernel.cuh).
      rows_candidate<2, 8, 4>(),               rows_candidate<4, 8, 4>(),
      rows_candidate<1, 8, 4>(),               rows_candidate<8, 8, 4>(),
      rows_candidate<2, 4, 2>(),
      wgmma_candidate<128, 2, 4>(),            wgmma_candidate<64, 2, 4>(),
      wgmma_candidate<128, 1, 4>(),            wgmma_candidate<64, 1, 6>(),
      // Three stages: 97 KiB, two blocks an SM.
      wgmma_candidate<128, 2, 3>(),            wgmma_candidate<64, 2, 3>(),
  };

  // Bits first: each rows candidate against the 16 x 32 x 128 GEMM on random
  // operands (k = 4104 and 14344 leave a partial last chunk).
  {
    const int64_t k_cases[] = {4096, 4104, 14336, 14344};
    fill_random<<<1024, 256, 0, s>>>(reinterpret_cast<__nv_bfloat16*>(w), w_total / 2, 7u, 0.05f);
    fill_random<<<1024, 256, 0, s>>>(reinterpret_cast<__nv_bfloat16*>(x), size_t(max_rows) * max_k, 9u, 1.0f);
    char* ref = out + (size_t{1} << 26);  // past the rows compared: the reference
    const int64_t m = 4096;
    for (const bool gated : {false, true}) {
      for (const int64_t k : k_cases) {
        for (const int64_t n : {1, 5, 8, 9, 16}) {
          mg::GemmArgs g;
          g.n_rows = n;
          g.a_base = x;
          g.a_stride = k * 2;
          g.w0 = MoeWeightView{w, 0, k * 2};
          g.w1 = gated ? MoeWeightView{w + m * k * 2, 0, k * 2} : g.w0;
          g.n_cols = m;
          g.k = k;
          g.out_stride = m * 2;
          g.out = ref;
          cands[0].launch(g, gated, s);
          for (size_t ci = 0; ci < cands.size(); ++ci) {
            if (cands[ci].name.rfind("rows", 0) != 0) continue;
            check(cudaMemsetAsync(out, 0xff, size_t(n) * m * 2, s), "memset");
            g.out = out;
            cands[ci].launch(g, gated, s);
            std::vector<uint16_t> a(size_t(n) * m), b(size_t(n) * m);
            check(cudaMemcpy(a.data(), out, a.size() * 2, cudaMemcpyDeviceToHost), "download");
            check(cudaMemcpy(b.data(), ref, b.size() * 2, cudaMemcpyDeviceToHost), "download");
            size_t d = 0;
            for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
            std::printf("bits: %s %s k=%lld n=%lld: %zu of %zu differ from 16x32x128\n", cands[ci].name.c_str(),
                        gated ? "gated" : "plain", static_cast<long long>(k), static_cast<long long>(n), d,
                        a.size());
          }
        }
      }
    }
    check(cudaMemset(w, 0, w_total), "memset");
    check(cudaMemset(x, 0, size_t(max_rows) * max_k * 2), "memset");
  }

  struct Shape {
    const char* name;
    int64_t m, k;
    bool gated;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096, false},
                          {"o", 4096, 4096, false},
                          {"gate-up (gated)", 14336, 4096, true},
                          {"down", 4096, 14336, false}};
  std::printf("| shape | rows | cuBLAS us | gemv us | best invariant tiles | us | TFLOP/s | weight GB/s | x cuBLAS | "
              "current tiles us |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    const int64_t w_rows = sh.gated ? 2 * sh.m : sh.m;
    const double w_bytes = double(w_rows) * sh.k * 2;
    const size_t span = (static_cast<size_t>(w_bytes) + 4095) / 4096 * 4096;
    const size_t copies = std::max<size_t>(1, w_total / span);
    for (const int64_t n : row_counts) {
      size_t next = 0;
      auto weights = [&] { return w + (next++ % copies) * span; };
      const float alpha = 1.0f, beta = 0.0f;
      // The default path: one cuBLAS product of all weight rows (gated: gate
      // and up, the activation being a separate small kernel not timed here).
      const double cublas_us = median_launch_us(reps, s, [&] {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w_rows), static_cast<int>(n),
                     static_cast<int>(sh.k), &alpha, weights(), CUDA_R_16BF, static_cast<int>(sh.k), x, CUDA_R_16BF,
                     static_cast<int>(sh.k), &beta, out, CUDA_R_16BF, static_cast<int>(w_rows), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      });
      double gemv_us = 0;
      if (n <= 4) {
        gemv_us = median_launch_us(reps, s, [&] {
          launch_gemv(ElemType::BF16, static_cast<int>(n), x, sh.k * 2, weights(), sh.k * 2, w_rows, sh.k, nullptr,
                      false, out, w_rows * 2, s, gemv_config(w_rows, sh.k));
        });
      }
      std::string best_name;
      double best_us = 1e30, current_us = 0;
      for (size_t ci = 0; ci < cands.size(); ++ci) {
        const Candidate& c = cands[ci];
        if (sh.gated && !c.gated_ok) continue;
        if (n > 16 && c.name.rfind("rows", 0) == 0) continue;  // no weight reuse across row tiles
        const double us = median_launch_us(reps, s, [&] {
          mg::GemmArgs g;
          g.n_rows = n;
          g.a_base = x;
          g.a_stride = sh.k * 2;
          const char* wc = weights();
          g.w0 = MoeWeightView{wc, 0, sh.k * 2};
          g.w1 = sh.gated ? MoeWeightView{wc + sh.m * sh.k * 2, 0, sh.k * 2} : g.w0;
          g.n_cols = sh.m;
          g.k = sh.k;
          g.out = out;
          g.out_stride = sh.m * 2;
          c.launch(g, sh.gated, s);
        });
        check(cudaGetLastError(), c.name.c_str());
        // What cuda_linear_mma.cu picks for this row count today.
        // cuda_linear_mma.cu's tiles before the sweep (16 x 32 x 128 up to 16 rows).
        const size_t current = n <= 16 ? 0 : n <= 64 ? 1 : (sh.gated || n <= 256) ? 2 : 3;
        if (ci == current) current_us = us;
        if (us < best_us) {
          best_us = us;
          best_name = c.name;
        }
        std::fprintf(stderr, "%s n=%lld %s: %.1f us\n", sh.name, static_cast<long long>(n), c.name.c_str(), us);
      }
      const double flops = 2.0 * double(n) * double(w_rows) * double(sh.k);
      char gemv[32] = "-";
      if (gemv_us > 0) std::snprintf(gemv, sizeof gemv, "%.1f", gemv_us);
      std::printf("| %s | %lld | %.1f | %s | %s | %.1f | %.0f | %.0f | %.2f | %.1f |\n", sh.name,
                  static_cast<long long>(n), cublas_us, gemv, best_name.c_str(), best_us, flops / best_us / 1e6,
                  w_bytes / best_us / 1e3, cublas_us / best_us, current_us);
      std::fflush(stdout);
    }
  }
  return 0;
}
