// Decode-sized matrix-vector products on the GPU (the weight stream of a
// batch-1 decode step): GB/s of weights read for the Llama-3-8B projection
// shapes (fused QKV, o, fused gate-up, down, LM head) and the 2,048-wide ones
// of the MoE models under every work partition of the gemv kernel (each
// launch on another copy of the weights, so that none comes from L2), against
// the device-to-device copy rate measured in the same run (bytes read +
// written), so the launcher's choice (gemv_config) can be checked and tuned.
// Usage: bench_gemv_cuda [reps=50] | bench_gemv_cuda profile M K N STAGES CODES
#include <fmt/format.h>

#include <cstdio>

#ifdef DEEPINFER_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "cuda_bench.h"

using namespace deepinfer::cuda;

using deepinfer::bench::check;
using deepinfer::bench::median_launch_ms;

// `profile M K N STAGES CODES`: five launches of the FP8 gemv of that shape
// and configuration, then five of the bf16 gemv, and nothing else (for a
// profiler's --launch-skip / --launch-count).
int profile(char** argv) {
  const int64_t m = std::atoll(argv[2]), k = std::atoll(argv[3]);
  const int n = std::atoi(argv[4]);
  const GemvF8Config c{std::atoi(argv[5]), std::atoi(argv[6])};
  if (m < 1 || k < 64 || k % 64 != 0 || n < 1 || n > kGemvF8MaxRows) {
    fmt::print(stderr, "profile: need M >= 1, K a multiple of 64, 1 <= N <= {}\n", kGemvF8MaxRows);
    return 2;
  }
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  const size_t w_bytes = size_t(m) * size_t(k) * 2;
  char *w = nullptr, *x = nullptr, *out = nullptr;
  check(cudaMalloc(&w, 5 * w_bytes), "malloc");
  check(cudaMalloc(&x, size_t(n) * k * 2), "malloc");
  check(cudaMalloc(&out, size_t(n) * m * 4), "malloc");
  check(cudaMemset(w, 0, 5 * w_bytes), "memset");
  check(cudaMemset(x, 0, size_t(n) * k * 2), "memset");
  for (int i = 0; i < 5; ++i) {
    launch_gemv_f8(ElemType::BF16, n, x, k * 2, w + i * w_bytes, k + k / 16, m, k, nullptr, false, out, m * 2, s, c);
  }
  for (int i = 0; i < 5; ++i) {
    launch_gemv(ElemType::BF16, n, x, k * 2, w + i * w_bytes, k * 2, m, k, nullptr, false, out, m * 2, s,
                gemv_config(m, k));
  }
  check(cudaStreamSynchronize(s), "profile run");
  fmt::print("profile: {} x {}, {} rows, FP8 config {},{} then bf16\n", m, k, n, c.stages, c.stage_codes);
  return 0;
}

int main(int argc, char** argv) {
  int count = 0;
  if (argc >= 7 && std::strcmp(argv[1], "profile") == 0) {
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return 0;
    return profile(argv);
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  // The largest weight (LM head 128256 x 4096 bf16, 1 GB) plus x and out; the
  // weights are garbage bytes: only the time matters here.
  const size_t max_w = size_t{128256} * 4096 * 2;
  char *w = nullptr, *x = nullptr, *out = nullptr, *copy_dst = nullptr;
  check(cudaMalloc(&w, max_w), "malloc");
  check(cudaMalloc(&copy_dst, max_w), "malloc");
  check(cudaMalloc(&x, 64 * 14336 * 2), "malloc");
  check(cudaMalloc(&out, 64 * 128256 * 4), "malloc");
  check(cudaMemset(w, 0, max_w), "memset");
  check(cudaMemset(x, 0, 64 * 14336 * 2), "memset");
  const double copy_ms =
      median_launch_ms(reps / 5 + 3, s, [&] { cudaMemcpyAsync(copy_dst, w, max_w, cudaMemcpyDeviceToDevice, s); });
  const double copy_gbs = 2.0 * max_w / copy_ms / 1e6;
  fmt::print("device copy: {:.0f} GB/s (read + write)\n", copy_gbs);

  struct Shape {
    const char* name;
    int64_t m, k;
  };
  const Shape shapes[] = {{"qkv fused", 6144, 4096},   {"q / o", 4096, 4096},     {"k or v", 1024, 4096},
                          {"gate-up fused", 28672, 4096}, {"gate or up", 14336, 4096}, {"down", 4096, 14336},
                          {"lm head", 128256, 4096},
                          // Hidden size 2,048 (Qwen3-30B-A3B, DeepSeek-V2-Lite): short rows.
                          {"qwen3-moe qkv", 5120, 2048}, {"qwen3-moe o", 2048, 4096}, {"v2-lite q", 3072, 2048},
                          {"v2-lite kv_a", 576, 2048},   {"qwen3-moe lm head", 151936, 2048},
                          {"v2-lite lm head", 102400, 2048}};
  fmt::print("| shape | m x k | n | chosen (wpr/unroll) | chosen GB/s | best (wpr/unroll) | best GB/s | best / copy |\n");
  fmt::print("|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    for (int n : {1, 4}) {
      const double bytes = double(sh.m) * sh.k * 2;
      // Each launch reads another copy of the weights in the 1 GB buffer
      // (the smaller matrices would otherwise come from L2).
      const size_t span = (static_cast<size_t>(bytes) + 4095) / 4096 * 4096;
      const size_t copies = std::max<size_t>(1, max_w / span);
      size_t next = 0;
      auto run = [&](GemvConfig c) {
        return median_launch_ms(reps, s, [&] {
          const char* wc = w + (next++ % copies) * span;
          launch_gemv(ElemType::BF16, n, x, sh.k * 2, wc, sh.k * 2, sh.m, sh.k, nullptr, false, out, sh.m * 2, s, c);
        });
      };
      const GemvConfig chosen = gemv_config(sh.m, sh.k);
      const double chosen_ms = run(chosen);
      GemvConfig best = chosen;
      double best_ms = chosen_ms;
      for (int wpr : {1, 2, 4, 8}) {
        for (int u : {4, 8}) {
          const double ms = run(GemvConfig{wpr, u});
          if (ms < best_ms) {
            best_ms = ms;
            best = GemvConfig{wpr, u};
          }
        }
      }
      check(cudaGetLastError(), "gemv launch");
      fmt::print("| {} | {} x {} | {} | {}/{} | {:.0f} | {}/{} | {:.0f} | {:.2f} |\n", sh.name, sh.m, sh.k, n,
                 chosen.warps_per_row, chosen.unroll, bytes / chosen_ms / 1e6, best.warps_per_row, best.unroll,
                 bytes / best_ms / 1e6, bytes / best_ms / 1e6 / copy_gbs);
    }
  }

  // FP8 row-block weights (split rows: k codes, then k / 64 f32 scales): the
  // register kernel (stages 0) against each shared-memory configuration
  // (1024 x 4 only up to 8 rows of x), for 1 to 64 rows of x; GB/s of weight
  // bytes (codes + scales).
  fmt::print("\nFP8 weights (gemv_f8): GB/s of codes + scales\n\n");
  // The register kernel with groups of 2 and 4 blocks (128 / 256 codes); the
  // shared-memory configurations; the launcher's default, also with f16
  // activations (three instructions fewer per pair of codes: what the e4m3 ->
  // bf16 widening costs).
  const GemvF8Config f8_configs[] = {{0, 128}, {0, 256}, {4, 512}, {6, 512}, {4, 1024}};
  fmt::print("| shape | m x k | n | reg 128 | reg 256 | 512x4 | 512x6 | 1024x4 | default | f16 x | best / copy |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    if (sh.m > 65536) continue;  // the LM heads stay bf16
    const int64_t row_bytes = sh.k + sh.k / 16;
    const double bytes = double(sh.m) * row_bytes;
    for (int n : {1, 4, 8, 16, 32, 64}) {
      // Each launch reads another copy of the weights in the 1 GB buffer:
      // these matrices (18-125 MB) would otherwise come partly from L2.
      const size_t span = (static_cast<size_t>(bytes) + 4095) / 4096 * 4096;
      const size_t copies = max_w / span;
      size_t next = 0;
      auto run = [&](GemvF8Config c, ElemType xt = ElemType::BF16) {
        return median_launch_ms(reps, s, [&] {
          const char* wc = w + (next++ % copies) * span;
          launch_gemv_f8(xt, n, x, sh.k * 2, wc, row_bytes, sh.m, sh.k, nullptr, false, out, sh.m * 2, s, c);
        });
      };
      std::string cells;
      double best_gbs = 0;
      for (GemvF8Config c : f8_configs) {
        if (c.stage_codes == 1024 && n > 8) {
          cells += " - |";
          continue;
        }
        const double gbs = bytes / run(c) / 1e6;
        best_gbs = std::max(best_gbs, gbs);
        cells += fmt::format(" {:.0f} |", gbs);
      }
      const double default_gbs = bytes / run(GemvF8Config{}) / 1e6;
      const double f16_gbs = bytes / run(GemvF8Config{}, ElemType::F16) / 1e6;
      check(cudaGetLastError(), "gemv_f8 launch");
      fmt::print("| {} | {} x {} | {} |{} {:.0f} | {:.0f} | {:.2f} |\n", sh.name, sh.m, sh.k, n, cells, default_gbs,
                 f16_gbs, best_gbs / copy_gbs);
    }
  }
  return 0;
}

#else

int main() {
  std::printf("no CUDA: built without the CUDA backend\n");
  return 0;
}

#endif
