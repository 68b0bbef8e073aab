// Files written by the reference Python writers (scripts/gen_loader_fixtures.py,
// PyPI `gguf` and `safetensors`); the expected values repeat the script's.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "loader/gguf.h"
#include "loader/hf_checkpoint.h"
#include "loader/safetensors.h"
#include "loader_test_util.h"

namespace deepinfer {
namespace {

using test::data_dir;

TEST(GgufFixture, MetadataOfEveryType) {
  GgufFile f = GgufFile::open((data_dir() / "tiny.gguf").string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "tiny");
  EXPECT_EQ(f.get_u64("t.u8"), 200u);
  EXPECT_EQ(f.get_i64("t.i8"), -100);
  EXPECT_EQ(f.get_u64("t.u16"), 60000u);
  EXPECT_EQ(f.get_i64("t.i16"), -30000);
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("t.i32"), -2000000000);
  EXPECT_EQ(f.get_f32("t.f32"), 1.5f);
  EXPECT_EQ(f.get_u64("t.u64"), (1ull << 63) + 5);
  EXPECT_EQ(f.get_i64("t.i64"), -(1ll << 40));
  EXPECT_EQ(f.get_f32("t.f64"), 0.25f);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.str"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_string_array("t.arr_str"), (std::vector<std::string_view>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_i32_array("t.arr_i32"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_i32_array("t.arr_u8"), (std::vector<int32_t>{1, 2, 255}));
  EXPECT_EQ(f.get_f32_array("t.arr_f32"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(f.get_f32_array("t.arr_f64"), (std::vector<float>{2.5f}));
  EXPECT_EQ(f.value("t.arr_bool").count, 2u);
  EXPECT_EQ(format_gguf_value(f.value("t.arr_bool")), "[2 x bool: true, false]");
  EXPECT_EQ(format_gguf_value(f.value("t.arr_nested")), "[2 x array: [2 x i32: 1, 2], [1 x i32: 3]]");
}

TEST(GgufFixture, Tensors) {
  GgufFile f = GgufFile::open((data_dir() / "tiny.gguf").string());
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.tensors()[0].name, "f32");

  Tensor a = f.tensor("f32");
  ASSERT_EQ(a.ndim(), 2);
  EXPECT_EQ(a.size(0), 2);
  EXPECT_EQ(a.size(1), 3);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.data_as<const float>()[i], static_cast<float>(i));

  Tensor h = f.tensor("f16");
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(f16_to_f32(h.data_as<const uint16_t>()[3]), 4.0f);

  EXPECT_EQ(f.tensor("i32").data_as<const int32_t>()[1], -8);

  Tensor q = f.tensor("q8_0");
  EXPECT_EQ(q.dtype(), DType::Q8_0);
  EXPECT_EQ(q.size(0), 2);
  EXPECT_EQ(q.size(1), 32);
  EXPECT_EQ(q.nbytes(), 68u);
  const auto* qb = q.data_as<const uint8_t>();
  uint16_t scale;
  std::memcpy(&scale, qb + 34, 2);
  EXPECT_EQ(f16_to_f32(scale), 0.5f);
  EXPECT_EQ(static_cast<int8_t>(qb[34 + 2 + 31]), 31);

  Tensor bf = f.tensor("bf16");
  EXPECT_EQ(bf.dtype(), DType::BF16);
  EXPECT_EQ(bf.size(0), 1);
  EXPECT_EQ(bf.size(1), 2);
  EXPECT_EQ(bf16_to_f32(bf.data_as<const uint16_t>()[1]), -2.0f);
}

TEST(GgufFixture, EveryTruncationBeforeTheLastTensorEndThrows) {
  test::Bytes full = test::read_file(data_dir() / "tiny.gguf");
  GgufFile f = GgufFile::parse(full);
  uint64_t needed = 0;
  for (const auto& t : f.tensors()) needed = std::max(needed, f.data_offset() + t.offset + t.nbytes);
  ASSERT_LE(needed, full.size());
  for (size_t n = 0; n < full.size(); ++n) {
    std::span<const uint8_t> prefix(full.data(), n);
    if (n < needed) {
      EXPECT_THROW(GgufFile::parse(prefix), Error) << n;
    } else {
      EXPECT_NO_THROW(GgufFile::parse(prefix)) << n;  // only trailing padding is cut
    }
  }
}

TEST(SafetensorsFixture, EveryDtype) {
  SafetensorsFile f = SafetensorsFile::open((data_dir() / "tiny.safetensors").string());
  EXPECT_EQ(f.metadata().at("format"), "np");
  EXPECT_EQ(f.metadata().at("note"), "deepinfer fixture");
  ASSERT_EQ(f.tensors().size(), 8u);

  Tensor a = f.tensor("f32");
  EXPECT_EQ(a.describe(), "f32[2, 3] cpu");
  EXPECT_EQ(a.data_as<const float>()[5], 5.0f);
  EXPECT_EQ(f16_to_f32(f.tensor("f16").data_as<const uint16_t>()[1]), -0.5f);
  EXPECT_EQ(f.tensor("i32").data_as<const int32_t>()[3], 4);
  EXPECT_EQ(f.tensor("i64").data_as<const int64_t>()[0], -(1ll << 40));
  EXPECT_EQ(f.tensor("i8").data_as<const int8_t>()[2], -3);
  EXPECT_EQ(f.tensor("u8").data_as<const uint8_t>()[0], 255);
  EXPECT_EQ(f.tensor("u8").dtype(), DType::U8);

  const SafetensorsTensorInfo* s = f.find_tensor("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  Tensor st = f.tensor(*s);  // a scalar is viewed as [1]
  EXPECT_EQ(st.ndim(), 1);
  EXPECT_EQ(st.data_as<const float>()[0], 3.0f);

  const SafetensorsTensorInfo* e = f.find_tensor("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->nbytes, 0u);
  EXPECT_EQ(f.tensor("empty").size(0), 0);
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
  EXPECT_THROW(f.tensor("absent"), Error);
}

TEST(SafetensorsFixture, EveryTruncationThrows) {
  test::Bytes full = test::read_file(data_dir() / "tiny.safetensors");
  for (size_t n = 0; n < full.size(); ++n) {
    std::span<const uint8_t> prefix(full.data(), n);
    EXPECT_THROW(SafetensorsFile::parse(prefix), Error) << n;
  }
}

TEST(HfCheckpointFixture, ShardedWithIndex) {
  HfCheckpoint c = HfCheckpoint::open((data_dir() / "sharded").string());
  EXPECT_EQ(c.config().at("hidden_size"), 4);
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"embed.weight", "layer.0.weight", "norm.weight"}));
  EXPECT_TRUE(c.has_tensor("norm.weight"));
  EXPECT_FALSE(c.has_tensor("lm_head.weight"));
  Tensor e = c.tensor("embed.weight");
  EXPECT_EQ(e.describe(), "f32[2, 4] cpu");
  EXPECT_EQ(e.data_as<const float>()[7], 7.0f);
  Tensor l = c.tensor("layer.0.weight");
  EXPECT_EQ(l.dtype(), DType::F16);
  EXPECT_EQ(f16_to_f32(l.data_as<const uint16_t>()[15]), 0.5f);
  EXPECT_THROW(c.tensor("lm_head.weight"), Error);
}

}  // namespace
}  // namespace deepinfer
