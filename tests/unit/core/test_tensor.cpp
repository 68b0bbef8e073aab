#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"

using namespace deepinfer;

TEST(Tensor, ContiguousStridesAndRows) {
  std::vector<float> buf(24);
  Tensor t(buf.data(), DType::F32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride_bytes(0), 48);
  EXPECT_EQ(t.stride_bytes(1), 16);
  EXPECT_EQ(t.stride_bytes(2), 4);
  EXPECT_TRUE(t.is_contiguous());
  Tensor r = t.row(1);
  EXPECT_EQ(r.ndim(), 2);
  EXPECT_EQ(r.data_as<float>(), buf.data() + 12);
  Tensor n = t.reshape({6, 4}).narrow(1, 1, 2);
  EXPECT_EQ(n.data_as<float>(), buf.data() + 1);
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_THROW(t.row(2), Error);
  EXPECT_THROW(t.reshape({5, 5}), Error);
}

TEST(Tensor, SelectDropsAnOuterDimension) {
  std::vector<float> buf(24);
  Tensor t(buf.data(), DType::F32, {2, 3, 4});
  Tensor head = t.select(1, 2);  // [2, 4], rows 48 bytes apart
  ASSERT_EQ(head.ndim(), 2);
  EXPECT_EQ(head.size(0), 2);
  EXPECT_EQ(head.size(1), 4);
  EXPECT_EQ(head.stride_bytes(0), 48);
  EXPECT_EQ(head.data_as<float>(), buf.data() + 8);
  EXPECT_EQ(t.select(0, 1).data_as<float>(), buf.data() + 12);
  EXPECT_THROW(t.select(2, 0), Error);  // the innermost dimension
  EXPECT_THROW(t.select(1, 3), Error);
  EXPECT_THROW(head.row(0).select(0, 0), Error);  // rank 1
}

TEST(Tensor, QuantisedRowBytes) {
  std::vector<uint8_t> buf(4 * 34);
  Tensor t(buf.data(), DType::Q8_0, {2, 64});
  EXPECT_EQ(t.stride_bytes(0), 68);
  EXPECT_EQ(t.nbytes(), 136u);
  EXPECT_THROW(Tensor(buf.data(), DType::Q8_0, {2, 33}), Error);
  EXPECT_EQ(row_bytes(DType::Q4_K, 256), 144u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 256), 210u);
}

TEST(Half, RoundTrips) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-5f}) {
    EXPECT_FLOAT_EQ(f16_to_f32(f32_to_f16(f)), f16_to_f32(f32_to_f16(f16_to_f32(f32_to_f16(f)))));
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.0f)), 3.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // ties round to even
}
