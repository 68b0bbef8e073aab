// GGUF parser on files written by the test's own writer: valid layouts, every
// value type and conversion, and malformed files that must raise deepinfer::Error.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "loader/gguf.h"
#include "loader_test_util.h"

namespace deepinfer {
namespace {

using test::Bytes;
using test::GgufBuilder;
using test::put;
using test::put_str;

constexpr uint32_t kU8 = 0, kI8 = 1, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9,
                   kU64 = 10, kF64 = 12;
constexpr uint32_t kGgmlF32 = 0, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8;

GgufFile parse(const Bytes& b) { return GgufFile::parse(b); }

// A file with metadata and two F32 tensors, the second ending exactly at EOF.
Bytes small_valid_file() {
  GgufBuilder g;
  g.kv_str("general.architecture", "tiny").kv<uint32_t>("tiny.block_count", kU32, 7);
  g.tensor("a", kGgmlF32, {3, 2}, 0).tensor("b", kGgmlF32, {4}, 32);
  return g.build(48);
}

TEST(Gguf, ParsesHeaderMetadataAndTensors) {
  Bytes b = small_valid_file();
  GgufFile f = parse(b);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.data_offset() + 48, b.size());
  EXPECT_EQ(f.get_string("general.architecture"), "tiny");
  EXPECT_EQ(f.get_u32("tiny.block_count"), 7u);
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[1].key, "tiny.block_count");

  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo* a = f.find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->n_dims, 2);
  EXPECT_EQ(a->shape[0], 2);  // outermost first: ggml ne {3, 2} -> [2, 3]
  EXPECT_EQ(a->shape[1], 3);
  EXPECT_EQ(a->nbytes, 24u);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);

  Tensor t = f.tensor("b");
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(t.ndim(), 1);
  EXPECT_EQ(t.size(0), 4);
  EXPECT_EQ(static_cast<const uint8_t*>(t.data()), b.data() + f.data_offset() + 32);
  EXPECT_THROW(f.tensor("missing"), Error);
}

TEST(Gguf, AcceptsVersion2AndRejectsOthers) {
  for (uint32_t v : {2u, 3u}) EXPECT_EQ(parse(GgufBuilder(v).build(0)).version(), v);
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    Bytes b = GgufBuilder(v).build(0);
    EXPECT_THROW(parse(b), Error) << v;
  }
  try {
    Bytes b = GgufBuilder(1).build(0);
    parse(b);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("version 1"), std::string::npos) << e.what();
  }
  Bytes bad_magic = GgufBuilder().build(0);
  bad_magic[0] = 'X';
  EXPECT_THROW(parse(bad_magic), Error);
}

TEST(Gguf, EveryScalarTypeAndConversion) {
  GgufBuilder g;
  g.kv<uint8_t>("u8", kU8, 200).kv<int8_t>("i8", kI8, -5).kv<uint16_t>("u16", 2, 60000);
  g.kv<int16_t>("i16", 3, -300).kv<uint32_t>("u32", kU32, 4000000000u).kv<int32_t>("i32", kI32, -7);
  g.kv<float>("f32", kF32, 1.5f).kv<uint8_t>("bool", kBool, 1).kv<uint64_t>("u64", kU64, ~0ull);
  g.kv<int64_t>("i64", 11, -(1ll << 40)).kv<double>("f64", kF64, 0.25).kv_str("str", "hi");
  Bytes b = g.build(0);
  GgufFile f = parse(b);
  EXPECT_EQ(f.get_u64("u8"), 200u);
  EXPECT_EQ(f.get_i64("i8"), -5);
  EXPECT_EQ(f.get_u32("u16"), 60000u);
  EXPECT_EQ(f.get_i64("i16"), -300);
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i64("i32"), -7);
  EXPECT_EQ(f.get_f32("f32"), 1.5f);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_u64("u64"), ~0ull);
  EXPECT_EQ(f.get_i64("i64"), -(1ll << 40));
  EXPECT_EQ(f.get_f32("f64"), 0.25f);
  EXPECT_EQ(f.get_f32("u32"), 4e9f);  // integers convert to float
  EXPECT_EQ(f.get_string("str"), "hi");
  EXPECT_TRUE(f.has("str"));
  EXPECT_FALSE(f.has("nope"));

  EXPECT_THROW(f.get_u64("i8"), Error);     // negative
  EXPECT_THROW(f.get_i64("u64"), Error);    // above int64 max
  EXPECT_THROW(f.get_u32("u64"), Error);    // above uint32 max
  EXPECT_THROW(f.get_u64("f32"), Error);    // floats do not truncate to integers
  EXPECT_THROW(f.get_f32("str"), Error);
  EXPECT_THROW(f.get_string("u32"), Error);
  EXPECT_THROW(f.get_bool("u8"), Error);
  EXPECT_THROW(f.get_string("nope"), Error);
  EXPECT_THROW(f.get_array_size("u8"), Error);
  try {
    f.get_u64("nope");
    ADD_FAILURE() << "missing key did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }

  EXPECT_FALSE(f.find_u64("nope").has_value());
  EXPECT_FALSE(f.find_string("nope").has_value());
  EXPECT_FALSE(f.find_bool("nope").has_value());
  EXPECT_EQ(f.find_u32("u8").value(), 200u);
  EXPECT_EQ(f.find_f32("f64").value(), 0.25f);
  EXPECT_EQ(f.find_i64("i8").value(), -5);
  EXPECT_THROW(f.find_u64("str"), Error);  // present with the wrong type still throws
}

Bytes array_value(uint32_t elem_type, uint64_t count, const Bytes& elems) {
  Bytes b;
  put<uint32_t>(b, elem_type);
  put<uint64_t>(b, count);
  b.insert(b.end(), elems.begin(), elems.end());
  return b;
}

TEST(Gguf, Arrays) {
  Bytes strs, i32s, u8s, f64s, big_u64, nested;
  for (const char* s : {"a", "", "ccc"}) put_str(strs, s);
  for (int32_t v : {1, -2, 3}) put<int32_t>(i32s, v);
  u8s = {1, 2, 255};
  put<double>(f64s, 2.5);
  put<double>(f64s, -1.0);
  put<uint64_t>(big_u64, 1ull << 40);
  Bytes inner1 = array_value(kU8, 2, {7, 8});
  Bytes inner2 = array_value(kString, 1, {});
  put_str(inner2, "x");
  nested = inner1;
  nested.insert(nested.end(), inner2.begin(), inner2.end());

  GgufBuilder g;
  g.kv_raw("strs", kArray, array_value(kString, 3, strs));
  g.kv_raw("i32s", kArray, array_value(kI32, 3, i32s));
  g.kv_raw("u8s", kArray, array_value(kU8, 3, u8s));
  g.kv_raw("f64s", kArray, array_value(kF64, 2, f64s));
  g.kv_raw("big", kArray, array_value(kU64, 1, big_u64));
  g.kv_raw("nested", kArray, array_value(kArray, 2, nested));
  g.kv_raw("empty", kArray, array_value(kF32, 0, {}));
  Bytes b = g.build(0);
  GgufFile f = parse(b);

  auto s = f.get_string_array("strs");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], "a");
  EXPECT_EQ(s[1], "");
  EXPECT_EQ(s[2], "ccc");
  EXPECT_EQ(f.get_i32_array("i32s"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_i32_array("u8s"), (std::vector<int32_t>{1, 2, 255}));
  EXPECT_EQ(f.get_f32_array("f64s"), (std::vector<float>{2.5f, -1.0f}));
  EXPECT_EQ(f.get_f32_array("i32s"), (std::vector<float>{1.f, -2.f, 3.f}));
  EXPECT_TRUE(f.get_f32_array("empty").empty());
  EXPECT_EQ(f.get_array_size("nested"), 2u);
  EXPECT_EQ(f.get_array_size("strs"), 3u);
  EXPECT_EQ(format_gguf_value(f.value("nested")), "[2 x array: [2 x u8: 7, 8], [1 x string: \"x\"]]");
  EXPECT_EQ(format_gguf_value(f.value("strs"), 2), "[3 x string: \"a\", \"\", ...]");

  EXPECT_THROW(f.get_string_array("i32s"), Error);
  EXPECT_THROW(f.get_i32_array("big"), Error);  // does not fit int32
  EXPECT_THROW(f.get_i32_array("f64s"), Error);
  EXPECT_THROW(f.get_i32_array("strs"), Error);
  EXPECT_THROW(f.get_f32_array("nested"), Error);
  EXPECT_THROW(f.get_string("strs"), Error);
}

TEST(Gguf, CustomAlignment) {
  GgufBuilder g;
  g.kv<uint32_t>("general.alignment", kU32, 64);
  g.tensor("a", kGgmlF32, {4}, 0).tensor("b", kGgmlF32, {4}, 64);
  Bytes b = g.build(80, 64);
  GgufFile f = parse(b);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor("b").data(), b.data() + f.data_offset() + 64);

  GgufBuilder misaligned;
  misaligned.kv<uint32_t>("general.alignment", kU32, 64).tensor("a", kGgmlF32, {4}, 32);
  EXPECT_THROW(parse(misaligned.build(64, 64)), Error);
}

TEST(Gguf, RejectsBadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
    GgufBuilder g;
    g.kv<uint32_t>("general.alignment", kU32, a);
    EXPECT_THROW(parse(g.build(0)), Error) << a;
  }
  GgufBuilder as_string;
  as_string.kv_str("general.alignment", "32");
  EXPECT_THROW(parse(as_string.build(0)), Error);
}

TEST(Gguf, TensorTypesAndBlockSizes) {
  GgufBuilder g;
  g.tensor("q8", kGgmlQ8_0, {64, 2}, 0).tensor("bf", 30, {2}, 160).tensor("i8", 24, {3}, 192);
  g.tensor("empty", kGgmlF32, {0, 5}, 224);
  Bytes b = g.build(224);
  GgufFile f = parse(b);
  EXPECT_EQ(f.find_tensor("q8")->nbytes, 2u * 2 * 34);
  EXPECT_EQ(f.tensor("q8").dtype(), DType::Q8_0);
  EXPECT_EQ(f.tensor("bf").dtype(), DType::BF16);
  EXPECT_EQ(f.tensor("i8").dtype(), DType::I8);
  EXPECT_EQ(f.find_tensor("empty")->nbytes, 0u);
  EXPECT_EQ(f.find_tensor("empty")->numel(), 0);

  EXPECT_EQ(dtype_from_ggml_type(12), DType::Q4_K);
  EXPECT_EQ(dtype_from_ggml_type(27), DType::I64);
  try {
    dtype_from_ggml_type(16);
    ADD_FAILURE() << "IQ2_XXS accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
  }
}

// Each case is a file that must be rejected with deepinfer::Error.
struct BadCase {
  const char* name;
  Bytes bytes;
};

std::vector<BadCase> malformed_files() {
  std::vector<BadCase> cases;
  auto add = [&](const char* name, const GgufBuilder& g, size_t data = 64) { cases.push_back({name, g.build(data)}); };
  {
    GgufBuilder g;
    g.n_kv_override = 1ull << 60;
    add("huge kv count", g);
  }
  {
    GgufBuilder g;
    g.n_tensors_override = ~0ull;
    add("huge tensor count", g);
  }
  {
    GgufBuilder g;
    g.kv_str("a", "x").kv_str("b", "y");
    g.n_kv_override = 3;
    add("kv count past the end", g, 0);
  }
  {
    Bytes v;
    put<uint64_t>(v, 1ull << 62);
    add("huge string length", GgufBuilder().kv_raw("s", kString, v));
  }
  add("huge array count", GgufBuilder().kv_raw("a", kArray, array_value(kU32, 1ull << 61, {})));
  add("huge string array count", GgufBuilder().kv_raw("a", kArray, array_value(kString, 1ull << 40, {})));
  add("huge nested array count", GgufBuilder().kv_raw("a", kArray, array_value(kArray, 1ull << 40, {})));
  add("unknown value type", GgufBuilder().kv<uint32_t>("k", 13, 0));
  add("unknown array element type", GgufBuilder().kv_raw("a", kArray, array_value(99, 1, {0, 0, 0, 0})));
  add("bool value 2", GgufBuilder().kv<uint8_t>("b", kBool, 2));
  add("bool array value 3", GgufBuilder().kv_raw("a", kArray, array_value(kBool, 2, {1, 3})));
  {
    Bytes v = array_value(kU8, 0, {});
    for (int i = 0; i < 20; ++i) v = array_value(kArray, 1, v);
    add("arrays nested too deep", GgufBuilder().kv_raw("deep", kArray, v));
  }
  add("duplicate key", GgufBuilder().kv_str("k", "a").kv_str("k", "b"));
  add("duplicate tensor", GgufBuilder().tensor("t", kGgmlF32, {4}, 0).tensor("t", kGgmlF32, {4}, 32));
  add("zero dims", GgufBuilder().tensor("t", kGgmlF32, {}, 0));
  add("five dims", GgufBuilder().tensor("t", kGgmlF32, {1, 1, 1, 1, 1}, 0));
  add("unsupported type", GgufBuilder().tensor("t", 16, {256}, 0));
  add("unknown type", GgufBuilder().tensor("t", 1000, {4}, 0));
  add("innermost not a block multiple", GgufBuilder().tensor("t", kGgmlQ4_0, {16}, 0));
  add("dimension above int64", GgufBuilder().tensor("t", kGgmlF32, {1ull << 63}, 0));
  add("element count overflows", GgufBuilder().tensor("t", kGgmlF32, {1ull << 32, 1ull << 32, 1ull << 32}, 0));
  add("byte count overflows", GgufBuilder().tensor("t", kGgmlF32, {1ull << 62}, 0));
  add("zero dim with huge others", GgufBuilder().tensor("t", kGgmlF32, {1ull << 62, 0}, 0));
  add("data past EOF", GgufBuilder().tensor("t", kGgmlF32, {32}, 0));
  add("offset past EOF", GgufBuilder().tensor("t", kGgmlF32, {1}, 1ull << 40));
  add("offset + size wraps", GgufBuilder().tensor("t", kGgmlF32, {8}, ~0ull - 31));
  add("unaligned offset", GgufBuilder().tensor("t", kGgmlF32, {1}, 4));
  add("overlapping tensors", GgufBuilder().tensor("a", kGgmlF32, {16}, 0).tensor("b", kGgmlF32, {4}, 32));
  add("alignment above u32", GgufBuilder().kv<uint64_t>("general.alignment", kU64, 1ull << 40));
  return cases;
}

TEST(Gguf, MalformedFilesThrow) {
  for (const BadCase& c : malformed_files()) {
    EXPECT_THROW(parse(c.bytes), Error) << c.name;
  }
}

TEST(Gguf, FileWithoutTensorsMayOmitPadding) {
  Bytes b = GgufBuilder().kv<uint8_t>("x", kU8, 1).build(0, 1);
  GgufFile f = parse(b);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.data_offset(), b.size());
}

TEST(Gguf, EveryTruncationThrows) {
  const Bytes full = small_valid_file();
  GgufFile f = parse(full);
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse(prefix), Error) << "prefix of " << n << " bytes";
  }
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  const Bytes full = small_valid_file();
  std::mt19937 rng(1234);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = full;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    try {
      GgufFile f = parse(b);
      for (const auto& kv : f.metadata()) format_gguf_value(kv.value);
      for (const auto& t : f.tensors()) EXPECT_LE(f.data_offset() + t.offset + t.nbytes, b.size());
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    }
  }
  // Both outcomes occur: corruption of tensor data is harmless, of the header is not.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

TEST(Gguf, OpenReportsMissingAndEmptyFiles) {
  test::TempDir dir;
  EXPECT_THROW(GgufFile::open((dir.path() / "absent.gguf").string()), Error);
  test::write_file(dir.path() / "empty.gguf", Bytes{});
  EXPECT_THROW(GgufFile::open((dir.path() / "empty.gguf").string()), Error);
  test::write_file(dir.path() / "ok.gguf", small_valid_file());
  GgufFile f = GgufFile::open((dir.path() / "ok.gguf").string());
  EXPECT_EQ(f.get_u32("tiny.block_count"), 7u);
  GgufFile moved = std::move(f);
  EXPECT_EQ(moved.get_string("general.architecture"), "tiny");
  EXPECT_EQ(moved.tensor("a").size(1), 3);
}

}  // namespace
}  // namespace deepinfer
