// The vectorised transcendental kernels of the CPU backend against double
// precision: the exponential behind softmax, SiLU and GELU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/vec.h"

namespace deepinfer::cpu {
namespace {

// Relative error in units of 2^-23 (one f32 ulp at 1.0).
double rel_ulps(double got, double want) { return std::abs(got - want) / (std::abs(want) * 0x1p-23); }

TEST(VecExp, WithinTwoUlpsAcrossTheNormalRange) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.5f; v += 0.001953125f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 88.7f, -87.3f}) x.push_back(v);
  std::vector<float> e = x;
  vec::exp_shifted_sum(e.data(), 0.0f, static_cast<int64_t>(e.size()));
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, rel_ulps(e[i], std::exp(static_cast<double>(x[i]))));
  EXPECT_LE(worst, 2.0);
}

TEST(VecExp, ShiftsByTheMaxAndSumsTheResults) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 2.5f, 1.5f, 3.0f, -4.0f, 0.0f, 2.0f};
  const double max = 3.0;
  double want = 0.0;
  for (float v : x) want += std::exp(v - max);
  std::vector<float> e = x;
  const float sum = vec::exp_shifted_sum(e.data(), 3.0f, static_cast<int64_t>(e.size()));
  EXPECT_NEAR(sum, want, 1e-6 * want);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(e[i], std::exp(x[i] - max), 1e-6);
}

TEST(VecExp, UnderflowsToZeroAndSaturatesInsteadOfNan) {
  std::vector<float> x = {-1000.0f, -200.0f, -88.0f, 100.0f, 1000.0f, -INFINITY};
  vec::exp_shifted_sum(x.data(), 0.0f, static_cast<int64_t>(x.size()));
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[5], 0.0f);  // a masked logit minus the running max
  EXPECT_GE(x[2], 0.0f);
  EXPECT_TRUE(std::isfinite(x[3]) && x[3] > 1e38f);
  EXPECT_TRUE(std::isfinite(x[4]));
}

TEST(VecActivations, SiluAndGeluMatchDoubleFormulasAtEveryPositionOfARow) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t n : {1, 7, 8, 13, 64, 100}) {  // tails shorter than a vector included
    std::vector<float> g(static_cast<size_t>(n)), u(g.size()), silu(g.size()), gelu(g.size());
    for (int64_t i = 0; i < n; ++i) g[i] = normal(rng), u[i] = normal(rng);
    g[0] = -30.0f;  // deep in the tails of both
    vec::silu_mul(silu.data(), g.data(), u.data(), n);
    vec::gelu_tanh_mul(gelu.data(), g.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i], y = u[i];
      const double want_silu = x / (1.0 + std::exp(-x)) * y;
      // 0.5 x (1 + tanh z) written without the cancellation of 1 + tanh z in the negative tail.
      const double z = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
      const double want_gelu = x / (1.0 + std::exp(-2.0 * z)) * y;
      // The f32 argument of the exponential carries a rounding error of about
      // |argument| * 2^-24, which e^argument turns into a relative error.
      EXPECT_NEAR(silu[i], want_silu, (1e-6 + 1.2e-7 * std::abs(x)) * std::abs(want_silu)) << "n=" << n << " i=" << i;
      // Where e^argument leaves the f32 range both are zero up to 1e-30.
      EXPECT_NEAR(gelu[i], want_gelu, (1e-6 + 2.4e-7 * std::abs(2.0 * z)) * std::abs(want_gelu) + 1e-30)
          << "n=" << n << " i=" << i;
    }
  }
}

// The same input gives the same bits wherever it sits in a row (batch
// invariance needs element-wise ops independent of the row's tail).
TEST(VecActivations, AnElementsResultDoesNotDependOnItsPosition) {
  std::vector<float> g(40), u(40, 1.0f), out(40);
  for (int i = 0; i < 40; ++i) g[static_cast<size_t>(i)] = 0.731f;
  vec::gelu_tanh_mul(out.data(), g.data(), u.data(), 37);
  for (int i = 1; i < 37; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], out[0]) << i;
}

}  // namespace
}  // namespace deepinfer::cpu
