// moe_route and moe_experts against naive references written here (double
// accumulation, one token and one expert at a time), over softmax and
// DeepSeek-style sigmoid/grouped routing, decode- and prefill-sized batches,
// float and quantised expert weights, fused gate_up views and accumulation,
// on every backend. The CUDA backend's production path (bf16/f16 activations
// and weights, tensor cores) is compared with the CPU op on the same rounded
// inputs in test_moe_cuda.cpp.
#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <tuple>

#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class MoeTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(MoeTest);

struct Route {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

// The routing rule of backend.h, spelled out per token.
Route reference_route(const std::vector<float>& logits, int64_t n, int64_t n_experts, const MoeRouteParams& p,
                      const std::vector<float>& bias) {
  Route r;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> score(n_experts), choice(n_experts);
    const float* l = logits.data() + t * n_experts;
    if (p.scoring == MoeScoring::Softmax) {
      double mx = *std::max_element(l, l + n_experts), sum = 0;
      for (int64_t e = 0; e < n_experts; ++e) sum += score[e] = std::exp(l[e] - mx);
      for (auto& s : score) s /= sum;
    } else {
      for (int64_t e = 0; e < n_experts; ++e) score[e] = 1.0 / (1.0 + std::exp(-double(l[e])));
    }
    for (int64_t e = 0; e < n_experts; ++e) choice[e] = score[e] + (bias.empty() ? 0.0 : bias[e]);
    std::vector<bool> allowed(n_experts, true);
    if (p.n_groups > 1) {
      const int64_t size = n_experts / p.n_groups;
      std::vector<std::pair<double, int>> rank;
      for (int g = 0; g < p.n_groups; ++g) {
        std::vector<double> c(choice.begin() + g * size, choice.begin() + (g + 1) * size);
        std::sort(c.rbegin(), c.rend());
        rank.push_back({-(p.group_score == MoeGroupScore::Max ? c[0] : c[0] + c[1]), g});
      }
      std::sort(rank.begin(), rank.end());
      std::fill(allowed.begin(), allowed.end(), false);
      for (int i = 0; i < p.top_k_groups; ++i) {
        for (int64_t e = 0; e < size; ++e) allowed[rank[i].second * size + e] = true;
      }
    }
    std::vector<int> order;
    for (int64_t e = 0; e < n_experts; ++e) {
      if (allowed[e]) order.push_back(static_cast<int>(e));
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
    double sum = 0;
    for (int j = 0; j < p.top_k; ++j) sum += score[order[j]];
    for (int j = 0; j < p.top_k; ++j) {
      r.ids.push_back(order[j]);
      r.weights.push_back(score[order[j]] * (p.renormalize ? p.scaling / sum : p.scaling));
    }
  }
  return r;
}

void check_route(Backend& b, Rng& rng, int64_t n, int64_t n_experts, MoeRouteParams p,
                 bool with_bias) {
  SCOPED_TRACE(fmt::format("n={} experts={} top_k={} sigmoid={} renormalize={} groups={}/{} bias={}", n, n_experts,
                           p.top_k, p.scoring == MoeScoring::Sigmoid, p.renormalize, p.top_k_groups, p.n_groups,
                           with_bias));
  std::vector<float> logits = rng.floats(static_cast<size_t>(n * n_experts), -3.0f, 3.0f);
  std::vector<float> bias = with_bias ? rng.floats(static_cast<size_t>(n_experts), -0.2f, 0.2f) : std::vector<float>();
  DeviceTensor dl = upload_f32(b, {n, n_experts}, logits);
  DeviceTensor dbias = with_bias ? upload_f32(b, {n_experts}, bias) : DeviceTensor{};
  if (with_bias) p.correction_bias = dbias.t;
  DeviceTensor ids = zeros(b, DType::I32, {n, p.top_k});
  DeviceTensor weights = zeros(b, DType::F32, {n, p.top_k});
  ops::moe_route(b, dl.t, p, ids.t, weights.t);
  const Route want = reference_route(logits, n, n_experts, p, bias);
  std::vector<int32_t> got_ids(want.ids.size());
  b.copy(Tensor(got_ids.data(), DType::I32, {n, p.top_k}), ids.t);
  EXPECT_EQ(got_ids, want.ids);
  EXPECT_TRUE(all_close(download_f32(b, weights.t), want.weights, 1e-6, 1e-5));
}

TEST_P(MoeTest, RouteSoftmaxTopK) {
  Rng rng(11);
  for (bool renormalize : {false, true}) {
    for (auto [n, experts, k] : {std::tuple{1, 8, 2}, {7, 8, 2}, {33, 60, 4}, {5, 4, 4}, {3, 128, 8}}) {
      MoeRouteParams p;
      p.top_k = k;
      p.renormalize = renormalize;
      check_route(backend(), rng, n, experts, p, false);
    }
  }
}

TEST_P(MoeTest, RouteSigmoidBiasGroupsAndScaling) {
  Rng rng(12);
  MoeRouteParams p;
  p.scoring = MoeScoring::Sigmoid;
  p.top_k = 4;
  p.renormalize = true;
  p.scaling = 2.5f;
  p.n_groups = 4;
  p.top_k_groups = 2;
  check_route(backend(), rng, 9, 32, p, true);
  p.n_groups = 1;
  p.top_k_groups = 1;
  p.renormalize = false;
  check_route(backend(), rng, 9, 32, p, true);
  // DeepSeek-V2's group_limited_greedy: softmax, a group ranked by its best
  // expert, more experts than groups (so the groups matter), scaled weights;
  // also with one-expert groups.
  p.scoring = MoeScoring::Softmax;
  p.group_score = MoeGroupScore::Max;
  p.top_k = 3;
  p.scaling = 1.5f;
  p.n_groups = 4;
  p.top_k_groups = 2;
  check_route(backend(), rng, 9, 8, p, false);
  p.n_groups = 8;
  p.top_k_groups = 3;
  check_route(backend(), rng, 5, 8, p, false);
  p.group_score = MoeGroupScore::TopTwoSum;
  p.n_groups = 1;
  p.top_k_groups = 1;
  p.scoring = MoeScoring::Sigmoid;
  // A one-expert sigmoid route is a per-token sigmoid gate (Qwen2-MoE's shared expert).
  p.top_k = 1;
  p.scaling = 1.0f;
  check_route(backend(), rng, 6, 1, p, false);
}

// Expert stacks with their f32 values, and a workspace sized by the op.
struct Experts {
  HostWeights gate, up, down;
  DeviceTensor dgate, dup, ddown, dgate_up;
  MoeExpertWeights w;
};

Experts make_experts(Backend& b, Rng& rng, DType dtype, int64_t n_experts, int64_t hidden, int64_t ffn, bool fused) {
  Experts x;
  x.gate = random_weights(rng, dtype, n_experts * ffn, hidden);
  x.up = random_weights(rng, dtype, n_experts * ffn, hidden);
  x.down = random_weights(rng, dtype, n_experts * hidden, ffn);
  x.ddown = upload(b, dtype, {n_experts, hidden, ffn}, x.down.bytes.data());
  if (fused) {
    // transformers' experts.gate_up_proj [E, 2F, H]: each expert's gate rows, then its up rows.
    const size_t expert_bytes = x.gate.bytes.size() / static_cast<size_t>(n_experts);
    std::vector<uint8_t> both;
    for (int64_t e = 0; e < n_experts; ++e) {
      both.insert(both.end(), x.gate.bytes.begin() + e * expert_bytes, x.gate.bytes.begin() + (e + 1) * expert_bytes);
      both.insert(both.end(), x.up.bytes.begin() + e * expert_bytes, x.up.bytes.begin() + (e + 1) * expert_bytes);
    }
    x.dgate_up = upload(b, dtype, {n_experts, 2 * ffn, hidden}, both.data());
    x.w = {x.dgate_up.t.narrow(1, 0, ffn), x.dgate_up.t.narrow(1, ffn, ffn), x.ddown.t, {}, {}, {}};
  } else {
    x.dgate = upload(b, dtype, {n_experts, ffn, hidden}, x.gate.bytes.data());
    x.dup = upload(b, dtype, {n_experts, ffn, hidden}, x.up.bytes.data());
    x.w = {x.dgate.t, x.dup.t, x.ddown.t, {}, {}, {}};
  }
  return x;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

struct ExpertsCase {
  DType dtype;
  int64_t n, n_experts, hidden, ffn;
  int top_k;
  bool fused, accumulate;
};

void run_experts(Backend& b, Rng& rng, const ExpertsCase& c) {
  SCOPED_TRACE(fmt::format("{} n={} experts={} hidden={} ffn={} top_k={} fused={} accumulate={}", dtype_name(c.dtype),
                           c.n, c.n_experts, c.hidden, c.ffn, c.top_k, c.fused, c.accumulate));
  Experts ex = make_experts(b, rng, c.dtype, c.n_experts, c.hidden, c.ffn, c.fused);
  std::vector<float> x = rng.floats(static_cast<size_t>(c.n * c.hidden));
  std::vector<float> out0 = rng.floats(x.size());
  std::vector<float> weights = rng.floats(static_cast<size_t>(c.n * c.top_k), 0.0f, 1.0f);
  // Distinct experts per token, drawn so that the last expert is never used.
  const std::vector<int32_t> ids = draw_expert_ids(rng, c.n, c.n_experts - 1, c.top_k);
  DeviceTensor dx = upload_f32(b, {c.n, c.hidden}, x);
  DeviceTensor dout = upload_f32(b, {c.n, c.hidden}, out0);
  DeviceTensor dids = upload(b, DType::I32, {c.n, c.top_k}, ids.data());
  DeviceTensor dw = upload_f32(b, {c.n, c.top_k}, weights);
  Buffer ws_buf(b, ops::moe_workspace_bytes(b, c.n, c.top_k, ex.w));
  Tensor ws = ws_buf.view(DType::U8, {static_cast<int64_t>(ws_buf.size())});
  ops::moe_experts(b, dx.t, dids.t, dw.t, ex.w, Activation::Silu, c.accumulate, ws, dout.t);

  std::vector<double> want(x.size()), magnitude(x.size());
  for (int64_t t = 0; t < c.n; ++t) {
    const float* xt = x.data() + t * c.hidden;
    for (int64_t i = 0; i < c.hidden; ++i) want[t * c.hidden + i] = c.accumulate ? out0[t * c.hidden + i] : 0.0;
    for (int j = 0; j < c.top_k; ++j) {
      const int64_t e = ids[t * c.top_k + j];
      std::vector<double> act(static_cast<size_t>(c.ffn));
      for (int64_t f = 0; f < c.ffn; ++f) {
        double g = 0, u = 0;
        const float* wg = ex.gate.values.data() + (e * c.ffn + f) * c.hidden;
        const float* wu = ex.up.values.data() + (e * c.ffn + f) * c.hidden;
        for (int64_t i = 0; i < c.hidden; ++i) {
          g += double(wg[i]) * xt[i];
          u += double(wu[i]) * xt[i];
        }
        act[f] = silu(g) * u;
      }
      for (int64_t i = 0; i < c.hidden; ++i) {
        const float* wd = ex.down.values.data() + (e * c.hidden + i) * c.ffn;
        double y = 0, mag = 0;
        for (int64_t f = 0; f < c.ffn; ++f) {
          y += double(wd[f]) * act[f];
          mag += std::abs(double(wd[f]) * act[f]);
        }
        want[t * c.hidden + i] += weights[t * c.top_k + j] * y;
        magnitude[t * c.hidden + i] += weights[t * c.top_k + j] * mag;
      }
    }
  }
  const std::vector<float> got = download_f32(b, dout.t);
  // Quantised weights meet 8-bit activations in decode-sized products (as in
  // test_linear); floats differ from the reference by f32 rounding only.
  const double rel = is_quantized(c.dtype) ? 0.05 : 1e-4;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), rel * magnitude[i] + 1e-4) << "element " << i << ": got " << got[i]
                                                                        << ", expected " << want[i];
  }
}

TEST_P(MoeTest, ExpertsMatchNaiveReference) {
  Rng rng(21);
  std::vector<DType> dtypes = {DType::F32, DType::BF16, DType::F16};
  if (backend_supports_quantised(backend())) dtypes.push_back(DType::Q8_0);
  for (DType dtype : dtypes) {
    // Decode (one or a few tokens), and prefill with more rows per expert
    // than the CPU's gemv threshold, so both linear paths run.
    run_experts(backend(), rng, {dtype, 1, 8, 64, 32, 2, false, false});
    run_experts(backend(), rng, {dtype, 3, 8, 64, 96, 3, false, true});
    run_experts(backend(), rng, {dtype, 70, 5, 64, 32, 2, false, false});
  }
}

TEST_P(MoeTest, ExpertsFusedGateUpViewsAndAccumulate) {
  Rng rng(22);
  run_experts(backend(), rng, {DType::F32, 2, 4, 32, 64, 2, true, false});
  run_experts(backend(), rng, {DType::BF16, 40, 6, 64, 32, 4, true, true});
}

TEST_P(MoeTest, RejectsMalformedArguments) {
  Backend& b = backend();
  DeviceTensor logits = zeros(b, DType::F32, {3, 4});
  DeviceTensor ids = zeros(b, DType::I32, {3, 5});
  DeviceTensor weights = zeros(b, DType::F32, {3, 5});
  MoeRouteParams p;
  p.top_k = 5;
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THAT(message([&] { ops::moe_route(b, logits.t, p, ids.t, weights.t); }),
              HasSubstr("moe_route: top_k 5 must be in [1, 4]"));
  p.top_k = 2;
  EXPECT_THAT(message([&] { ops::moe_route(b, logits.t, p, ids.t, weights.t); }), HasSubstr("must be [3, 2]"));
  DeviceTensor ids2 = zeros(b, DType::I32, {3, 2}), weights2 = zeros(b, DType::F32, {3, 2});
  p.n_groups = 3;
  EXPECT_THAT(message([&] { ops::moe_route(b, logits.t, p, ids2.t, weights2.t); }), HasSubstr("must divide"));

  Rng rng(23);
  Experts ex = make_experts(b, rng, DType::F32, 4, 32, 16, false);
  DeviceTensor x = zeros(b, DType::F32, {3, 32}), out = zeros(b, DType::F32, {3, 32});
  DeviceTensor tiny = zeros(b, DType::U8, {16});
  EXPECT_THAT(message([&] { ops::moe_experts(b, x.t, ids2.t, weights2.t, ex.w, Activation::Silu, false, tiny.t, out.t); }),
              HasSubstr("workspace u8[16]"));
  MoeExpertWeights swapped{ex.w.gate, ex.w.up, ex.w.gate, {}, {}, {}};
  EXPECT_THAT(message([&] { ops::moe_workspace_bytes(b, 3, 2, swapped); }), HasSubstr("w.down"));
  // Expert ids are data: checked when the experts run (on a device: clamped
  // there, then raised by synchronize).
  Buffer ws_buf(b, ops::moe_workspace_bytes(b, 3, 2, ex.w));
  Tensor ws = ws_buf.view(DType::U8, {static_cast<int64_t>(ws_buf.size())});
  std::vector<int32_t> bad = {0, 1, 2, 4, 3, 0};
  DeviceTensor bad_ids = upload(b, DType::I32, {3, 2}, bad.data());
  const bool cpu = b.device().type == DeviceType::CPU;
  EXPECT_THAT(message([&] {
                ops::moe_experts(b, x.t, bad_ids.t, weights2.t, ex.w, Activation::Silu, false, ws, out.t);
                b.synchronize();
              }),
              HasSubstr(cpu ? "expert id 4 of token 1 out of range [0, 4)" : "moe_experts: expert id out of range"));
  // The error is reported once; the backend stays usable.
  if (!cpu) {
    EXPECT_NO_THROW(b.synchronize());
  }
}

}  // namespace
}  // namespace deepinfer::testing
