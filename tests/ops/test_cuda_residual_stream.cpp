// The CUDA backend's fused products around the residual stream (decode,
// bf16): norm_linear and gated_linear with the input's unit-weight RMSNorm
// applied inside the gemv (the model folds the norm's weights into the
// matrix), and linear_accumulate adding the product to the stream. Skipped
// when no CUDA device is present.
//
// The fused norm does not round the normalised row to bf16 (1/rms scales
// the f32 dot product), so it is checked against an f64 reference at the
// linear test's tolerance (4e-3 of the terms' magnitude for a bf16 output);
// the accumulation must equal linear + add bit for bit.
#include <fmt/format.h>

#include <array>
#include <cmath>

#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// Rows of x normalised as rms_norm defines it, in f64.
std::vector<double> normalised(const std::vector<float>& x, const std::vector<float>& g, int64_t n, int64_t k,
                               double eps, double offset) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t l = 0; l < k; ++l) ss += double(x[i * k + l]) * x[i * k + l];
    const double inv = 1.0 / std::sqrt(ss / double(k) + eps);
    for (int64_t l = 0; l < k; ++l) y[i * k + l] = x[i * k + l] * inv * (g[l] + offset);
  }
  return y;
}

class CudaResidualStreamTest : public CudaVsCpuTest {};

TEST_F(CudaResidualStreamTest, DecodeShapesTakeTheFusedPaths) {
  EXPECT_TRUE(gpu().residual_stream_in_place(1));
  EXPECT_TRUE(gpu().residual_stream_in_place(4));
  EXPECT_FALSE(gpu().residual_stream_in_place(5));
  DeviceTensor x = zeros(gpu(), DType::BF16, {2, 256}), w = zeros(gpu(), DType::BF16, {64, 256});
  DeviceTensor g = upload_f32(gpu(), {256}, std::vector<float>(256, 1.0f));
  DeviceTensor out = zeros(gpu(), DType::BF16, {2, 64});
  EXPECT_TRUE(gpu().norm_linear(x.t, RowNorm{g.t, 1e-6f, 0.0f, true}, w.t, Tensor(), out.t));
  // A norm with its own weights is left to the separate kernels.
  EXPECT_FALSE(gpu().norm_linear(x.t, RowNorm{g.t, 1e-6f, 0.0f, false}, w.t, Tensor(), out.t));
  EXPECT_TRUE(gpu().linear_accumulate(x.t, w.t, Tensor(), out.t));
  DeviceTensor big = zeros(gpu(), DType::BF16, {64, 256}), big_out = zeros(gpu(), DType::BF16, {64, 64});
  EXPECT_FALSE(gpu().norm_linear(big.t, RowNorm{g.t, 1e-6f, 0.0f, true}, w.t, Tensor(), big_out.t));
  EXPECT_FALSE(gpu().linear_accumulate(big.t, w.t, Tensor(), big_out.t));
}

TEST_F(CudaResidualStreamTest, NormLinearMatchesF64Reference) {
  Rng rng(201);
  struct Case {
    int64_t n, k, m;
    bool bias;
  };
  // The gemv partitions: 4 warps per row ([1024, 4096]), 1 ([2200, 2048]),
  // 8 (k = 14336) and a small k.
  for (const Case& c : std::vector<Case>{{1, 4096, 1024, false}, {4, 4096, 1024, true}, {2, 2048, 2200, false},
                                         {3, 14336, 96, true}, {1, 512, 300, true}}) {
    for (DType out_type : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(fmt::format("n={} k={} m={} bias={} out={}", c.n, c.k, c.m, c.bias, dtype_name(out_type)));
      HostWeights w = random_weights(rng, DType::BF16, c.m, c.k);
      const std::vector<float> x = round_bf16(rng.floats(static_cast<size_t>(c.n * c.k), -4, 4));
      const std::vector<float> g(static_cast<size_t>(c.k), 1.0f);
      const std::vector<float> bias = rng.floats(static_cast<size_t>(c.m));
      DeviceTensor gx = upload_bf16(gpu(), {c.n, c.k}, x), gg = upload_f32(gpu(), {c.k}, g);
      DeviceTensor gw = upload(gpu(), DType::BF16, {c.m, c.k}, w.bytes.data());
      DeviceTensor gb = upload_f32(gpu(), {c.m}, bias);
      DeviceTensor out = zeros(gpu(), out_type, {c.n, c.m});
      ASSERT_TRUE(gpu().norm_linear(gx.t, RowNorm{gg.t, 1e-5f, 0.0f, true}, gw.t, c.bias ? gb.t : Tensor(), out.t));
      const std::vector<float> got = download_any(gpu(), out.t);
      const std::vector<double> y = normalised(x, g, c.n, c.k, 1e-5, 0.0);
      for (int64_t i = 0; i < c.n; ++i) {
        for (int64_t j = 0; j < c.m; ++j) {
          double sum = c.bias ? bias[j] : 0.0, mag = 0.0;
          for (int64_t l = 0; l < c.k; ++l) {
            const double p = y[i * c.k + l] * w.values[j * c.k + l];
            sum += p;
            mag += std::abs(p);
          }
          const double tol = (out_type == DType::BF16 ? 4e-3 : 1e-4) * (std::abs(sum) + mag) + 1e-4;
          ASSERT_NEAR(got[i * c.m + j], sum, tol) << "row " << i << " col " << j;
        }
      }
    }
  }
}

TEST_F(CudaResidualStreamTest, GatedLinearWithNormMatchesF64Reference) {
  Rng rng(202);
  for (auto [n, k, f] : std::vector<std::array<int64_t, 3>>{{1, 4096, 512}, {4, 2048, 2200}}) {
    for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
      SCOPED_TRACE(fmt::format("n={} k={} f={} act={}", n, k, f, static_cast<int>(act)));
      HostWeights w = random_weights(rng, DType::BF16, 2 * f, k);
      const std::vector<float> x = round_bf16(rng.floats(static_cast<size_t>(n * k), -4, 4));
      const std::vector<float> g(static_cast<size_t>(k), 1.0f);
      DeviceTensor gx = upload_bf16(gpu(), {n, k}, x), gg = upload_f32(gpu(), {k}, g);
      DeviceTensor gw = upload(gpu(), DType::BF16, {2 * f, k}, w.bytes.data());
      DeviceTensor out = zeros(gpu(), DType::BF16, {n, f});
      const RowNorm norm{gg.t, 1e-6f, 0.0f, true};
      ASSERT_TRUE(ops::gated_linear(gpu(), gx.t, gw.t, act, out.t, &norm));
      const std::vector<float> got = download_any(gpu(), out.t);
      const std::vector<double> y = normalised(x, g, n, k, 1e-6, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < f; ++j) {
          double gate = 0, up = 0, mag_g = 0, mag_u = 0;
          for (int64_t l = 0; l < k; ++l) {
            const double pg = y[i * k + l] * w.values[j * k + l], pu = y[i * k + l] * w.values[(j + f) * k + l];
            gate += pg, up += pu, mag_g += std::abs(pg), mag_u += std::abs(pu);
          }
          const double a = act == Activation::Silu
                               ? gate / (1 + std::exp(-gate))
                               : 0.5 * gate * (1 + std::tanh(0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)));
          // Both products are rounded to bf16 before the activation; act'
          // is at most ~1.13, so their error bounds carry through.
          const double tol = 4e-3 * ((std::abs(gate) + mag_g) * 1.2 * std::abs(up) + (std::abs(up) + mag_u) *
                                     std::abs(a)) + 4e-3 * std::abs(a * up) + 1e-4;
          ASSERT_NEAR(got[i * f + j], a * up, tol) << "row " << i << " col " << j;
        }
      }
    }
  }
}

TEST_F(CudaResidualStreamTest, LinearAccumulateEqualsLinearThenAdd) {
  Rng rng(203);
  for (auto [n, k, m] : std::vector<std::array<int64_t, 3>>{{1, 4096, 4096}, {3, 14336, 512}, {4, 512, 300}}) {
    SCOPED_TRACE(fmt::format("n={} k={} m={}", n, k, m));
    HostWeights w = random_weights(rng, DType::BF16, m, k);
    const std::vector<float> stream = round_bf16(rng.floats(static_cast<size_t>(n * m), -8, 8));
    DeviceTensor x = upload_bf16(gpu(), {n, k}, round_bf16(rng.floats(static_cast<size_t>(n * k))));
    DeviceTensor wt = upload(gpu(), DType::BF16, {m, k}, w.bytes.data());
    DeviceTensor bias = upload_f32(gpu(), {m}, rng.floats(static_cast<size_t>(m)));
    DeviceTensor fused = upload_bf16(gpu(), {n, m}, stream), delta = zeros(gpu(), DType::BF16, {n, m});
    ASSERT_TRUE(gpu().linear_accumulate(x.t, wt.t, bias.t, fused.t));
    DeviceTensor separate = upload_bf16(gpu(), {n, m}, stream);
    ops::linear(gpu(), x.t, wt.t, bias.t, delta.t);
    ops::add(gpu(), separate.t, delta.t, separate.t);
    EXPECT_EQ(download_any(gpu(), fused.t), download_any(gpu(), separate.t));
  }
}

}  // namespace
}  // namespace deepinfer::testing
