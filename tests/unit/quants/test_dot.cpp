// Dot products of weight rows with activation vectors, for the native
// (AVX2 when built for it) and the portable kernels, against double-precision
// sums over the exactly dequantised weights.
//
// Two bounds are checked for every case:
//  1. Arithmetic: against w . x^ (x^ = the quantised activations, dequantised),
//     |dot - w.x^| <= (n/16 + 16) * 2^-24 * sum_i (|w_i| + o_i) |x^_i|
//     (float types: (n + 16) * 2^-24 * sum |w_i x_i|). The block sums are exact
//     int32; only the per-block scale products and the accumulation over blocks
//     round, a few roundings per block. o_i is the element's offset or min
//     (the weight it would have with all quant bits zero): the kernels add it
//     separately, so it bounds the terms that can cancel.
//  2. Activation quantisation: against w . x in double,
//     |dot - w.x| <= sum_i |w_i| e_i + bound 1, with e_i = d_b / 2 the rounding
//     error of 8-bit symmetric quantisation in activation block b. The scale
//     d_b satisfies 127 d_b >= max|x| over the block (nothing is clipped) and
//     exceeds max|x|/127 by at most one f16 ulp (Q8_1: the scale is
//     f16-rounded) or float rounding (Q8_K), i.e. a relative error of at
//     most about 1/254 of the block's largest activation per unit of |w|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/quants.h"
#include "core/error.h"
#include "core/half.h"
#include "reference_data.h"

namespace deepinfer {
namespace {

using cpu::QuantKernels;

// Byte range of the quant bits inside one block (zeroed to find the offsets).
std::pair<int, int> quant_bytes(DType t) {
  switch (t) {
    case DType::Q4_0: return {2, 18};
    case DType::Q4_1: return {4, 20};
    case DType::Q5_0: return {2, 22};
    case DType::Q5_1: return {4, 24};
    case DType::Q8_0: return {2, 34};
    case DType::Q2_K: return {16, 80};
    case DType::Q3_K: return {0, 96};
    case DType::Q4_K: return {16, 144};
    case DType::Q5_K: return {16, 176};
    case DType::Q6_K: return {0, 192};
    default: return {0, 0};
  }
}

struct Activations {
  std::vector<uint8_t> packed;  // what dot reads
  std::vector<double> values;   // x^, the activations the kernel effectively uses
  std::vector<double> error;    // e_i, the allowed quantisation error per element
};

// Reads a Q8_1 or Q8_K activation row back, checking its invariants on the way.
Activations pack_activations(const QuantKernels& k, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  Activations a;
  a.values.resize(x.size());
  a.error.assign(x.size(), 0.0);
  if (k.act == DType::F32) {
    a.packed.resize(x.size() * sizeof(float));
    std::memcpy(a.packed.data(), x.data(), a.packed.size());
    for (size_t i = 0; i < x.size(); ++i) a.values[i] = x[i];
    return a;
  }
  a.packed.assign(row_bytes(k.act, n), 0xCD);
  k.quantize_act(x.data(), a.packed.data(), n);
  const int block = dtype_info(k.act).block_elems;
  const int block_bytes = dtype_info(k.act).block_bytes;
  for (int64_t b = 0; b < n / block; ++b) {
    const uint8_t* p = a.packed.data() + b * block_bytes;
    double d;
    const int8_t* qs;
    if (k.act == DType::Q8_1) {
      float f[2];
      std::memcpy(f, p, 8);
      d = f[0];
      qs = reinterpret_cast<const int8_t*>(p + 8);
      int sum = 0;
      for (int l = 0; l < block; ++l) sum += qs[l];
      EXPECT_EQ(f[1], f[0] * static_cast<float>(sum)) << "sum of block " << b;
      EXPECT_EQ(f16_to_f32(f32_to_f16(f[0])), f[0]) << "block " << b << ": the scale is Q8_0's f16 one";
    } else {
      float f;
      std::memcpy(&f, p, 4);
      d = f;
      qs = reinterpret_cast<const int8_t*>(p + 4);
      for (int g = 0; g < block / 16; ++g) {
        int16_t bsum;
        std::memcpy(&bsum, p + 4 + block + 2 * g, 2);
        int want = 0;
        for (int l = 0; l < 16; ++l) want += qs[16 * g + l];
        EXPECT_EQ(bsum, want) << "bsums of block " << b << " group " << g;
      }
    }
    double amax = 0.0;
    for (int l = 0; l < block; ++l) amax = std::max(amax, std::fabs(double(x[b * block + l])));
    EXPECT_GE(127.0 * d, amax * (1 - 1e-6)) << "activation block " << b << " would be clipped";
    for (int l = 0; l < block; ++l) {
      const int64_t i = b * block + l;
      EXPECT_LE(std::abs(qs[l]), 127);
      a.values[i] = d * qs[l];
      a.error[i] = 0.5 * d * (1 + 1e-6) + 1e-6 * std::fabs(x[i]);
      EXPECT_LE(std::fabs(a.values[i] - x[i]), a.error[i]) << "activation " << i;
    }
  }
  return a;
}

std::vector<float> random_activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 29 == 3 ? 12.0f : 1.0f);
  return x;
}

void check_dot(const QuantKernels& k, const uint8_t* w_row, int64_t n, const std::vector<float>& x,
               const std::string& label) {
  std::vector<float> w(static_cast<size_t>(n)), offsets(static_cast<size_t>(n), 0.0f);
  k.dequantize_row(w_row, w.data(), n);
  const auto [q_begin, q_end] = quant_bytes(k.weight);
  if (q_end > q_begin) {
    std::vector<uint8_t> zeroed(w_row, w_row + row_bytes(k.weight, n));
    const int block_bytes = dtype_info(k.weight).block_bytes;
    for (size_t b = 0; b < zeroed.size(); b += block_bytes) {
      std::memset(zeroed.data() + b + q_begin, 0, q_end - q_begin);
    }
    k.dequantize_row(zeroed.data(), offsets.data(), n);
  }
  const Activations a = pack_activations(k, x);
  double exact = 0.0, truth = 0.0, magnitude = 0.0, quant_error = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    exact += double(w[i]) * a.values[i];
    truth += double(w[i]) * double(x[i]);
    magnitude += (std::fabs(double(w[i])) + std::fabs(double(offsets[i]))) * std::fabs(a.values[i]);
    quant_error += std::fabs(double(w[i])) * a.error[i];
  }
  const double rounds = k.act == DType::F32 ? double(n + 16) : double(n / 16 + 16);
  const double arithmetic_bound = rounds * std::ldexp(1.0, -24) * magnitude + 1e-30;
  const double got = k.dot(w_row, a.packed.data(), n);
  EXPECT_LE(std::fabs(got - exact), arithmetic_bound)
      << label << ": dot " << got << " vs dequantised " << exact;
  EXPECT_LE(std::fabs(got - truth), quant_error + arithmetic_bound)
      << label << ": dot " << got << " vs f32 activations " << truth;
}

class Dot : public ::testing::TestWithParam<std::string> {};

TEST_P(Dot, MatchesDoubleReferenceWithinBounds) {
  const test::QuantReference ref = test::load_quant_reference(GetParam());
  ASSERT_GT(ref.rows, 0);
  const int64_t block = dtype_info(ref.dtype).block_elems == 1 ? 8 : dtype_info(ref.dtype).block_elems;
  const int64_t all = ref.rows * ref.cols;  // the rows back to back form one long row
  std::vector<int64_t> lengths = {block, ref.cols - block, ref.cols, all};
  if (dtype_info(ref.dtype).block_elems == 1) lengths.push_back(ref.cols - 3);  // vector tail
  uint32_t seed = 1;
  for (cpu::CpuIsa isa : test::kernel_levels_here()) {
    const QuantKernels* k = &cpu::quant_kernels_for(ref.dtype, isa);
    for (int64_t n : lengths) {
      for (int64_t r = 0; r < ref.rows && r * ref.cols + n <= all; ++r) {
        const std::string label = std::string(cpu::isa_name(isa)) + " " + GetParam() + " n=" +
                                  std::to_string(n) + " row " + std::to_string(r);
        check_dot(*k, ref.row(r), n, random_activations(n, seed++), label);
      }
    }
  }
}

TEST_P(Dot, ZeroActivationsGiveZero) {
  const test::QuantReference ref = test::load_quant_reference(GetParam());
  ASSERT_GT(ref.rows, 0);
  for (cpu::CpuIsa isa : test::kernel_levels_here()) {
    const QuantKernels* k = &cpu::quant_kernels_for(ref.dtype, isa);
    const std::vector<float> x(static_cast<size_t>(ref.cols), 0.0f);
    const Activations a = pack_activations(*k, x);
    EXPECT_EQ(k->dot(ref.row(0), a.packed.data(), ref.cols), 0.0f);
  }
}

// Every kernel set quantises activations the same way, byte for byte, so
// the level a machine picks never changes which integers the dots see.
TEST_P(Dot, EveryLevelQuantisesActivationsLikeThePortableKernels) {
  const DType w = test::dtype_from_name(GetParam());
  const QuantKernels& portable = cpu::quant_kernels_portable(w);
  for (cpu::CpuIsa isa : test::kernel_levels_here()) {
    const QuantKernels& k = cpu::quant_kernels_for(w, isa);
    ASSERT_EQ(k.act, portable.act) << cpu::isa_name(isa);
    if (k.act == DType::F32) continue;
    // Activations of every magnitude, ties included (x.5 after scaling).
    for (uint32_t seed : {99u, 100u, 101u}) {
      std::vector<float> x = random_activations(1024, seed);
      x[3] = 0.0f;
      x[40] = 1e-30f;
      for (int i = 64; i < 96; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i - 80) * 0.5f;
      std::vector<uint8_t> a(row_bytes(k.act, 1024), 0xAB), b(a.size(), 0xAB);
      k.quantize_act(x.data(), a.data(), 1024);
      portable.quantize_act(x.data(), b.data(), 1024);
      EXPECT_EQ(a, b) << cpu::isa_name(isa) << " seed " << seed;
    }
  }
}

TEST(CpuIsa, NamesParseBackAndUnknownNamesAreRejected) {
  for (cpu::CpuIsa isa : {cpu::CpuIsa::Scalar, cpu::CpuIsa::Avx2, cpu::CpuIsa::Avx512, cpu::CpuIsa::Amx}) {
    EXPECT_EQ(cpu::parse_isa(cpu::isa_name(isa)), isa);
  }
  EXPECT_THROW(cpu::parse_isa("avx1024"), Error);
  EXPECT_THROW(cpu::parse_isa(""), Error);
  // A level above this machine's is refused rather than run into SIGILL.
  if (cpu::hardware_isa() != cpu::CpuIsa::Amx) {
    EXPECT_THROW(cpu::quant_kernels_for(DType::Q4_0, cpu::CpuIsa::Amx), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(AllKernelDTypes, Dot, ::testing::ValuesIn(test::kernel_dtype_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deepinfer
