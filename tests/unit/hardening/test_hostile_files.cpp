// Hostile model and tokenizer files (issue "Hardening"): each is generated here
// and must end in a clear deepinfer::Error that names the problem, without a
// crash, a hang, or memory sized by a forged count.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "core/file_io.h"
#include "loader/safetensors.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"
#include "../../support/error_message.h"
#include "../loader/loader_test_util.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using test::Bytes;
using test::GgufBuilder;
using test::TempDir;

using deepinfer::testing::error_of;

#define EXPECT_ERROR_HAS(message, needle)                                                   \
  do {                                                                                      \
    const std::string m_ = (message);                                                       \
    EXPECT_NE(m_.find(needle), std::string::npos) << "message: '" << m_ << "'"; \
  } while (0)

std::unique_ptr<LoadedModel> open_model(const std::string& path) {
  static std::unique_ptr<Backend> cpu = create_backend(DeviceType::CPU, {});
  return LoadedModel::open(path, *cpu);
}

// --- 1. deep nesting -------------------------------------------------------

TEST(HostileFiles, SafetensorsHeaderNestedDeeplyIsRefusedWhileParsing) {
  // A shape element nested 100,000 levels: building the error message used to
  // dump it recursively and overflow the stack.
  const std::string header = R"({"t":{"dtype":"F32","shape":[)" + std::string(100000, '[') + "1" +
                             std::string(100000, ']') + R"(],"data_offsets":[0,4]}})";
  const std::string m = error_of([&] { SafetensorsFile::parse(test::safetensors_bytes(header, 4)); });
  EXPECT_ERROR_HAS(m, "safetensors header: JSON nested deeper than 3 levels");
  // Wide instead of deep: a shape of a million dimensions is refused by rank.
  std::string wide = R"({"t":{"dtype":"U8","shape":[1)";
  for (int i = 0; i < 1000000; ++i) wide += ",1";
  wide += R"(],"data_offsets":[0,1]}})";
  EXPECT_ERROR_HAS(error_of([&] { SafetensorsFile::parse(test::safetensors_bytes(wide, 1)); }), "at most 16 are supported");
}

TEST(HostileFiles, TokenizerJsonNestedDeeplyIsRefusedWhileParsing) {
  // A normalizer Sequence nested 50,000 levels (copying it overflowed the stack).
  std::string normalizer;
  for (int i = 0; i < 50000; ++i) normalizer += R"({"type":"Sequence","normalizers":[)";
  normalizer += R"({"type":"NFC"})";
  for (int i = 0; i < 50000; ++i) normalizer += "]}";
  const std::string json = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":)" + normalizer + "}";
  EXPECT_ERROR_HAS(error_of([&] { Tokenizer::from_json(json); }), "JSON nested deeper than 64 levels");
}

// Found by fuzz_tokenizer_json in the long run: a Sequence of byte-level
// pre-tokenizers doubles the text at each step, so encoding took exponential
// time. Growth beyond 16x now fails the encode with a clear error.
TEST(HostileFiles, TokenizerThatGrowsTextExponentiallyIsRefused) {
  std::string parts;
  for (int i = 0; i < 24; ++i) parts += std::string(i ? "," : "") + R"({"type":"ByteLevel","add_prefix_space":false})";
  const std::string pre = R"({"type":"Sequence","pretokenizers":[)" + parts + "]}";
  const std::string json = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":)" + pre + "}";
  auto tok = Tokenizer::from_json(json);
  EXPECT_ERROR_HAS(error_of([&] { tok->encode("Hello world, \xc3\xa9t\xc3\xa9!", false); }),
                   "the pre-tokenizer sequence grew");
  std::string norms;
  for (int i = 0; i < 24; ++i) norms += std::string(i ? "," : "") + R"({"type":"Replace","pattern":{"String":"a"},"content":"aa"})";
  const std::string doubling = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"Sequence","normalizers":[)" +
                               norms + "]}}";
  auto tok2 = Tokenizer::from_json(doubling);
  EXPECT_ERROR_HAS(error_of([&] { tok2->encode("aaaa", false); }), "the normalizer sequence grew");
}

// --- 2. a FIFO as a path ------------------------------------------------------

TEST(HostileFiles, FifoAsModelOrTokenizerPathIsAnErrorNotAHang) {
  TempDir dir;
  const fs::path fifo = dir.path() / "m.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_ERROR_HAS(error_of([&] { open_model(fifo.string()); }), "is a FIFO; a regular file is needed");
  EXPECT_ERROR_HAS(error_of([&] { Tokenizer::from_file(fifo.string()); }), "is a FIFO");
  // A checkpoint folder whose config.json is a FIFO.
  const fs::path ckpt = dir.path() / "ckpt";
  fs::create_directories(ckpt);
  ASSERT_EQ(::mkfifo((ckpt / "config.json").c_str(), 0600), 0);
  EXPECT_ERROR_HAS(error_of([&] { open_model(ckpt.string()); }), "is a FIFO");
  // A folder or a device where a file is expected.
  EXPECT_ERROR_HAS(error_of([&] { read_regular_file(ckpt.string(), 1 << 20); }), "is a folder; a regular file is needed");
  EXPECT_ERROR_HAS(error_of([&] { read_regular_file("/dev/zero", 1 << 20); }), "is a device; a regular file is needed");
}

// --- 3 and 4. counts: validated against the file, never wrapped -------------

// tests/data/hf_tiny/llama with config.json edited by `edit`.
fs::path tiny_llama_with(const TempDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path src = fs::path(DEEPINFER_SOURCE_DIR) / "tests/data/hf_tiny/llama";
  const fs::path dst = dir.path() / "llama";
  fs::create_directories(dst);
  fs::copy_file(src / "model.safetensors", dst / "model.safetensors");
  std::ifstream in(src / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  edit(cfg);
  test::write_file(dst / "config.json", cfg.dump());
  return dst;
}

TEST(HostileFiles, HfLayerCountIsCheckedAgainstTheCheckpointBeforeAllocating) {
  for (uint64_t layers : {uint64_t{1000000000}, uint64_t{2147483647}}) {
    TempDir dir;
    const fs::path p = tiny_llama_with(dir, [&](nlohmann::json& c) { c["num_hidden_layers"] = layers; });
    const std::string m = error_of([&] { open_model(p.string()); });
    EXPECT_ERROR_HAS(m, "num_hidden_layers = " + std::to_string(layers) + ", but the checkpoint holds");
  }
}

TEST(HostileFiles, HfIntegersAreExactOrAnErrorNamingTheField) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* expected;
  };
  const Case cases[] = {
      {"num_hidden_layers", nlohmann::json(uint64_t{1} << 40), "num_hidden_layers = 1099511627776"},
      {"num_hidden_layers", -1, "num_hidden_layers = -1 is out of range [1, 1024]"},
      {"hidden_size", 64.5, "field 'hidden_size' must be an integer, got 64.5"},
      {"hidden_size", "64", "field 'hidden_size' must be an integer"},
      {"intermediate_size", nlohmann::json(uint64_t{1} << 32), "'intermediate_size' = 4294967296 is out of range"},
      {"num_attention_heads", 1e300, "must be an integer"},
      {"rms_norm_eps", 1e300, "'rms_norm_eps' = 1e+300 is not a finite number"},
      {"max_position_embeddings", int64_t{-5}, "the context length (max_position_embeddings / context_length) is -5"},
      {"tie_word_embeddings", 1, "'tie_word_embeddings' must be true or false"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    const fs::path p = tiny_llama_with(dir, [&](nlohmann::json& cfg) { cfg[c.field] = c.value; });
    SCOPED_TRACE(c.field);
    EXPECT_ERROR_HAS(error_of([&] { open_model(p.string()); }), c.expected);
  }
}

// A minimal GGUF "llama" file: the metadata a loader reads first, `n_tensors`
// small f32 tensors, and optional extra metadata.
Bytes llama_gguf(uint64_t block_count, std::optional<uint64_t> context_length, int vocab_tokens, int embedding_rows) {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv<uint64_t>("llama.block_count", 10, block_count);
  b.kv<uint32_t>("llama.embedding_length", 4, 8);
  b.kv<uint32_t>("llama.feed_forward_length", 4, 16);
  b.kv<uint32_t>("llama.attention.head_count", 4, 2);
  if (context_length) b.kv<uint64_t>("llama.context_length", 10, *context_length);
  Bytes tokens;
  test::put<uint32_t>(tokens, 8);  // element type: string
  test::put<uint64_t>(tokens, static_cast<uint64_t>(vocab_tokens));
  for (int i = 0; i < vocab_tokens; ++i) test::put_str(tokens, "t" + std::to_string(i));
  b.kv_raw("tokenizer.ggml.tokens", 9, tokens);
  const uint64_t emb_bytes = 8ull * static_cast<uint64_t>(embedding_rows) * 4;
  b.tensor("token_embd.weight", 0, {8, static_cast<uint64_t>(embedding_rows)}, 0);
  b.tensor("blk.0.attn_norm.weight", 0, {8}, emb_bytes);
  return b.build(emb_bytes + 32);
}

TEST(HostileFiles, GgufCountsAreCheckedAndNamed) {
  TempDir dir;
  auto open_bytes = [&](const Bytes& bytes) {
    const fs::path p = dir.path() / "m.gguf";
    test::write_file(p, bytes);
    return error_of([&] { open_model(p.string()); });
  };
  // block_count far above the tensors present: refused before per-layer lists exist.
  EXPECT_ERROR_HAS(open_bytes(llama_gguf(1000000000, 64, 16, 16)), "llama.block_count = 1000000000, but the file holds 2 tensors");
  EXPECT_ERROR_HAS(open_bytes(llama_gguf(2147483647, 64, 16, 16)), "llama.block_count = 2147483647, but the file holds");
  // Above int32: an error naming the key, not a wrapped count or a std::vector message.
  EXPECT_ERROR_HAS(open_bytes(llama_gguf(4294967295, 64, 16, 16)), "GGUF: llama.block_count = 4294967295 is out of range");
  EXPECT_ERROR_HAS(open_bytes(llama_gguf(1, 4294967295, 16, 16)), "GGUF: llama.context_length = 4294967295 is out of range");
  EXPECT_ERROR_HAS(open_bytes(llama_gguf(1, 1, 16, 16)), "the context length (max_position_embeddings / context_length) is 1");
  // A token list shorter than the embedding: ids past it would vanish from the output.
  EXPECT_ERROR_HAS(open_bytes(llama_gguf(1, 64, 12, 16)),
                   "tokenizer.ggml.tokens lists 12 tokens, but the model's vocabulary (embedding rows) is 16");
}

}  // namespace
}  // namespace deepinfer
