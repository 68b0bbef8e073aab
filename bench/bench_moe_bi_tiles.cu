// The batch-invariant mode's MoE experts at decode batches (1 to 8 tokens):
// its grouped gate/up and down GEMMs (cuda_mma_gemm.cuh) under several tile
// configurations, at the Qwen3-30B-A3B shape (hidden 2048, 128 experts, top
// 8, expert ffn 768, bf16). Tiles change only what is staged together, never
// a row's order of accumulation (every output adds its k16 steps in order),
// so any of them gives the mode's bits; this finds the fastest for few rows,
// where a 16-row tile holds one or two real rows and the grid is small.
// Each token chooses 8 distinct experts (drawn at random); the row table is
// built on the host as cuda_moe.cu's index kernel lays it out (each expert's
// rows padded to 16). Four layers' weights are cycled so L2 does not serve
// them. Reported: microseconds for the two GEMMs, and the expert bytes read
// (each chosen expert's three matrices once) per second.
// Usage: bench_moe_bi_tiles [reps=50]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_mma_gemm.cuh"
#include "cuda_bench.h"

using namespace deepinfer::cuda;
namespace mg = deepinfer::cuda::mma_gemm;

namespace {

using deepinfer::bench::check;
using deepinfer::bench::median_launch_us;

constexpr int64_t kHidden = 2048, kExperts = 128, kFfn = 768;
constexpr int kTopK = 8, kLayers = 4, kBM = 16;

struct Config {
  std::string name;
  std::function<void(const mg::GemmArgs& up, const mg::GemmArgs& down, int64_t tiles, cudaStream_t)> launch;
};

template <int BN, int BK, int WN, int S>
Config config() {
  using C = mg::TileConfig<kBM, BN, BK, 1, WN, S>;
  Config c;
  char name[64];
  std::snprintf(name, sizeof name, "16x%dx%d w1x%d s%d", BN, BK, WN, S);
  c.name = name;
  c.launch = [](const mg::GemmArgs& up, const mg::GemmArgs& down, int64_t tiles, cudaStream_t s) {
    mg::launch_mma_gemm<__nv_bfloat16, C, mg::GemmOut::GatedAct, true, false>(up, tiles, s);
    mg::launch_mma_gemm<__nv_bfloat16, C, mg::GemmOut::F32, false, false>(down, tiles, s);
  };
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  const size_t stack = size_t(kExperts) * kFfn * kHidden * 2;  // one of gate, up, down
  std::vector<char*> gate(kLayers), up(kLayers), down(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    for (char** p : {&gate[l], &up[l], &down[l]}) {
      check(cudaMalloc(p, stack), "malloc");
      check(cudaMemset(*p, 0, stack), "memset");
    }
  }
  const int64_t max_tokens = 8, max_rows = max_tokens * kTopK;
  const int64_t max_tiles = (max_rows + kBM - 1) / kBM + std::min<int64_t>(kExperts, max_rows);
  char *x, *act, *y;
  int32_t *tile_expert, *row_token;
  check(cudaMalloc(&x, size_t(max_tokens) * kHidden * 2), "malloc");
  check(cudaMemset(x, 0, size_t(max_tokens) * kHidden * 2), "memset");
  check(cudaMalloc(&act, size_t(max_tiles) * kBM * kFfn * 2), "malloc");
  check(cudaMalloc(&y, size_t(max_tiles) * kBM * kHidden * 4), "malloc");
  check(cudaMalloc(&tile_expert, size_t(max_tiles) * 4), "malloc");
  check(cudaMalloc(&row_token, size_t(max_tiles) * kBM * 4), "malloc");

  const std::vector<Config> configs = {
      config<32, 128, 2, 4>(),  // DecodeTiles: the mode's choice at 16-row tiles
      config<16, 128, 1, 4>(), config<16, 128, 1, 8>(), config<32, 128, 2, 8>(),
      config<16, 256, 1, 4>(), config<64, 128, 4, 4>(), config<32, 64, 2, 8>(),
  };
  std::mt19937 gen(5);
  std::printf("| tokens | experts | config | us (up + down) | GB/s of expert weights |\n|---|---|---|---|---|\n");
  for (const int64_t n : {1, 2, 4, 8}) {
    // Distinct experts per token; rows laid out by expert, each padded to 16.
    std::vector<std::vector<int32_t>> rows_of(kExperts);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> all(kExperts);
      for (int e = 0; e < kExperts; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), gen);
      for (int j = 0; j < kTopK; ++j) rows_of[all[j]].push_back(static_cast<int32_t>(t));
    }
    std::vector<int32_t> h_tile(max_tiles, -1), h_row(max_tiles * kBM, -1);
    int64_t tile = 0, used = 0;
    for (int e = 0; e < kExperts; ++e) {
      const auto& r = rows_of[e];
      if (r.empty()) continue;
      ++used;
      for (size_t i = 0; i < r.size(); i += kBM, ++tile) {
        h_tile[tile] = e;
        for (size_t j = i; j < std::min(r.size(), i + kBM); ++j) h_row[tile * kBM + (j - i)] = r[j];
      }
    }
    check(cudaMemcpy(tile_expert, h_tile.data(), h_tile.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(row_token, h_row.data(), h_row.size() * 4, cudaMemcpyHostToDevice), "upload");
    const int64_t tiles = (n * kTopK + kBM - 1) / kBM + std::min<int64_t>(kExperts, n * kTopK);  // the launcher's bound
    const double bytes = double(used) * 3.0 * kFfn * kHidden * 2.0;
    for (const Config& c : configs) {
      int layer = 0;
      const double us = median_launch_us(reps, s, [&] {
        mg::GemmArgs u;
        u.tile_expert = tile_expert;
        u.row_token = row_token;
        u.a_base = x;
        u.a_stride = kHidden * 2;
        u.w0 = MoeWeightView{gate[layer], kFfn * kHidden * 2, kHidden * 2};
        u.w1 = MoeWeightView{up[layer], kFfn * kHidden * 2, kHidden * 2};
        u.n_cols = kFfn;
        u.k = kHidden;
        u.out = act;
        u.out_stride = kFfn * 2;
        mg::GemmArgs d;
        d.tile_expert = tile_expert;
        d.a_base = act;
        d.a_stride = kFfn * 2;
        d.w0 = MoeWeightView{down[layer], kHidden * kFfn * 2, kFfn * 2};
        d.w1 = d.w0;
        d.n_cols = kHidden;
        d.k = kFfn;
        d.out = y;
        d.out_stride = kHidden * 4;
        c.launch(u, d, tiles, s);
        layer = (layer + 1) % kLayers;
      });
      check(cudaGetLastError(), c.name.c_str());
      std::printf("| %lld | %lld | %s | %.1f | %.0f |\n", static_cast<long long>(n), static_cast<long long>(used),
                  c.name.c_str(), us, bytes / us / 1e3);
      std::fflush(stdout);
    }
  }
  return 0;
}
