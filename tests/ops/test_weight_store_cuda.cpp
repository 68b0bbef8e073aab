// WeightStore on the CUDA backend, which has no kernels for GGUF blocks: a
// quantised matrix (real GGUF rows from tests/data/quants) arrives in the
// activation dtype, each value the reference dequantisation rounded once, and
// fused projections of quantised parts stack the same rows.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../unit/quants/reference_data.h"
#include "core/half.h"
#include "model/weight_store.h"
#include "op_test_util.h"

namespace deepinfer::testing {
namespace {

class WeightStoreCudaTest : public CudaVsCpuTest {};

// The stored matrix's 16-bit values, row-major.
std::vector<uint16_t> download_u16(Backend& b, const Tensor& t) {
  std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
  b.copy(Tensor(host.data(), t.dtype(), t.shape()), t);
  b.synchronize();
  return host;
}

TEST_F(WeightStoreCudaTest, QuantizedMatricesAreDequantizedToTheActivationDType) {
  const DType act = gpu().activation_dtype();
  if (act != DType::BF16 && act != DType::F16) GTEST_SKIP() << "activations in " << dtype_name(act);
  for (const char* name : {"q4_0", "q4_1", "q8_0", "q4_K", "q6_K"}) {
    SCOPED_TRACE(name);
    const test::QuantReference ref = test::load_quant_reference(name);
    ASSERT_GT(ref.rows, 1);
    const Tensor host(const_cast<uint8_t*>(ref.raw.data()), ref.dtype, {ref.rows, ref.cols});
    WeightStore store(gpu());
    const Tensor m = store.matrix(host);
    EXPECT_EQ(m.dtype(), act);
    EXPECT_EQ(store.stored_bytes(host), static_cast<size_t>(ref.rows * ref.cols) * 2);
    std::vector<uint16_t> want(ref.expected.size());
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = act == DType::BF16 ? f32_to_bf16(ref.expected[i]) : f32_to_f16(ref.expected[i]);
    }
    EXPECT_EQ(download_u16(gpu(), m), want);
    // Gate and up as two quantised halves, stacked into one matrix.
    const int64_t half = ref.rows / 2;
    const Tensor top(const_cast<uint8_t*>(ref.row(0)), ref.dtype, {half, ref.cols});
    const Tensor bottom(const_cast<uint8_t*>(ref.row(half)), ref.dtype, {half, ref.cols});
    const Tensor fused = store.fused_matrix({top, bottom});
    ASSERT_TRUE(fused.defined());
    EXPECT_EQ(fused.dtype(), act);
    std::vector<uint16_t> want_fused(want.begin(), want.begin() + 2 * half * ref.cols);
    EXPECT_EQ(download_u16(gpu(), fused), want_fused);
  }
}

}  // namespace
}  // namespace deepinfer::testing
