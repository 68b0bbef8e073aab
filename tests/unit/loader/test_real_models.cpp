// The real GGUF models in models/ (scripts/fetch_models.sh); skipped when absent.
// Expected values were read with the PyPI `gguf` package's GGUFReader.
#include <gtest/gtest.h>

#include <filesystem>

#include "loader/gguf.h"
#include "loader_test_util.h"

namespace deepinfer {
namespace {

std::string model_path(const char* name) { return (test::models_dir() / name).string(); }

#define SKIP_IF_ABSENT(path) \
  if (!std::filesystem::exists(path)) GTEST_SKIP() << (path) << " not present (run scripts/fetch_models.sh)"

double sum_f32(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += t.data_as<const float>()[i];
  return s;
}

TEST(RealModels, SmolLM2) {
  const std::string path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  SKIP_IF_ABSENT(path);
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_FALSE(f.get_string("tokenizer.chat_template").empty());

  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(tokens.back(), "ectable");
  EXPECT_EQ(f.get_array_size("tokenizer.ggml.merges"), 48900u);
  auto types = f.get_i32_array("tokenizer.ggml.token_type");
  ASSERT_EQ(types.size(), 49152u);
  EXPECT_EQ(types[0], 3);

  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.data_offset(), 1785664u);
  Tensor emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.describe(), "q8_0[49152, 576] cpu");
  EXPECT_EQ(emb.nbytes(), 30081024u);
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").describe(), "q4_1[576, 1536] cpu");
  Tensor norm = f.tensor("output_norm.weight");
  EXPECT_EQ(norm.describe(), "f32[576] cpu");
  EXPECT_EQ(norm.data_as<const float>()[0], 1.7578125f);
  EXPECT_NEAR(sum_f32(norm), 1038.33203125, 1e-6);
}

TEST(RealModels, Gemma3) {
  const std::string path = model_path("gemma-3-270m-q4_k_m.gguf");
  SKIP_IF_ABSENT(path);
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f.get_u32("gemma3.block_count"), 18u);
  EXPECT_EQ(f.get_u32("gemma3.attention.sliding_window"), 512u);
  EXPECT_EQ(f.get_u32("general.file_type"), 15u);
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 262144u);
  EXPECT_EQ(tokens[1], "<eos>");
  EXPECT_EQ(tokens.back(), "<unused6241>");
  auto scores = f.get_f32_array("tokenizer.ggml.scores");
  ASSERT_EQ(scores.size(), 262144u);
  EXPECT_EQ(scores[0], -1000.0f);
  EXPECT_EQ(f.tensors().size(), 236u);
  EXPECT_EQ(f.tensor("token_embd.weight").describe(), "q8_0[262144, 640] cpu");
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").dtype(), DType::Q5_0);
  EXPECT_NEAR(sum_f32(f.tensor("output_norm.weight")), 16861.6953125, 1e-6);
}

}  // namespace
}  // namespace deepinfer
