// The residual stream's fused products (ops::norm_linear,
// ops::linear_accumulate, gated_linear with an input norm) on every backend
// at f32: they must give what the separate ops give. Backends without a
// fused path for f32 activations run exactly those ops, so the results are
// compared bit for bit. The CUDA backend's bf16 kernels are checked against
// f64 references in test_cuda_residual_stream.cpp.
#include <fmt/format.h>
#include <gmock/gmock.h>

#include <array>

#include "op_test_util.h"
#include "ops/ops.h"
#include "../support/error_message.h"

namespace deepinfer::testing {
namespace {

class ResidualStreamOpsTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(ResidualStreamOpsTest);

TEST_P(ResidualStreamOpsTest, NormLinearEqualsNormThenLinear) {
  Rng rng(7);
  for (auto [n, k, m] : std::vector<std::array<int64_t, 3>>{{1, 64, 40}, {3, 256, 100}, {9, 128, 33}}) {
    for (float offset : {0.0f, 1.0f}) {
      SCOPED_TRACE(fmt::format("n={} k={} m={} offset={}", n, k, m, offset));
      HostWeights w = random_weights(rng, DType::F32, m, k);
      DeviceTensor x = upload_f32(backend(), {n, k}, rng.floats(static_cast<size_t>(n * k), -3, 3));
      DeviceTensor g = upload_f32(backend(), {k}, rng.floats(static_cast<size_t>(k)));
      DeviceTensor wt = upload(backend(), DType::F32, {m, k}, w.bytes.data());
      DeviceTensor bias = upload_f32(backend(), {m}, rng.floats(static_cast<size_t>(m)));
      DeviceTensor fused = zeros(backend(), DType::F32, {n, m}), normed = zeros(backend(), DType::F32, {n, k});
      ops::norm_linear(backend(), x.t, RowNorm{g.t, 1e-5f, offset}, wt.t, bias.t, fused.t, normed.t);
      DeviceTensor h = zeros(backend(), DType::F32, {n, k}), separate = zeros(backend(), DType::F32, {n, m});
      ops::rms_norm(backend(), x.t, g.t, 1e-5f, offset, h.t);
      ops::linear(backend(), h.t, wt.t, bias.t, separate.t);
      EXPECT_EQ(download_f32(backend(), fused.t), download_f32(backend(), separate.t));
    }
  }
}

TEST_P(ResidualStreamOpsTest, LinearAccumulateEqualsLinearThenAdd) {
  Rng rng(8);
  for (auto [n, k, m] : std::vector<std::array<int64_t, 3>>{{1, 96, 64}, {4, 256, 48}, {12, 64, 64}}) {
    SCOPED_TRACE(fmt::format("n={} k={} m={}", n, k, m));
    HostWeights w = random_weights(rng, DType::F32, m, k);
    const std::vector<float> stream = rng.floats(static_cast<size_t>(n * m), -4, 4);
    DeviceTensor x = upload_f32(backend(), {n, k}, rng.floats(static_cast<size_t>(n * k)));
    DeviceTensor wt = upload(backend(), DType::F32, {m, k}, w.bytes.data());
    DeviceTensor bias = upload_f32(backend(), {m}, rng.floats(static_cast<size_t>(m)));
    DeviceTensor fused = upload_f32(backend(), {n, m}, stream), delta = zeros(backend(), DType::F32, {n, m});
    ops::linear_accumulate(backend(), x.t, wt.t, bias.t, fused.t, delta.t);
    DeviceTensor separate = upload_f32(backend(), {n, m}, stream), product = zeros(backend(), DType::F32, {n, m});
    ops::linear(backend(), x.t, wt.t, bias.t, product.t);
    ops::add(backend(), separate.t, product.t, separate.t);
    EXPECT_EQ(download_f32(backend(), fused.t), download_f32(backend(), separate.t));
  }
}

TEST_P(ResidualStreamOpsTest, RejectsScratchAndNormOfTheWrongShape) {
  DeviceTensor x = zeros(backend(), DType::F32, {2, 64}), w = zeros(backend(), DType::F32, {32, 64});
  DeviceTensor g = zeros(backend(), DType::F32, {64}), short_g = zeros(backend(), DType::F32, {63});
  DeviceTensor out = zeros(backend(), DType::F32, {2, 32}), normed = zeros(backend(), DType::F32, {2, 64});
  DeviceTensor small = zeros(backend(), DType::F32, {2, 16});
  using ::testing::HasSubstr;
  const RowNorm norm{g.t, 1e-6f, 0.0f}, short_norm{short_g.t, 1e-6f, 0.0f}, bad_eps{g.t, -1.0f, 0.0f};
  EXPECT_THAT(error_of([&] { ops::norm_linear(backend(), x.t, norm, w.t, Tensor(), out.t, small.t); }),
              HasSubstr("norm_linear: normed"));
  EXPECT_THAT(error_of([&] { ops::norm_linear(backend(), x.t, short_norm, w.t, Tensor(), out.t, normed.t); }),
              HasSubstr("norm_linear: weight"));
  EXPECT_THAT(error_of([&] { ops::norm_linear(backend(), x.t, bad_eps, w.t, Tensor(), out.t, normed.t); }),
              HasSubstr("eps"));
  EXPECT_THAT(error_of([&] { ops::linear_accumulate(backend(), x.t, w.t, Tensor(), out.t, small.t); }),
              HasSubstr("linear_accumulate: delta"));
  DeviceTensor gate_up = zeros(backend(), DType::F32, {64, 64}), act = zeros(backend(), DType::F32, {2, 32});
  EXPECT_THAT(error_of([&] { ops::gated_linear(backend(), x.t, gate_up.t, Activation::Silu, act.t, &short_norm); }),
              HasSubstr("gated_linear: weight"));
}

}  // namespace
}  // namespace deepinfer::testing
