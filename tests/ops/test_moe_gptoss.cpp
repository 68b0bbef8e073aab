// gpt-oss's additions to the MoE and activation ops, against naive references
// (double accumulation): the clamped SwiGLU in gated_activation and
// moe_experts, per-expert biases on the gate, up and down products, and gate/up
// passed as interleaved strided views of one [E, 2F, H] stack. The CUDA backend
// runs the MoE ones (cuda_moe.cu); where it lacks a kernel (gated_activation's
// clamped SwiGLU) it must say so rather than compute something else.
#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "op_test_util.h"
#include "../support/error_message.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class GptOssOpsTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(GptOssOpsTest);

double clamped_swiglu(double gate, double up) {
  const double limit = kClampedSwigluLimit, alpha = kClampedSwigluAlpha;
  const double g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
  return (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
}

bool is_cuda(const Backend& b) { return b.device().type == DeviceType::CUDA; }

TEST_P(GptOssOpsTest, GatedActivationClampedSwiglu) {
  Backend& b = backend();
  Rng rng(31);
  const int64_t rows = 5, cols = 40;
  std::vector<float> gate = rng.floats(rows * cols, -12.0f, 12.0f), up = rng.floats(rows * cols, -12.0f, 12.0f);
  // The clamp edges themselves and values far beyond them.
  const float edges[] = {7.0f, -7.0f, 6.999f, 7.001f, 100.0f, -100.0f, 0.0f, -1.0f};
  for (size_t i = 0; i < std::size(edges); ++i) {
    gate[i] = edges[i];
    up[i] = edges[std::size(edges) - 1 - i];
  }
  DeviceTensor dg = upload_f32(b, {rows, cols}, gate), du = upload_f32(b, {rows, cols}, up);
  DeviceTensor dout = zeros(b, DType::F32, {rows, cols});
  if (is_cuda(b)) {
    EXPECT_THAT(error_of([&] { ops::gated_activation(b, dg.t, du.t, Activation::ClampedSwiglu, dout.t); }),
                HasSubstr("clamped SwiGLU (gpt-oss) is not implemented on CUDA yet"));
    return;
  }
  ops::gated_activation(b, dg.t, du.t, Activation::ClampedSwiglu, dout.t);
  std::vector<double> want(gate.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = clamped_swiglu(gate[i], up[i]);
  EXPECT_TRUE(all_close(download_f32(b, dout.t), want, 1e-6, 1e-6));
  // In place over gate, as moe_experts uses it.
  ops::gated_activation(b, dg.t, du.t, Activation::ClampedSwiglu, dg.t);
  EXPECT_TRUE(all_close(download_f32(b, dg.t), want, 1e-6, 1e-6));
}

// Experts as gpt-oss stores them once transposed: one [E, 2F, H] stack with
// gate row f at 2f and up row f at 2f+1, plus f32 biases.
struct InterleavedExperts {
  HostWeights gate, up, down;
  std::vector<float> gate_bias, up_bias, down_bias;
  DeviceTensor dgate_up, ddown, dgate_bias, dup_bias, ddown_bias;
  MoeExpertWeights w;
};

InterleavedExperts make_experts(Backend& b, Rng& rng, DType dtype, int64_t n_experts, int64_t hidden, int64_t ffn) {
  InterleavedExperts x;
  x.gate = random_weights(rng, dtype, n_experts * ffn, hidden);
  x.up = random_weights(rng, dtype, n_experts * ffn, hidden);
  x.down = random_weights(rng, dtype, n_experts * hidden, ffn);
  // Biases wide enough that many gate / up values pass the clamp limits.
  x.gate_bias = rng.floats(static_cast<size_t>(n_experts * ffn), -8.0f, 8.0f);
  x.up_bias = rng.floats(static_cast<size_t>(n_experts * ffn), -8.0f, 8.0f);
  x.down_bias = rng.floats(static_cast<size_t>(n_experts * hidden), -1.0f, 1.0f);
  const size_t row = row_bytes(dtype, hidden);
  std::vector<uint8_t> interleaved;
  for (int64_t r = 0; r < n_experts * ffn; ++r) {
    interleaved.insert(interleaved.end(), x.gate.bytes.begin() + r * row, x.gate.bytes.begin() + (r + 1) * row);
    interleaved.insert(interleaved.end(), x.up.bytes.begin() + r * row, x.up.bytes.begin() + (r + 1) * row);
  }
  x.dgate_up = upload(b, dtype, {n_experts, 2 * ffn, hidden}, interleaved.data());
  const Tensor pairs = x.dgate_up.t.reshape({n_experts, ffn, 2 * hidden});
  x.ddown = upload(b, dtype, {n_experts, hidden, ffn}, x.down.bytes.data());
  x.dgate_bias = upload_f32(b, {n_experts, ffn}, x.gate_bias);
  x.dup_bias = upload_f32(b, {n_experts, ffn}, x.up_bias);
  x.ddown_bias = upload_f32(b, {n_experts, hidden}, x.down_bias);
  x.w.gate = pairs.narrow(2, 0, hidden);
  x.w.up = pairs.narrow(2, hidden, hidden);
  x.w.down = x.ddown.t;
  x.w.gate_bias = x.dgate_bias.t;
  x.w.up_bias = x.dup_bias.t;
  x.w.down_bias = x.ddown_bias.t;
  return x;
}

struct Case {
  DType dtype;
  int64_t n, n_experts, hidden, ffn;
  int top_k;
  Activation act;
  bool accumulate;
};

void run_case(Backend& b, Rng& rng, const Case& c) {
  SCOPED_TRACE(fmt::format("{} n={} experts={} hidden={} ffn={} top_k={} act={} accumulate={}", dtype_name(c.dtype),
                           c.n, c.n_experts, c.hidden, c.ffn, c.top_k, static_cast<int>(c.act), c.accumulate));
  InterleavedExperts ex = make_experts(b, rng, c.dtype, c.n_experts, c.hidden, c.ffn);
  std::vector<float> x = rng.floats(static_cast<size_t>(c.n * c.hidden));
  std::vector<float> out0 = rng.floats(x.size());
  std::vector<float> weights = rng.floats(static_cast<size_t>(c.n * c.top_k), 0.0f, 1.0f);
  const std::vector<int32_t> ids = draw_expert_ids(rng, c.n, c.n_experts, c.top_k);
  DeviceTensor dx = upload_f32(b, {c.n, c.hidden}, x);
  DeviceTensor dout = upload_f32(b, {c.n, c.hidden}, out0);
  DeviceTensor dids = upload(b, DType::I32, {c.n, c.top_k}, ids.data());
  DeviceTensor dw = upload_f32(b, {c.n, c.top_k}, weights);
  Buffer ws_buf(b, ops::moe_workspace_bytes(b, c.n, c.top_k, ex.w));
  Tensor ws = ws_buf.view(DType::U8, {static_cast<int64_t>(ws_buf.size())});
  ops::moe_experts(b, dx.t, dids.t, dw.t, ex.w, c.act, c.accumulate, ws, dout.t);

  std::vector<double> want(x.size());
  int clamped = 0;
  for (int64_t t = 0; t < c.n; ++t) {
    const float* xt = x.data() + t * c.hidden;
    for (int64_t i = 0; i < c.hidden; ++i) want[t * c.hidden + i] = c.accumulate ? out0[t * c.hidden + i] : 0.0;
    for (int j = 0; j < c.top_k; ++j) {
      const int64_t e = ids[t * c.top_k + j];
      std::vector<double> act(static_cast<size_t>(c.ffn));
      for (int64_t f = 0; f < c.ffn; ++f) {
        double g = ex.gate_bias[e * c.ffn + f], u = ex.up_bias[e * c.ffn + f];
        const float* wg = ex.gate.values.data() + (e * c.ffn + f) * c.hidden;
        const float* wu = ex.up.values.data() + (e * c.ffn + f) * c.hidden;
        for (int64_t i = 0; i < c.hidden; ++i) {
          g += double(wg[i]) * xt[i];
          u += double(wu[i]) * xt[i];
        }
        clamped += g > kClampedSwigluLimit || std::abs(u) > kClampedSwigluLimit;
        act[f] = c.act == Activation::ClampedSwiglu ? clamped_swiglu(g, u) : g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t i = 0; i < c.hidden; ++i) {
        const float* wd = ex.down.values.data() + (e * c.hidden + i) * c.ffn;
        double y = ex.down_bias[e * c.hidden + i];
        for (int64_t f = 0; f < c.ffn; ++f) y += double(wd[f]) * act[f];
        want[t * c.hidden + i] += weights[t * c.top_k + j] * y;
      }
    }
  }
  EXPECT_GT(clamped, 0) << "the case never reaches the clamp";
  EXPECT_TRUE(all_close(download_f32(b, dout.t), want, 1e-4, 1e-4));
}

TEST_P(GptOssOpsTest, ExpertsWithBiasesAndInterleavedGateUp) {
  Rng rng(32);
  for (DType dtype : {DType::F32, DType::BF16}) {
    // Decode-sized and prefill-sized (more rows per expert than the CPU's gemv threshold).
    run_case(backend(), rng, {dtype, 1, 8, 32, 24, 2, Activation::ClampedSwiglu, false});
    run_case(backend(), rng, {dtype, 3, 6, 64, 16, 4, Activation::ClampedSwiglu, true});
    run_case(backend(), rng, {dtype, 70, 4, 32, 24, 2, Activation::ClampedSwiglu, false});
  }
  // Biases and strided views with an ordinary SwiGLU.
  run_case(backend(), rng, {DType::F32, 5, 4, 32, 8, 2, Activation::Silu, false});
}

TEST_P(GptOssOpsTest, RejectsMalformedBiases) {
  Backend& b = backend();
  Rng rng(33);
  InterleavedExperts ex = make_experts(b, rng, DType::F32, 4, 16, 8);
  MoeExpertWeights partial = ex.w;
  partial.up_bias = Tensor();
  EXPECT_THAT(error_of([&] { ops::moe_workspace_bytes(b, 2, 2, partial); }),
              HasSubstr("expert biases come all three (gate, up, down) or not at all"));
  MoeExpertWeights wrong_shape = ex.w;
  wrong_shape.down_bias = ex.w.gate_bias;  // [4, 8] where [4, 16] is needed
  EXPECT_THAT(error_of([&] { ops::moe_workspace_bytes(b, 2, 2, wrong_shape); }),
              HasSubstr("w.down_bias f32[4, 8]"));
  DeviceTensor ints = zeros(b, DType::I32, {4, 8});
  MoeExpertWeights wrong_dtype = ex.w;
  wrong_dtype.gate_bias = ints.t;
  EXPECT_THAT(error_of([&] { ops::moe_workspace_bytes(b, 2, 2, wrong_dtype); }),
              HasSubstr("must be f32 or the activation dtype"));
  EXPECT_THAT(error_of([&] {
                ops::gated_activation(b, ex.dgate_bias.t, ex.dup_bias.t, static_cast<Activation>(9), ex.dgate_bias.t);
              }),
              HasSubstr("unknown activation 9"));
}

}  // namespace
}  // namespace deepinfer::testing
