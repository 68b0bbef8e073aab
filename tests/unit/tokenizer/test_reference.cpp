// Exactness against Hugging Face tokenizers: ids with and without special tokens,
// decoded text with and without special tokens, and streaming detokenization, for
// every reference text of every family (data from scripts/gen_tokenizer_reference.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loader/gguf.h"
#include "test_util.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::test {

using json = nlohmann::json;

const Tokenizer& family_tokenizer(const std::string& family) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[family];
  if (!slot) {
    std::string text = read_xz(shared_tokenizer_dir(family) + "/tokenizer.json.xz");
    if (text.empty()) throw std::runtime_error("cannot read tokenizer.json.xz of " + family);
    slot = Tokenizer::from_json(text, nullptr);
  }
  return *slot;
}

namespace {

std::vector<json> reference_rows(const std::string& name) {
  std::string data = read_xz(source_dir() + "/tests/data/tokenizer/" + name + ".jsonl.xz");
  std::vector<json> rows;
  std::istringstream in(data);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

// Compares every reference row and reports how many texts pass. check_skip: also
// compare decode(skip_special_tokens=true), which needs the same special flags.
void check_against_reference(const Tokenizer& tok, const std::string& name, bool check_skip = true) {
  auto rows = reference_rows(name);
  ASSERT_GE(rows.size(), 300u) << name;
  size_t pass = 0, reported = 0;
  for (const auto& row : rows) {
    const std::string text = row["text"];
    auto ids = tok.encode(text, false);
    auto ids_special = tok.encode(text, true);
    auto expect_ids = row["ids"].get<std::vector<int32_t>>();
    auto expect_special = row["ids_special"].get<std::vector<int32_t>>();
    std::string decoded = tok.decode(expect_special, false);
    std::string decoded_skip = tok.decode(expect_special, true);
    StreamingDetokenizer stream(tok, false);
    std::string streamed;
    bool chunks_valid = true;
    for (int32_t id : expect_special) {
      std::string chunk = stream.push(id);
      chunks_valid &= tok::utf8_is_valid(chunk);
      streamed += chunk;
    }
    streamed += stream.finish();
    bool ok = ids == expect_ids && ids_special == expect_special && decoded == row["decoded"] &&
              (!check_skip || decoded_skip == row["decoded_skip"]) && streamed == decoded && chunks_valid;
    if (ok) {
      ++pass;
    } else if (reported++ < 5) {
      ADD_FAILURE() << name << ": mismatch for text " << json(text).dump() << "\n  ids      " << show(ids)
                    << "\n  expected " << show(expect_ids) << "\n  special  " << show(ids_special) << "\n  expected "
                    << show(expect_special) << "\n  decoded  " << json(decoded).dump() << "\n  expected "
                    << row["decoded"].dump() << "\n  skip     " << json(decoded_skip).dump() << "\n  expected "
                    << row["decoded_skip"].dump() << "\n  streamed " << json(streamed).dump();
    }
  }
  std::printf("[ reference ] %s: %zu/%zu texts pass\n", name.c_str(), pass, rows.size());
  EXPECT_EQ(pass, rows.size()) << name;
}

class FamilyReference : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyReference, MatchesHuggingFace) { check_against_reference(family_tokenizer(GetParam()), GetParam()); }

INSTANTIATE_TEST_SUITE_P(Families, FamilyReference,
                         ::testing::Values("deepseek_v3", "qwen3", "llama3_1", "gptoss", "gemma3"),
                         [](const auto& info) { return info.param; });

std::string model_path(const std::string& file) { return source_dir() + "/models/" + file; }

TEST(GgufReference, SmolLM2MatchesRebuiltTokenizerJson) {
  const auto path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not fetched: " << path;
  auto tok = Tokenizer::from_file(path);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->chat_template().empty());
  check_against_reference(*tok, "smollm2_gguf");
}

TEST(GgufReference, Gemma3MatchesTokenizerJson) {
  const auto path = model_path("gemma-3-270m-q4_k_m.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not fetched: " << path;
  GgufFile gguf = GgufFile::open(path);
  auto tok = Tokenizer::from_gguf(gguf);
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->bos_id(), 2);
  // The GGUF marks <start_of_turn>, <mask>, <unusedN>... as control tokens (special),
  // tokenizer.json does not, so decoding with skip_special_tokens differs by design.
  check_against_reference(*tok, "gemma3", /*check_skip=*/false);
}

TEST(FolderLoad, ReadsConfigForStopTokensAndTemplate) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("deepinfer_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string text = read_xz(shared_tokenizer_dir("llama3_1") + "/tokenizer.json.xz");
  { std::ofstream(dir / "tokenizer.json") << text; }
  fs::copy_file(shared_tokenizer_dir("llama3_1") + "/tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  auto tok = Tokenizer::from_file(dir.string());
  fs::remove_all(dir);
  EXPECT_EQ(tok->eos_token(), "<|eot_id|>");
  EXPECT_EQ(tok->eos_id(), 128009);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->bos_token(), "<|begin_of_text|>");
  EXPECT_FALSE(tok->chat_template().empty());
  auto eos = tok->eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), 128001), eos.end());  // <|end_of_text|>
  EXPECT_EQ(tok->encode("Hi", true).front(), 128000);
}

}  // namespace
}  // namespace deepinfer::test
