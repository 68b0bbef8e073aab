// A numerical fault in one request (its logits hold no finite value) ends that
// request with a clear error and leaves the engine and the other requests of
// the same batch running: it used to throw out of the step and kill the loop.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "engine/engine.h"
#include "loader/safetensors.h"
#include "../../support/greedy_reference.h"
#include "../loader/loader_test_util.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using deepinfer::testing::greedy_params;

const fs::path kTiny = fs::path(DEEPINFER_SOURCE_DIR) / "tests/data/hf_tiny";

// tests/data/hf_tiny/llama with one embedding row set to NaN: a prompt that
// holds that token turns every hidden state of its sequence into NaN.
fs::path llama_with_nan_row(const test::TempDir& dir, int32_t token) {
  const fs::path dst = dir.path() / "llama_nan";
  fs::create_directories(dst);
  fs::copy_file(kTiny / "llama/config.json", dst / "config.json");
  test::Bytes bytes = test::read_file(kTiny / "llama/model.safetensors");
  const SafetensorsFile f = SafetensorsFile::parse(bytes);
  const SafetensorsTensorInfo* emb = f.find_tensor("model.embed_tokens.weight");
  EXPECT_TRUE(emb && emb->dtype == DType::F32 && emb->shape.size() == 2);
  const size_t hidden = static_cast<size_t>(emb->shape[1]);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float* row = reinterpret_cast<float*>(bytes.data() + f.data_offset() + emb->offset) + static_cast<size_t>(token) * hidden;
  for (size_t i = 0; i < hidden; ++i) std::memcpy(row + i, &nan, sizeof nan);
  test::write_file(dst / "model.safetensors", bytes);
  return dst;
}

EngineConfig tiny_config(const fs::path& model) {
  EngineConfig c;
  c.model_path = model.string();
  c.tokenizer_path = (kTiny / "tokenizer.json").string();
  c.max_model_len = 128;
  c.kv_cache_tokens = 2048;
  c.batch_invariant = true;
  return c;
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  std::string error;
};

std::vector<Outcome> run_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[engine.add_request(prompts[i], greedy_params(max_tokens))] = i;
  std::vector<Outcome> out(prompts.size());
  while (engine.has_unfinished()) {
    for (RequestOutput& o : engine.step()) {
      Outcome& r = out[index.at(o.request_id)];
      for (const TokenOutput& t : o.new_tokens) r.tokens.push_back(t.token);
      if (o.finished) {
        r.reason = o.finish_reason;
        r.error = o.error;
      }
    }
    engine.check_integrity();
  }
  return out;
}

TEST(NumericalFault, FailsOnlyTheAffectedRequestAndTheEngineGoesOn) {
  const std::vector<std::vector<int32_t>> healthy = {{5, 17, 33, 61, 90}, {11, 12, 13}, {200, 150, 100, 50, 25, 3}};
  // The clean model's greedy outputs, and a token none of them uses.
  std::vector<Outcome> clean;
  {
    Engine engine(tiny_config(kTiny / "llama"));
    clean = run_batch(engine, healthy, 12);
  }
  int32_t poison = -1;
  for (int32_t t = 300; t > 0 && poison < 0; --t) {
    bool used = false;
    for (size_t i = 0; i < healthy.size(); ++i) {
      used |= std::find(healthy[i].begin(), healthy[i].end(), t) != healthy[i].end();
      used |= std::find(clean[i].tokens.begin(), clean[i].tokens.end(), t) != clean[i].tokens.end();
    }
    if (!used) poison = t;
  }
  ASSERT_GT(poison, 0);

  test::TempDir dir;
  Engine engine(tiny_config(llama_with_nan_row(dir, poison)));
  std::vector<std::vector<int32_t>> prompts = healthy;
  prompts.insert(prompts.begin() + 1, {7, poison, 9});
  for (int round = 0; round < 2; ++round) {  // the engine serves on after the fault
    const std::vector<Outcome> got = run_batch(engine, prompts, 12);
    EXPECT_EQ(got[1].reason, FinishReason::Abort);
    EXPECT_TRUE(got[1].tokens.empty());
    EXPECT_NE(got[1].error.find("numerical fault"), std::string::npos) << got[1].error;
    for (size_t i = 0; i < healthy.size(); ++i) {
      const Outcome& g = got[i < 1 ? i : i + 1];
      EXPECT_EQ(g.tokens, clean[i].tokens) << "healthy request " << i;
      EXPECT_EQ(g.reason, FinishReason::Length);
      EXPECT_TRUE(g.error.empty());
    }
  }
  EXPECT_EQ(engine.stats().numerical_faults, 2);
  EXPECT_EQ(engine.stats().kv_usage, 0.0);
}

}  // namespace
}  // namespace deepinfer
