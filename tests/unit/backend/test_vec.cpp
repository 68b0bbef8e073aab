// The vectorised transcendental kernels of the CPU backend against double
// precision: the exponential behind softmax, SiLU and GELU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <random>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/vec.h"
#include "backend/cpu/vec_kernels.h"
#include "core/half.h"

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

std::vector<CpuIsa> vec_levels_here() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (isa_available(isa)) {
      levels.push_back(isa);
    } else {
      std::printf("[  NOTE    ] %s vector kernels not tested: this CPU lacks them\n", std::string(isa_name(isa)).c_str());
    }
  }
  return levels;
}

// The attention loops of every level against double precision, f32 and f16
// rows, head sizes that are and are not a multiple of 16 (the AVX-512 code
// hands the latter to AVX2), key counts with a tail.
TEST(VecKernels, StridedDotsAndSumsMatchDoublePrecisionAtEveryLevel) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (CpuIsa isa : vec_levels_here()) {
    const VecKernels& vk = vec_kernels(isa);
    for (int64_t n : {64, 72, 256}) {
      const int64_t count = 13, stride = n + 8;
      std::vector<float> q(static_cast<size_t>(n)), k32(static_cast<size_t>(count * stride));
      std::vector<uint16_t> k16(k32.size());
      for (auto& v : q) v = normal(rng);
      for (size_t i = 0; i < k32.size(); ++i) {
        k16[i] = f32_to_f16(normal(rng));
        k32[i] = f16_to_f32(k16[i]);  // the same values in both layouts
      }
      std::vector<float> out32(count), out16(count), w(count);
      vk.dot_strided_f32(q.data(), k32.data(), stride, count, n, out32.data());
      vk.dot_strided_f16(q.data(), k16.data(), stride, count, n, out16.data());
      for (int64_t j = 0; j < count; ++j) {
        double want = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) want += double(q[i]) * k32[j * stride + i], mag += std::abs(q[i] * k32[j * stride + i]);
        EXPECT_NEAR(out32[j], want, 1e-6 * mag) << isa_name(isa) << " n=" << n << " key " << j;
        EXPECT_NEAR(out16[j], want, 1e-6 * mag) << isa_name(isa) << " n=" << n << " key " << j;
        w[static_cast<size_t>(j)] = normal(rng);
      }
      std::vector<float> acc32(static_cast<size_t>(n), 0.5f), acc16 = acc32;
      vk.accumulate_strided_f32(acc32.data(), w.data(), k32.data(), stride, count, n);
      vk.accumulate_strided_f16(acc16.data(), w.data(), k16.data(), stride, count, n);
      for (int64_t i = 0; i < n; ++i) {
        double want = 0.5, mag = 0.5;
        for (int64_t j = 0; j < count; ++j) want += double(w[j]) * k32[j * stride + i], mag += std::abs(w[j] * k32[j * stride + i]);
        EXPECT_NEAR(acc32[i], want, 1e-6 * mag) << isa_name(isa) << " n=" << n << " element " << i;
        EXPECT_EQ(acc16[i], acc32[i]) << "f16 and f32 rows of the same values sum alike";
      }
    }
  }
}

// The element-wise kernels do the same operations per element at every
// level: AVX-512 gives AVX2's bits, at any length (tails included).
TEST(VecKernels, ElementwiseKernelsGiveTheSameBitsAtEveryLevel) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 5.0f);
  const VecKernels& base = vec_kernels(CpuIsa::Avx2);
  for (CpuIsa isa : vec_levels_here()) {
    const VecKernels& vk = vec_kernels(isa);
    for (int64_t n : {1, 15, 16, 17, 100, 2048}) {
      std::vector<float> g(static_cast<size_t>(n)), u(g.size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = normal(rng), u[i] = normal(rng);
      std::vector<float> a(g.size()), b(g.size());
      vk.silu_mul(a.data(), g.data(), u.data(), n);
      base.silu_mul(b.data(), g.data(), u.data(), n);
      EXPECT_EQ(a, b) << isa_name(isa) << " silu n=" << n;
      vk.gelu_tanh_mul(a.data(), g.data(), u.data(), n);
      base.gelu_tanh_mul(b.data(), g.data(), u.data(), n);
      EXPECT_EQ(a, b) << isa_name(isa) << " gelu n=" << n;
      a = g, b = g;
      EXPECT_EQ(vk.exp_shifted_sum(a.data(), 3.0f, n), base.exp_shifted_sum(b.data(), 3.0f, n)) << isa_name(isa);
      EXPECT_EQ(a, b) << isa_name(isa) << " exp n=" << n;
    }
  }
}

}  // namespace
}  // namespace deepinfer::cpu
