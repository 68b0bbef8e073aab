// FP8 weights in 64-element row blocks (DType::F8E4M3_B64): quantising,
// packing a checkpoint's codes, dequantising, and the dot products of every
// kernel level this machine runs.
//
// Dequantisation is exact (code value * scale, one rounding), the same bits at
// every level. The dots sum code value * x per block in f32 and scale the
// block sum: against the double-precision sum of the exactly dequantised
// weights times x, |dot - ref| <= (n + 16) * 2^-24 * sum_i |w_i x_i| (a few
// roundings per term at most, like the float dtypes' bound in test_dot.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/quants.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/fp8_blocks.h"
#include "reference_data.h"

namespace deepinfer {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng) * scale;
  return v;
}

TEST(F8Blocks, DTypeDescribesTheBlock) {
  const DTypeInfo& info = dtype_info(DType::F8E4M3_B64);
  EXPECT_EQ(info.name, "f8_e4m3_b64");
  EXPECT_EQ(info.block_elems, kF8BlockElems);
  EXPECT_EQ(info.block_bytes, static_cast<int>(sizeof(F8Block)));
  EXPECT_TRUE(info.quantized);
  EXPECT_EQ(row_bytes(DType::F8E4M3_B64, 4096), 64u * 68u);
  EXPECT_EQ(row_bytes(DType::F8E4M3_B64, 576), 9u * 68u);  // SmolLM2's hidden size
  EXPECT_THROW(row_bytes(DType::F8E4M3_B64, 96), Error);
}

// The GPU's split rows (codes, then scales; CudaBackend::copy): same bytes
// per row, each row's codes in order then its scales, and back unchanged.
TEST(F8Blocks, SplitRowsPutEachRowsCodesBeforeItsScales) {
  constexpr int64_t rows = 3, k = 3 * kF8BlockElems, nb = k / kF8BlockElems;
  std::vector<F8Block> blocks(static_cast<size_t>(rows * nb));
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].scale = 0.5f + static_cast<float>(i);
    for (int e = 0; e < kF8BlockElems; ++e) blocks[i].codes[e] = static_cast<uint8_t>((i * 7 + e) % 0x7e);
  }
  std::vector<uint8_t> split(blocks.size() * sizeof(F8Block));
  split_f8_rows(blocks.data(), rows, k, split.data());
  const size_t row = static_cast<size_t>(nb) * sizeof(F8Block);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const F8Block& src = blocks[static_cast<size_t>(r * nb + b)];
      EXPECT_EQ(std::memcmp(&split[r * row + b * kF8BlockElems], src.codes, kF8BlockElems), 0) << r << " " << b;
      float scale;
      std::memcpy(&scale, &split[r * row + k + b * 4], 4);
      EXPECT_EQ(scale, src.scale) << r << " " << b;
    }
  }
  std::vector<F8Block> back(blocks.size());
  join_f8_rows(split.data(), rows, k, back.data());
  EXPECT_EQ(std::memcmp(back.data(), blocks.data(), split.size()), 0);
}

TEST(F8Blocks, QuantisingKeepsEachValueWithinHalfAnE4m3Step) {
  // Blocks of very different magnitudes, one all zero, one with an outlier.
  constexpr int B = kF8BlockElems;
  std::vector<float> x = random_values(6 * B, 1, 1.0f);
  for (int i = 0; i < B; ++i) x[static_cast<size_t>(B + i)] *= 1e-4f;
  for (int i = 0; i < B; ++i) x[static_cast<size_t>(2 * B + i)] = 0.0f;
  x[3 * B + 17] = 3000.0f;
  for (int i = 0; i < B; ++i) x[static_cast<size_t>(4 * B + i)] *= 1e5f;
  std::vector<F8Block> blocks(6);
  ASSERT_EQ(quantize_f8_blocks(x.data(), blocks.data(), static_cast<int64_t>(x.size())), -1);
  std::vector<float> back(x.size());
  dequantize_f8_blocks(blocks.data(), back.data(), static_cast<int64_t>(x.size()));
  for (int b = 0; b < 6; ++b) {
    float amax = 0;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(b * B + i)]));
    EXPECT_EQ(blocks[static_cast<size_t>(b)].scale, amax / kF8E4M3Max) << "block " << b;
    for (int i = 0; i < B; ++i) {
      const size_t k = static_cast<size_t>(b * B + i);
      // Relative step of e4m3 is 2^-3 for normals; subnormals (below 2^-6 of
      // the scale unit) have an absolute step of 2^-9 scale units.
      const double unit = blocks[static_cast<size_t>(b)].scale;
      const double allowed = std::max(std::fabs(x[k]) * 0x1p-4, unit * 0x1p-10) * (1 + 1e-6);
      EXPECT_LE(std::fabs(back[k] - x[k]), allowed) << "block " << b << " element " << i;
    }
  }
  // The block maximum is represented exactly (code 448).
  EXPECT_EQ(back[3 * B + 17], 3000.0f);
  EXPECT_EQ(blocks[2].scale, 0.0f);
  for (int i = 0; i < B; ++i) EXPECT_EQ(back[static_cast<size_t>(2 * B + i)], 0.0f);
}

TEST(F8Blocks, NonFiniteValuesAndNanCodesAreReported) {
  constexpr int B = kF8BlockElems;
  std::vector<float> x = random_values(2 * B, 2, 1.0f);
  x[B + 9] = std::numeric_limits<float>::infinity();
  std::vector<F8Block> blocks(2);
  EXPECT_EQ(quantize_f8_blocks(x.data(), blocks.data(), 2 * B), B + 9);
  x[B + 9] = std::nanf("");
  EXPECT_EQ(quantize_f8_blocks(x.data(), blocks.data(), 2 * B), B + 9);

  std::vector<uint8_t> codes(2 * B, 0x38);  // 1.0
  std::vector<float> scales = {0.5f, 2.0f};
  ASSERT_EQ(pack_f8_blocks(codes.data(), scales.data(), blocks.data(), 2 * B), -1);
  EXPECT_EQ(blocks[1].scale, 2.0f);
  EXPECT_EQ(blocks[1].codes[5], 0x38);
  codes[B + 2] = 0xff;
  EXPECT_EQ(pack_f8_blocks(codes.data(), scales.data(), blocks.data(), 2 * B), B + 2);
  codes[B + 2] = 0x7f;
  EXPECT_EQ(pack_f8_blocks(codes.data(), scales.data(), blocks.data(), 2 * B), B + 2);
  codes[B + 2] = 0x38;
  scales[1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(pack_f8_blocks(codes.data(), scales.data(), blocks.data(), 2 * B), -3);
}

// Every non-NaN code in every position, with scales of several magnitudes.
std::vector<F8Block> every_code_blocks() {
  std::vector<F8Block> blocks(16);
  const float scales[] = {1.0f, 0.0078125f, 3.1e-5f, 17.25f, 1e-3f, 0.5f, 2.0f, 1.2345e-2f};
  int s = 0;
  int code = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    blocks[b].scale = scales[s++ % 8];
    for (uint8_t& c : blocks[b].codes) {
      do code = (code + 1) % 256;
      while ((code & 0x7f) == 0x7f);
      c = static_cast<uint8_t>(code);
    }
  }
  return blocks;
}

TEST(F8Blocks, EveryLevelDequantisesExactly) {
  const std::vector<F8Block> blocks = every_code_blocks();
  const int64_t n = static_cast<int64_t>(blocks.size()) * kF8BlockElems;
  std::vector<float> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const F8Block& b = blocks[static_cast<size_t>(i / kF8BlockElems)];
    want[static_cast<size_t>(i)] = f8e4m3_to_f32_exact(b.codes[i % kF8BlockElems]) * b.scale;
  }
  for (cpu::CpuIsa isa : test::kernel_levels_here()) {
    const cpu::QuantKernels& k = cpu::quant_kernels_for(DType::F8E4M3_B64, isa);
    EXPECT_EQ(k.act, DType::F32);
    EXPECT_EQ(k.quantize_act, nullptr);
    std::vector<float> got(static_cast<size_t>(n), -1.0f);
    k.dequantize_row(blocks.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(i)], &want[static_cast<size_t>(i)], 4), 0)
          << cpu::isa_name(isa) << " element " << i << ": " << got[static_cast<size_t>(i)] << " vs "
          << want[static_cast<size_t>(i)];
    }
  }
}

TEST(F8Blocks, EveryLevelsDotIsWithinTheRoundingBound) {
  for (int64_t n : {int64_t{64}, int64_t{576}, int64_t{4096}, int64_t{64 * 37}}) {
    const std::vector<float> w = random_values(n, 3 + static_cast<uint32_t>(n), 0.05f);
    std::vector<F8Block> blocks(static_cast<size_t>(n / kF8BlockElems));
    ASSERT_EQ(quantize_f8_blocks(w.data(), blocks.data(), n), -1);
    std::vector<float> wq(static_cast<size_t>(n));
    dequantize_f8_blocks(blocks.data(), wq.data(), n);
    const std::vector<float> x = random_values(n, 7 + static_cast<uint32_t>(n), 2.0f);
    double ref = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(wq[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
      abs_sum += std::fabs(static_cast<double>(wq[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)]);
    }
    const double bound = static_cast<double>(n + 16) * 0x1p-24 * abs_sum;
    for (cpu::CpuIsa isa : test::kernel_levels_here()) {
      const float got = cpu::quant_kernels_for(DType::F8E4M3_B64, isa).dot(blocks.data(), x.data(), n);
      EXPECT_LE(std::fabs(got - ref), bound) << cpu::isa_name(isa) << " n=" << n;
    }
    // And the quantisation error itself stays that of 3 mantissa bits.
    double exact = 0;
    for (int64_t i = 0; i < n; ++i) exact += static_cast<double>(w[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
    EXPECT_LE(std::fabs(ref - exact), abs_sum * 0x1p-4) << "n=" << n;
  }
}

TEST(F8Blocks, ZeroActivationsGiveZero) {
  const std::vector<F8Block> blocks = every_code_blocks();
  const int64_t n = static_cast<int64_t>(blocks.size()) * kF8BlockElems;
  const std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
  for (cpu::CpuIsa isa : test::kernel_levels_here()) {
    EXPECT_EQ(cpu::quant_kernels_for(DType::F8E4M3_B64, isa).dot(blocks.data(), zeros.data(), n), 0.0f)
        << cpu::isa_name(isa);
  }
}

}  // namespace
}  // namespace deepinfer
