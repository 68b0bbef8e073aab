// Backend::sample at decode batch size: 256 rows x 128,256 vocabulary (Llama 3),
// per parameter mix, time per call on the device (median of repeats), next to
// the cost of what it replaces: copying the logits to the host.
//   bench_sampling [rows] [vocab] [iterations]
// Runs on CUDA when a GPU is available, else on the CPU backend.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "ops/ops.h"

namespace {

using deepinfer::Backend;
using deepinfer::SamplingRowParams;

SamplingRowParams params(float temperature, int32_t top_k, float top_p) {
  SamplingRowParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

template <typename Fn>
double median_ms(Backend& backend, int iterations, Fn&& fn) {
  fn();
  backend.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    backend.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace deepinfer;
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 256;
  const int64_t vocab = argc > 2 ? std::atoll(argv[2]) : 128256;
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 20;
  std::unique_ptr<Backend> backend;
  try {
    backend = create_backend(DeviceType::CUDA);
  } catch (const Error& e) {
    fmt::print("no CUDA backend ({}); timing the CPU backend\n", e.what());
    backend = create_backend(DeviceType::CPU);
  }
  fmt::print("backend {}, {} rows x {} vocab, median of {} calls\n", backend->name(), rows, vocab, iterations);

  // Two kinds of rows: peaked like a language model's (a few tokens far
  // ahead: small nuclei) and flat (uniform in [-4, 4]: nuclei of most of the
  // vocabulary, the worst case for top-p).
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<float> flat(-4.0f, 4.0f);
  std::vector<float> peaked(static_cast<size_t>(rows * vocab)), uniform(peaked.size());
  for (float& x : peaked) x = normal(gen);
  for (int64_t r = 0; r < rows; ++r) {
    for (int j = 0; j < 8; ++j) peaked[static_cast<size_t>(r * vocab + (r * 7919 + j * 104729) % vocab)] += 12.0f - j;
  }
  for (float& x : uniform) x = flat(gen);

  Buffer logits(*backend, peaked.size() * sizeof(float));
  Buffer params_buf(*backend, static_cast<size_t>(rows) * sizeof(SamplingRowParams));
  Buffer tokens(*backend, static_cast<size_t>(rows) * sizeof(int32_t));
  const Tensor logits_t = logits.view(DType::F32, {rows, vocab});
  const Tensor params_t = params_buf.view(DType::U8, {rows, static_cast<int64_t>(sizeof(SamplingRowParams))});
  const Tensor tokens_t = tokens.view(DType::I32, {rows});

  struct Mix {
    const char* name;
    std::vector<SamplingRowParams> cycle;
  };
  const Mix mixes[] = {
      {"greedy", {params(0.0f, 0, 1.0f)}},
      {"temperature 1", {params(1.0f, 0, 1.0f)}},
      {"top-k 50 + top-p 0.9", {params(0.8f, 50, 0.9f)}},
      {"top-p 0.9", {params(1.0f, 0, 0.9f)}},
      {"half greedy, half top-k 50/top-p 0.9", {params(0.0f, 0, 1.0f), params(0.8f, 50, 0.9f)}},
  };
  std::vector<float> host(peaked.size());
  for (const auto* data : {&peaked, &uniform}) {
    backend->copy(logits_t, Tensor(const_cast<float*>(data->data()), DType::F32, {rows, vocab}));
    const char* kind = data == &peaked ? "peaked" : "flat";
    const double copy_ms = median_ms(*backend, iterations, [&] {
      backend->copy(Tensor(host.data(), DType::F32, {rows, vocab}), logits_t);
    });
    fmt::print("{:6} logits, copy of all rows to the host: {:8.3f} ms\n", kind, copy_ms);
    for (const Mix& mix : mixes) {
      std::vector<SamplingRowParams> p(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        p[static_cast<size_t>(r)] = mix.cycle[static_cast<size_t>(r) % mix.cycle.size()];
        p[static_cast<size_t>(r)].seed = static_cast<uint64_t>(r) + 1;
        p[static_cast<size_t>(r)].position = 5;
      }
      backend->copy(params_t, Tensor(p.data(), DType::U8, {rows, static_cast<int64_t>(sizeof(SamplingRowParams))}));
      const double ms = median_ms(*backend, iterations, [&] { ops::sample(*backend, logits_t, params_t, tokens_t); });
      fmt::print("{:6} logits, {:38}: {:8.3f} ms per call ({:.1f} us per row)\n", kind, mix.name, ms,
                 ms * 1000.0 / static_cast<double>(rows));
    }
  }
  return 0;
}
