// CUDA MoE layer micro-benchmark at the Qwen3-30B-A3B shape (hidden 2048, 128
// experts, top 8, expert ffn 768, bf16): route + expert kernels per step,
// captured in a CUDA graph as the runner does for decode. Decode (1 to 8
// tokens: the gemv path of cuda_moe_decode.cu; 16 and 256: the grouped GEMMs)
// is memory-bound and reported as the bytes of expert weights read (each
// distinct chosen expert's three matrices once) over the time of the experts
// alone, against a device-to-device copy measured in the same run (bytes read
// plus bytes written per second: the HBM traffic a pure stream reaches); prefill (4096 tokens) in TFLOP/s (2 * tokens * top_k * 3 *
// hidden * ffn). Four layers' weights are cycled so that the 50 MB L2 does
// not serve them.
// With "bi", the batch-invariant mode's kernels (DEEPINFER_BATCH_INVARIANT=1:
// the grouped GEMMs at every batch, where the default takes the gemv path up
// to 64 slots).
// Usage: bench_moe_cuda [reps=200] [bi]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "ops/ops.h"

using namespace deepinfer;

namespace {

constexpr int64_t kHidden = 2048, kExperts = 128, kFfn = 768;
constexpr int kTopK = 8, kLayers = 4;

struct Layer {
  Buffer gate, up, down;
  MoeExpertWeights w;
};

Buffer random_bf16(Backend& b, size_t count, float scale, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<uint16_t> h(count);
  for (auto& v : h) v = f32_to_bf16(dist(gen));
  Buffer buf(b, count * 2);
  b.copy(buf.view(DType::BF16, {static_cast<int64_t>(count)}), Tensor(h.data(), DType::BF16, {static_cast<int64_t>(count)}));
  return buf;
}

// Bytes read and written per second by a device-to-device copy of 1 GiB (median of 5).
double copy_bandwidth(Backend& b) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  Buffer src(b, kBytes), dst(b, kBytes);
  Tensor s = src.view(DType::U8, {kBytes}), d = dst.view(DType::U8, {kBytes});
  b.copy(d, s);
  b.synchronize();
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    b.copy(d, s);
    b.synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(kBytes) / seconds[2];
}

void run_case(Backend& b, std::vector<Layer>& layers, int64_t n, int reps, double copy_bw, std::mt19937& gen) {
  Buffer x = random_bf16(b, static_cast<size_t>(n * kHidden), 1.0f, gen);
  Buffer logits_buf(b, static_cast<size_t>(n * kExperts) * 4);
  Buffer ids_buf(b, static_cast<size_t>(n * kTopK) * 4), w_buf(b, static_cast<size_t>(n * kTopK) * 4);
  Buffer out_buf(b, static_cast<size_t>(n * kHidden) * 2);
  Tensor xt = x.view(DType::BF16, {n, kHidden}), out = out_buf.view(DType::BF16, {n, kHidden});
  Tensor logits = logits_buf.view(DType::F32, {n, kExperts});
  Tensor ids = ids_buf.view(DType::I32, {n, kTopK}), wts = w_buf.view(DType::F32, {n, kTopK});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> hl(static_cast<size_t>(n * kExperts));
  for (auto& v : hl) v = normal(gen);
  b.copy(logits, Tensor(hl.data(), DType::F32, {n, kExperts}));
  const size_t ws_bytes = ops::moe_workspace_bytes(b, n, kTopK, layers[0].w);
  Buffer ws_buf(b, ws_bytes);
  Tensor ws = ws_buf.view(DType::U8, {static_cast<int64_t>(ws_bytes)});
  MoeRouteParams p;
  p.top_k = kTopK;
  p.renormalize = true;

  auto step = [&](const Layer& l) {
    ops::moe_route(b, logits, p, ids, wts);
    ops::moe_experts(b, xt, ids, wts, l.w, Activation::Silu, false, ws, out);
  };
  for (const Layer& l : layers) step(l);
  b.synchronize();
  std::vector<int32_t> hid(static_cast<size_t>(n * kTopK));
  b.copy(Tensor(hid.data(), DType::I32, {n, kTopK}), ids);
  const std::set<int32_t> distinct(hid.begin(), hid.end());

  // Seconds per replay of one graph per layer, cycling the layers.
  auto time_graphs = [&](const std::function<void(const Layer&)>& body) {
    std::vector<std::unique_ptr<OpGraph>> graphs;
    for (const Layer& l : layers) {
      b.begin_capture();
      body(l);
      graphs.push_back(b.end_capture());
    }
    for (auto& g : graphs) g->replay();
    b.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) graphs[static_cast<size_t>(r) % graphs.size()]->replay();
    b.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(reps);
  };
  const double seconds = time_graphs(step);
  const double route_seconds = time_graphs([&](const Layer&) { ops::moe_route(b, logits, p, ids, wts); });
  // The routing above filled ids and weights; the experts alone replay on them.
  const double expert_seconds = time_graphs(
      [&](const Layer& l) { ops::moe_experts(b, xt, ids, wts, l.w, Activation::Silu, false, ws, out); });

  const double bytes = static_cast<double>(distinct.size()) * 3.0 * kFfn * kHidden * 2.0;
  const double flops = 2.0 * static_cast<double>(n) * kTopK * 3.0 * kHidden * kFfn;
  fmt::print("tokens {:5d}: {:8.1f} us/layer (route {:5.1f}, experts {:8.1f})  experts read {:3d}  experts alone {:5.0f} GB/s "
             "= {:5.1f}% of copy, with route {:5.1f}%  {:6.1f} TFLOP/s  workspace {:.1f} MiB\n",
             n, seconds * 1e6, route_seconds * 1e6, expert_seconds * 1e6, distinct.size(), bytes / expert_seconds / 1e9,
             100.0 * bytes / expert_seconds / copy_bw, 100.0 * bytes / seconds / copy_bw, flops / seconds / 1e12,
             ws_bytes / 1048576.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  const bool invariant = argc > 2 && std::string(argv[2]) == "bi";
  std::unique_ptr<Backend> b;
  try {
    BackendOptions options;
    options.batch_invariant = invariant;
    b = create_backend(DeviceType::CUDA, options);
  } catch (const Error& e) {
    fmt::print("bench_moe_cuda: no CUDA backend ({}); nothing to measure\n", e.what());
    return 0;
  }
  std::mt19937 gen(7);
  std::vector<Layer> layers(kLayers);
  for (Layer& l : layers) {
    const size_t count = static_cast<size_t>(kExperts * kFfn * kHidden);
    l.gate = random_bf16(*b, count, 0.03f, gen);
    l.up = random_bf16(*b, count, 0.03f, gen);
    l.down = random_bf16(*b, count, 0.03f, gen);
    l.w.gate = l.gate.view(DType::BF16, {kExperts, kFfn, kHidden});
    l.w.up = l.up.view(DType::BF16, {kExperts, kFfn, kHidden});
    l.w.down = l.down.view(DType::BF16, {kExperts, kHidden, kFfn});
  }
  const double copy_bw = copy_bandwidth(*b);
  fmt::print("MoE layer, hidden {} experts {} top {} ffn {}, bf16, route + experts per step (CUDA graph){}; "
             "device copy {:.2f} TB/s (read + write)\n",
             kHidden, kExperts, kTopK, kFfn, invariant ? ", batch-invariant mode" : "", copy_bw / 1e12);
  for (int64_t n : {1, 2, 4, 8, 16, 256}) run_case(*b, layers, n, reps, copy_bw, gen);
  run_case(*b, layers, 4096, std::max(4, reps / 20), copy_bw, gen);
  return 0;
}
