// Safetensors files and checkpoint folders written by the test: valid layouts
// and malformed ones that must raise deepinfer::Error.
#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/hf_checkpoint.h"
#include "loader/safetensors.h"
#include "loader_test_util.h"

namespace deepinfer {
namespace {

using test::Bytes;
using test::safetensors_bytes;

SafetensorsFile parse(const Bytes& b) { return SafetensorsFile::parse(b); }

TEST(Safetensors, ParsesHeaderAndData) {
  Bytes b = safetensors_bytes(
      R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},"__metadata__":{"k":"v"}}   )",
      16);
  SafetensorsFile f = parse(b);
  EXPECT_EQ(f.metadata().at("k"), "v");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "b");  // sorted by name
  Tensor w = f.tensor("w");
  EXPECT_EQ(w.describe(), "bf16[2, 2] cpu");
  EXPECT_EQ(static_cast<const uint8_t*>(w.data()), b.data() + f.data_offset());
  EXPECT_EQ(static_cast<const uint8_t*>(f.tensor("b").data()), b.data() + f.data_offset() + 8);
  EXPECT_EQ(f.data_offset() + 16, b.size());
}

TEST(Safetensors, HighRankIsAnErrorOnlyWhenViewed) {
  Bytes b = safetensors_bytes(R"({"t":{"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]}})", 2);
  SafetensorsFile f = parse(b);
  EXPECT_EQ(f.find_tensor("t")->shape.size(), 5u);
  EXPECT_THROW(f.tensor("t"), Error);
}

TEST(Safetensors, MalformedFilesThrow) {
  struct Case {
    const char* name;
    std::string header;
    size_t data;
  };
  const Case cases[] = {
      {"not json", "{\"a\":", 0},
      {"not an object", "[1,2]", 0},
      {"entry not an object", R"({"t":3})", 0},
      {"missing dtype", R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4},
      {"dtype not a string", R"({"t":{"dtype":1,"shape":[1],"data_offsets":[0,4]}})", 4},
      {"unknown dtype", R"({"t":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4},
      {"unsupported dtype", R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8},
      {"lowercase dtype", R"({"t":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4},
      {"missing shape", R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4},
      {"negative dim", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4},
      {"float dim", R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4},
      {"shape overflow", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4},
      {"zero dim with huge others",
       R"({"t":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})", 0},
      {"missing offsets", R"({"t":{"dtype":"F32","shape":[1]}})", 4},
      {"three offsets", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8},
      {"negative offset", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4},
      {"reversed offsets", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4},
      {"offsets past EOF", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 4},
      {"huge offsets", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}})", 4},
      {"size mismatch", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12},
      {"duplicate tensor",
       R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2},
      {"metadata not an object", R"({"__metadata__":[1]})", 0},
      {"metadata value not a string", R"({"__metadata__":{"k":1}})", 0},
      {"duplicate metadata key", R"({"__metadata__":{"k":"a","k":"b"}})", 0},
  };
  for (const Case& c : cases) {
    EXPECT_THROW(parse(safetensors_bytes(c.header, c.data)), Error) << c.name;
  }
}

TEST(Safetensors, BadHeaderLengths) {
  Bytes b = safetensors_bytes("{}", 0);
  EXPECT_NO_THROW(parse(b));
  Bytes too_long = b;
  too_long[0] = 3;  // claims 3 header bytes, 2 present
  EXPECT_THROW(parse(too_long), Error);
  Bytes huge = b;
  huge[7] = 0x80;
  EXPECT_THROW(parse(huge), Error);
  Bytes over_limit(8 + 2, ' ');
  uint64_t n = SafetensorsFile::kMaxHeaderBytes + 1;
  std::memcpy(over_limit.data(), &n, 8);
  EXPECT_THROW(parse(over_limit), Error);
  EXPECT_THROW(parse(Bytes{1, 0, 0}), Error);
}

class CheckpointDir : public ::testing::Test {
 protected:
  void write(const std::string& name, std::string_view text) { test::write_file(dir_.path() / name, text); }
  void write(const std::string& name, const Bytes& bytes) { test::write_file(dir_.path() / name, bytes); }
  static Bytes one_tensor(const std::string& name) {
    return safetensors_bytes(R"({")" + name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  }
  HfCheckpoint open() { return HfCheckpoint::open(dir_.path().string()); }
  test::TempDir dir_;
};

TEST_F(CheckpointDir, AllSafetensorsFilesWithoutIndex) {
  write("config.json", R"({"model_type":"llama"})");
  write("a.safetensors", one_tensor("x"));
  write("b.safetensors", one_tensor("y"));
  write("notes.txt", "ignored");
  HfCheckpoint c = open();
  EXPECT_EQ(c.config().at("model_type"), "llama");
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c.tensor("y").size(0), 1);
}

TEST_F(CheckpointDir, TensorDefinedTwiceThrows) {
  write("config.json", "{}");
  write("a.safetensors", one_tensor("x"));
  write("b.safetensors", one_tensor("x"));
  EXPECT_THROW(open(), Error);
}

TEST_F(CheckpointDir, MissingOrBadConfigThrows) {
  write("a.safetensors", one_tensor("x"));
  EXPECT_THROW(open(), Error);
  write("config.json", "{not json");
  EXPECT_THROW(open(), Error);
  write("config.json", "[]");
  EXPECT_THROW(open(), Error);
}

TEST_F(CheckpointDir, NoWeightsThrows) {
  write("config.json", "{}");
  EXPECT_THROW(open(), Error);
  EXPECT_THROW(HfCheckpoint::open((dir_.path() / "absent").string()), Error);
}

TEST_F(CheckpointDir, IndexErrors) {
  write("config.json", "{}");
  write("a.safetensors", one_tensor("x"));
  const std::string index = std::string(HfCheckpoint::kIndexFile);
  write(index, R"({"weight_map":{"x":"a.safetensors"}})");
  EXPECT_EQ(open().tensor_names(), std::vector<std::string>{"x"});

  const char* bad[] = {
      R"({"weight_map":{"x":"missing.safetensors"}})",  // file does not exist
      R"({"weight_map":{"y":"a.safetensors"}})",        // tensor not in the file
      R"({"weight_map":{"x":"../a.safetensors"}})",     // outside the folder
      R"({"weight_map":{"x":"/etc/passwd"}})",
      R"({"weight_map":{"x":1}})",
      R"({"weight_map":{"x":"a.safetensors","x":"a.safetensors"}})",  // tensor listed twice
      R"({"weight_map":[]})",
      R"({"metadata":{}})",
      "not json",
  };
  for (const char* text : bad) {
    write(index, text);
    EXPECT_THROW(open(), Error) << text;
  }
}

}  // namespace
}  // namespace deepinfer
