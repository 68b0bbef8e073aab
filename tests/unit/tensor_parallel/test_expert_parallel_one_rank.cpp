// ExpertParallelMoe on one rank of each backend this build has (the CPU; a
// CUDA device with a one-rank NCCL group where there is one): its dispatch
// (routing read back, rows gathered in send order, the all-to-alls, the
// owners' experts weighted there, the outputs put back in choice order)
// against the plain MoE layer on the same weights and inputs, with and
// without a gated shared expert, before and after a re-placement that gives
// hot experts a second slot. On one rank every all-to-all is a copy to
// itself; several ranks are covered by test_tensor_parallel.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "dist/device_communicator.h"
#include "dist/gloo_communicator.h"
#include "model/expert_parallel.h"
#include "model/layers/moe_layer.h"
#include "moe/eplb.h"
#include "ops/ops.h"

namespace deepinfer {
namespace {

constexpr int64_t kExperts = 8, kHidden = 64, kFfn = 32, kTopK = 2;

struct Placed {
  Buffer buffer;
  Tensor t;
};

// Values placed on the backend as `dtype` (f32 or bf16).
Placed place(Backend& backend, DType dtype, const std::vector<int64_t>& shape, const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  const void* src = values.data();
  if (dtype == DType::BF16) {
    bits.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    src = bits.data();
  }
  Placed p{Buffer(backend, row_bytes(dtype, static_cast<int64_t>(values.size()))), {}};
  p.t = Tensor(p.buffer.data(), dtype, std::span<const int64_t>(shape.data(), shape.size()), backend.device());
  backend.copy(p.t, Tensor(const_cast<void*>(src), dtype, std::span<const int64_t>(shape.data(), shape.size())));
  return p;
}

std::vector<float> read_f32(Backend& backend, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  backend.copy(Tensor(v.data(), DType::F32, {t.numel()}), t.reshape({t.numel()}));
  backend.synchronize();
  return v;
}

std::vector<float> random_values(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Backends {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GlooCommunicator> bootstrap;
  std::unique_ptr<Communicator> device_group;  // NCCL on a GPU
  Communicator* comm = nullptr;
};

Backends open(DeviceType type) {
  Backends b;
  try {
    b.backend = create_backend(type);
  } catch (const Error&) {
    return b;
  }
  b.bootstrap = std::make_unique<GlooCommunicator>(nullptr, "bootstrap", 0, 1, std::chrono::seconds(30));
  b.comm = b.bootstrap.get();
  if (type != DeviceType::CPU) {
    DistConfig config;
    config.timeout = std::chrono::seconds(30);
    b.device_group = make_device_communicator(*b.backend, config, *b.bootstrap, "ep");
    b.comm = b.device_group.get();
  }
  return b;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(got[i]) - want[i]));
    max_abs = std::max(max_abs, std::abs(double(want[i])));
  }
  ASSERT_GT(max_abs, 0.0) << what;
  EXPECT_LE(max_diff, tol * max_abs) << what << ": largest difference " << max_diff << " of " << max_abs;
}

void run_case(DeviceType type, bool shared) {
  Backends b = open(type);
  if (!b.backend) GTEST_SKIP() << "no " << (type == DeviceType::CPU ? "CPU" : "CUDA") << " backend";
  Backend& be = *b.backend;
  // A GPU holds bf16 weights and activations; the CPU f32.
  const DType wt = type == DeviceType::CPU ? DType::F32 : DType::BF16;
  const DType at = be.activation_dtype();
  std::mt19937 rng(7);
  const std::vector<float> gate = random_values(rng, kExperts * kFfn * kHidden, 0.2f);
  const std::vector<float> up = random_values(rng, kExperts * kFfn * kHidden, 0.2f);
  const std::vector<float> down = random_values(rng, kExperts * kHidden * kFfn, 0.2f);
  // The checkpoint's stacks stay in host memory, as a memory-mapped file's.
  std::vector<uint16_t> host_bits[3];
  MoeExpertWeights host;
  const std::vector<float>* values[3] = {&gate, &up, &down};
  Tensor* host_views[3] = {&host.gate, &host.up, &host.down};
  const std::vector<int64_t> shapes[3] = {{kExperts, kFfn, kHidden}, {kExperts, kFfn, kHidden}, {kExperts, kHidden, kFfn}};
  for (int i = 0; i < 3; ++i) {
    const std::vector<int64_t>& s = shapes[i];
    if (wt == DType::F32) {
      *host_views[i] = Tensor(const_cast<float*>(values[i]->data()), DType::F32, std::span<const int64_t>(s.data(), 3));
    } else {
      host_bits[i].resize(values[i]->size());
      for (size_t j = 0; j < values[i]->size(); ++j) host_bits[i][j] = f32_to_bf16((*values[i])[j]);
      *host_views[i] = Tensor(host_bits[i].data(), DType::BF16, std::span<const int64_t>(s.data(), 3));
    }
  }
  Placed dgate = place(be, wt, shapes[0], gate), dup = place(be, wt, shapes[1], up), ddown = place(be, wt, shapes[2], down);
  Placed router = place(be, wt, {kExperts, kHidden}, random_values(rng, kExperts * kHidden, 0.5f));
  layers::MoeWeights w;
  w.router = router.t;
  w.experts = {dgate.t, dup.t, ddown.t, {}, {}, {}};
  Placed sgate, sup, sdown, sg;
  if (shared) {
    sgate = place(be, wt, {1, kFfn, kHidden}, random_values(rng, kFfn * kHidden, 0.2f));
    sup = place(be, wt, {1, kFfn, kHidden}, random_values(rng, kFfn * kHidden, 0.2f));
    sdown = place(be, wt, {1, kHidden, kFfn}, random_values(rng, kHidden * kFfn, 0.2f));
    sg = place(be, wt, {1, kHidden}, random_values(rng, kHidden, 0.5f));
    w.shared = {sgate.t, sup.t, sdown.t, {}, {}, {}};
    w.shared_gate = sg.t;
  }
  MoeRouteParams route;
  route.top_k = kTopK;
  route.renormalize = true;

  ExpertParallelMoe ep(be, *b.comm, nullptr);
  ep.add_layer(host, moe::contiguous_placement(kExperts, 1));
  layers::MoeWeights ep_w = w;
  ep_w.experts = {};

  for (int64_t n : {1, 5, 33}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    Placed h = place(be, at, {n, kHidden}, random_values(rng, static_cast<size_t>(n * kHidden), 1.0f));
    // The plain layer.
    const size_t ws = std::max(ops::moe_workspace_bytes(be, n, kTopK, w.experts),
                               shared ? ops::moe_workspace_bytes(be, n, 1, w.shared) : size_t{0});
    Buffer scratch_buf(be, static_cast<size_t>(n) * (kExperts * 4 + kTopK * 8 + 12) + ws + 256);
    char* at_ptr = static_cast<char*>(scratch_buf.data());
    auto carve = [&](DType d, std::initializer_list<int64_t> shape) {
      Tensor t(at_ptr, d, shape, be.device());
      at_ptr += (t.nbytes() + 15) / 16 * 16;
      return t;
    };
    layers::MoeScratch s;
    s.router_logits = carve(DType::F32, {n, kExperts});
    s.expert_ids = carve(DType::I32, {n, kTopK});
    s.expert_weights = carve(DType::F32, {n, kTopK});
    s.shared_logits = carve(DType::F32, {n, 1});
    s.shared_ids = carve(DType::I32, {n, 1});
    s.shared_weights = carve(DType::F32, {n, 1});
    s.workspace = carve(DType::U8, {static_cast<int64_t>(std::max<size_t>(ws, 1))});
    Placed want_out = place(be, at, {n, kHidden}, std::vector<float>(static_cast<size_t>(n * kHidden), 0.0f));
    layers::moe_layer(be, w, route, Activation::Silu, h.t, s, want_out.t);
    const std::vector<float> want = read_f32(be, want_out.t);

    Placed got_out = place(be, at, {n, kHidden}, std::vector<float>(static_cast<size_t>(n * kHidden), 0.0f));
    std::vector<int32_t> zero_counts(kExperts, 0);
    Buffer counts_buf(be, kExperts * sizeof(int32_t));
    const Tensor counts = counts_buf.view(DType::I32, {kExperts});
    be.copy(counts, Tensor(zero_counts.data(), DType::I32, {kExperts}));
    ep.forward(0, ep_w, route, Activation::Silu, h.t, got_out.t, counts, Tensor());
    // The CPU computes each row alike in both; a GPU's kernels may round in
    // another order (bf16 outputs).
    const double tol = type == DeviceType::CPU ? 1e-5 : 2e-2;
    expect_close(read_f32(be, got_out.t), want, tol, "one rank");
    std::vector<int32_t> got_counts(kExperts);
    be.copy(Tensor(got_counts.data(), DType::I32, {kExperts}), counts);
    be.synchronize();
    int64_t total = 0;
    for (int32_t c : got_counts) total += c;
    EXPECT_EQ(total, n * kTopK) << "every (token, choice) counted once";

    // Expert 3 hot: it gets a second slot; the weights move between slots.
    std::vector<double> load(kExperts, 1.0);
    load[3] = 50.0;
    ep.set_placement(0, moe::place_experts_global(load, 1, 1));
    ASSERT_EQ(ep.find_placement(0)->num_physical(), kExperts + 1);
    Placed moved_out = place(be, at, {n, kHidden}, std::vector<float>(static_cast<size_t>(n * kHidden), 0.0f));
    ep.forward(0, ep_w, route, Activation::Silu, h.t, moved_out.t, Tensor(), Tensor());
    expect_close(read_f32(be, moved_out.t), want, tol, "after a re-placement");
    ep.set_placement(0, moe::contiguous_placement(kExperts, 1));
  }
}

TEST(ExpertParallelOneRank, CpuMatchesThePlainLayer) { run_case(DeviceType::CPU, false); }
TEST(ExpertParallelOneRank, CpuWithAGatedSharedExpertMatchesThePlainLayer) { run_case(DeviceType::CPU, true); }

#ifdef DEEPINFER_HAS_NCCL
// Passed on the H200 (gpu_run.sh dist, 2026-12-05).
TEST(ExpertParallelOneRank, CudaMatchesThePlainLayer) {
  run_case(DeviceType::CUDA, false);
  run_case(DeviceType::CUDA, true);
}
#endif

}  // namespace
}  // namespace deepinfer
