// Dequantisation against the gguf package's numpy reference on real GGUF rows
// (SmolLM2, Gemma 3), gguf-quantised random data and random bytes. The
// reference evaluates the same float expressions in the same order
// (d * q, then + m or - dmin * m), so the results must match bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/quants.h"
#include "core/error.h"
#include "core/half.h"
#include "model/weight_store.h"
#include "reference_data.h"

namespace deepinfer {
namespace {

using cpu::QuantKernels;

class Dequantize : public ::testing::TestWithParam<std::string> {};

void expect_bit_exact(const QuantKernels& k, const test::QuantReference& ref, const char* which) {
  std::vector<float> out(static_cast<size_t>(ref.cols));
  for (int64_t r = 0; r < ref.rows; ++r) {
    k.dequantize_row(ref.row(r), out.data(), ref.cols);
    int mismatches = 0;
    for (int64_t i = 0; i < ref.cols; ++i) {
      uint32_t got, want;
      std::memcpy(&got, &out[i], 4);
      std::memcpy(&want, ref.expected_row(r) + i, 4);
      if (got != want && mismatches++ < 3) {
        ADD_FAILURE() << which << " " << dtype_name(ref.dtype) << " row " << r << " element " << i
                      << ": got " << out[i] << " want " << ref.expected_row(r)[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << which << " " << dtype_name(ref.dtype) << " row " << r;
  }
}

TEST_P(Dequantize, MatchesGgufReferenceBitForBit) {
  const test::QuantReference ref = test::load_quant_reference(GetParam());
  ASSERT_GT(ref.rows, 0);
  for (cpu::CpuIsa isa : test::kernel_levels_here()) {
    expect_bit_exact(cpu::quant_kernels_for(ref.dtype, isa), ref, std::string(cpu::isa_name(isa)).c_str());
  }
}

// Rows are independent blocks: dequantising a prefix writes exactly that prefix.
TEST_P(Dequantize, PrefixWritesOnlyItsElements) {
  const test::QuantReference ref = test::load_quant_reference(GetParam());
  ASSERT_GT(ref.rows, 0);
  const int64_t block = dtype_info(ref.dtype).block_elems == 1 ? 8 : dtype_info(ref.dtype).block_elems;
  std::vector<float> out(static_cast<size_t>(ref.cols), -7.0f);
  cpu::quant_kernels(ref.dtype).dequantize_row(ref.row(0), out.data(), block);
  EXPECT_EQ(std::memcmp(out.data(), ref.expected_row(0), block * sizeof(float)), 0);
  for (int64_t i = block; i < ref.cols; ++i) ASSERT_EQ(out[i], -7.0f) << i;
}

// How a device backend receives GGUF blocks: every row dequantised and
// rounded to its activation dtype, exactly the rounded reference values.
TEST_P(Dequantize, RowsForDeviceBackendsRoundTheReference) {
  const test::QuantReference ref = test::load_quant_reference(GetParam());
  ASSERT_GT(ref.rows, 0);
  if (!is_quantized(ref.dtype)) GTEST_SKIP() << "plain dtype";
  const Tensor host(const_cast<uint8_t*>(ref.raw.data()), ref.dtype, {ref.rows, ref.cols});
  for (DType to : {DType::BF16, DType::F16, DType::F32}) {
    const std::vector<char> out = dequantize_rows(host, to);
    ASSERT_EQ(out.size(), static_cast<size_t>(ref.rows) * row_bytes(to, ref.cols));
    int mismatches = 0;
    for (int64_t i = 0; i < ref.rows * ref.cols; ++i) {
      const float want = ref.expected[static_cast<size_t>(i)];
      bool same;
      if (to == DType::F32) {
        same = std::memcmp(out.data() + i * 4, &want, 4) == 0;
      } else {
        uint16_t got;
        std::memcpy(&got, out.data() + i * 2, 2);
        same = got == (to == DType::BF16 ? f32_to_bf16(want) : f32_to_f16(want));
      }
      if (!same && mismatches++ < 3) ADD_FAILURE() << dtype_name(to) << " element " << i;
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(to);
  }
  // A stack of expert matrices: leading dimensions are rows too.
  if (ref.rows % 2 == 0) {
    const Tensor stack(const_cast<uint8_t*>(ref.raw.data()), ref.dtype, {2, ref.rows / 2, ref.cols});
    EXPECT_EQ(dequantize_rows(stack, DType::BF16), dequantize_rows(host, DType::BF16));
  }
  EXPECT_THROW(dequantize_rows(host, DType::I32), Error);
}

INSTANTIATE_TEST_SUITE_P(AllKernelDTypes, Dequantize,
                         ::testing::ValuesIn(test::kernel_dtype_names()),
                         [](const auto& info) { return info.param; });

TEST(QuantKernels, TableDescribesEachWeightDType) {
  for (const std::string& name : test::kernel_dtype_names()) {
    const DType w = test::dtype_from_name(name);
    for (const QuantKernels* k : {&cpu::quant_kernels(w), &cpu::quant_kernels_portable(w)}) {
      EXPECT_EQ(k->weight, w) << name;
      const int block = dtype_info(w).block_elems;
      const DType want_act = block == 1 ? DType::F32 : block == 32 ? DType::Q8_1 : DType::Q8_K;
      EXPECT_EQ(k->act, want_act) << name;
      EXPECT_EQ(k->quantize_act == nullptr, k->act == DType::F32) << name;
      EXPECT_NE(k->dequantize_row, nullptr) << name;
      EXPECT_NE(k->dot, nullptr) << name;
    }
  }
}

TEST(QuantKernels, UnsupportedDTypesThrow) {
  for (DType d : {DType::I32, DType::I64, DType::I8, DType::U8, DType::Q8_1, DType::Q8_K,
                  DType::Count, static_cast<DType>(200)}) {
    EXPECT_THROW(cpu::quant_kernels(d), Error) << static_cast<int>(d);
    EXPECT_THROW(cpu::quant_kernels_portable(d), Error) << static_cast<int>(d);
  }
}

}  // namespace
}  // namespace deepinfer
