// Engine-level tests on the real default model (SmolLM2-135M-Instruct, GGUF
// Q4_1): continuous batching, preemption, chunked prefill, prefix caching and
// abort must not change what a greedy request generates, and must not leak KV.
// They run in batch-invariant mode so that equality is exact by construction.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"
#include "../../support/greedy_reference.h"
#include "../../support/smollm2_model.h"

using deepinfer::testing::greedy_params;

namespace deepinfer {
namespace {

EngineConfig base_config() {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.batch_invariant = true;
  c.max_model_len = 512;
  c.max_num_seqs = 64;
  c.max_num_batched_tokens = 256;
  c.kv_cache_tokens = 8192;
  return c;
}

// Prompts of mixed lengths (a few to ~80 tokens), all different.
std::vector<std::string> mixed_prompts(int n) {
  const std::vector<std::string> parts = {
      "The history of the printing press", "Water boils at", "def add(a, b):\n    return",
      "In a small village by the sea, there lived an old fisherman who", "1, 2, 3, 5, 8, 13,",
      "The best way to learn a language is", "Photosynthesis converts", "Once upon a time"};
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string p = parts[i % parts.size()];
    for (int r = 0; r < i % 5; ++r) p += " and then " + parts[(i + r + 1) % parts.size()];
    out.push_back(p + " (" + std::to_string(i) + ")");
  }
  return out;
}

// Runs each prompt alone (one request in flight at a time).
std::vector<std::vector<int32_t>> run_alone(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                            int32_t max_tokens) {
  std::vector<std::vector<int32_t>> result;
  for (const auto& p : prompts) {
    uint64_t id = engine.add_request(p, greedy_params(max_tokens));
    std::vector<int32_t> tokens;
    while (engine.has_unfinished()) {
      for (auto& o : engine.step()) {
        EXPECT_EQ(o.request_id, id);
        for (auto& t : o.new_tokens) tokens.push_back(t.token);
      }
    }
    result.push_back(tokens);
  }
  engine.check_integrity();
  return result;
}

std::vector<std::vector<int32_t>> run_together(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                               int32_t max_tokens) {
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[engine.add_request(prompts[i], greedy_params(max_tokens))] = i;
  std::vector<std::vector<int32_t>> result(prompts.size());
  while (engine.has_unfinished()) {
    for (auto& o : engine.step()) {
      for (auto& t : o.new_tokens) result[index.at(o.request_id)].push_back(t.token);
    }
    engine.check_integrity();
  }
  engine.check_integrity();
  return result;
}

std::vector<std::vector<int32_t>> encode_all(const Engine& engine, const std::vector<std::string>& texts) {
  std::vector<std::vector<int32_t>> ids;
  for (const auto& t : texts) ids.push_back(engine.tokenizer().encode(t, true));
  return ids;
}

TEST(Engine, SixtyFourBatchedRequestsMatchSequentialRuns) {
  REQUIRE_SMOLLM2();
  Engine engine(base_config());
  auto prompts = encode_all(engine, mixed_prompts(64));
  auto alone = run_alone(engine, prompts, 6);
  auto together = run_together(engine, prompts, 6);
  ASSERT_EQ(alone.size(), together.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(alone[i].size(), 6u);
    EXPECT_EQ(alone[i], together[i]) << "request " << i;
  }
}

TEST(Engine, ManySequencesSharingAPrefixFitOneStepsPageTables) {
  REQUIRE_SMOLLM2();
  // 40 pages of KV; 24 sequences sharing a 30-page prefix list ~750 pages in
  // one decode step's tables, far more than the pool holds.
  EngineConfig c = base_config();
  c.kv_cache_tokens = 16 * 40;
  Engine engine(c);
  std::string doc;
  for (int i = 0; doc.size() < 2400; ++i) doc += mixed_prompts(8)[i % 8] + ". ";
  std::vector<int32_t> shared = engine.tokenizer().encode(doc, true);
  shared.resize(16 * 30);
  // The first request caches the prefix; the others then share it.
  engine.add_request(shared, greedy_params(2));
  while (engine.has_unfinished()) engine.step();
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> p = shared;
    p.push_back(100 + i);
    engine.add_request(p, greedy_params(3));
  }
  int finished = 0;
  while (engine.has_unfinished()) {
    for (const auto& o : engine.step()) finished += o.finished;
  }
  EXPECT_EQ(finished, 24);
  EXPECT_GT(engine.stats().prefix_hit_tokens, 20 * 16 * 29);
}

TEST(Engine, AHostKvTierGivesTheSameTokensAndLeaksNothing) {
  REQUIRE_SMOLLM2();
  // A cache of 8 pages: too small to time the tiers' calibration steps at
  // full size, and small enough that a second prompt evicts the first.
  EngineConfig c = base_config();
  c.kv_cache_tokens = 16 * 8;
  c.kv_offloading_bytes = 8u << 20;
  Engine engine(c);
  const auto a = engine.tokenizer().encode(mixed_prompts(8)[3] + " and " + mixed_prompts(8)[0], true);
  std::string long_text;
  for (const std::string& p : mixed_prompts(8)) long_text += p + " ";
  auto b = engine.tokenizer().encode(long_text, true);
  ASSERT_GT(b.size(), 110u);
  b.resize(110);
  ASSERT_GT(a.size(), 32u);
  ASSERT_LE(a.size() + 4, 16u * 8);
  ASSERT_GT(b.size() + 4, 16u * 6) << "b must push a's blocks out of the device's pages";
  ASSERT_LE(b.size() + 4, 16u * 8);
  const auto first = run_alone(engine, {a, b}, 4);
  engine.check_integrity();
  const auto again = run_alone(engine, {a}, 4);
  EXPECT_EQ(again[0], first[0]);
  EXPECT_GT(engine.stats().tier_hit_tokens, 0) << "the prompt evicted from the device comes back from host memory";
  engine.check_integrity();
}

TEST(Engine, PreemptionAndResumeGiveTheSameTokens) {
  REQUIRE_SMOLLM2();
  EngineConfig c = base_config();
  c.kv_cache_tokens = 16 * 14;  // 14 pages: 6 requests of ~5 pages each cannot all fit
  c.enable_prefix_caching = false;
  Engine engine(c);
  std::vector<std::string> texts;
  for (int i = 0; i < 6; ++i) {
    texts.push_back("Request number " + std::to_string(i) + ": " + mixed_prompts(8)[i] + " " + mixed_prompts(8)[7 - i]);
  }
  auto prompts = encode_all(engine, texts);
  auto alone = run_alone(engine, prompts, 24);
  auto together = run_together(engine, prompts, 24);
  EXPECT_GT(engine.stats().num_preemptions, 0) << "the test must exercise preemption";
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(alone[i], together[i]) << "request " << i;
}

TEST(Engine, ChunkedPrefillGivesTheSameLogprobs) {
  REQUIRE_SMOLLM2();
  auto run = [](int32_t budget) {
    EngineConfig c = base_config();
    c.max_num_batched_tokens = budget;
    c.enable_prefix_caching = false;
    Engine engine(c);
    SamplingParams p = greedy_params(4);
    p.logprobs = 5;
    auto prompt = engine.tokenizer().encode(mixed_prompts(8)[3] + " " + mixed_prompts(8)[0], true);
    EXPECT_GT(prompt.size(), 20u);
    engine.add_request(prompt, p);
    std::vector<TokenOutput> tokens;
    while (engine.has_unfinished()) {
      for (auto& o : engine.step()) tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
    engine.check_integrity();
    return tokens;
  };
  auto whole = run(256);
  auto chunked = run(7);  // prompt computed 7 tokens per step
  ASSERT_EQ(whole.size(), chunked.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].token, chunked[i].token);
    ASSERT_EQ(whole[i].top.size(), chunked[i].top.size());
    for (size_t j = 0; j < whole[i].top.size(); ++j) {
      EXPECT_EQ(whole[i].top[j].token, chunked[i].top[j].token);
      EXPECT_NEAR(whole[i].top[j].logprob, chunked[i].top[j].logprob, 1e-4);
    }
  }
}

TEST(Engine, PrefixCacheHitGivesTheSameTokens) {
  REQUIRE_SMOLLM2();
  Engine engine(base_config());
  auto prompt = engine.tokenizer().encode(mixed_prompts(8)[3] + " " + mixed_prompts(8)[4] + " " + mixed_prompts(8)[5], true);
  ASSERT_GT(prompt.size(), 32u);
  auto first = run_alone(engine, {prompt}, 8);
  auto second = run_alone(engine, {prompt}, 8);
  EXPECT_EQ(first, second);
  EngineStats s = engine.stats();
  EXPECT_GE(s.prefix_hit_tokens, static_cast<int64_t>(prompt.size() / 16 * 16) - 16);
}

TEST(Engine, AbortFreesEverythingAtAnyTime) {
  REQUIRE_SMOLLM2();
  Engine engine(base_config());
  auto prompts = encode_all(engine, mixed_prompts(8));
  std::vector<uint64_t> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request(p, greedy_params(32)));
  engine.abort(ids[0]);  // before it ever ran
  engine.step();
  engine.step();
  for (size_t i = 1; i < ids.size(); ++i) engine.abort(ids[i]);  // mid-flight
  size_t aborted = 0;
  while (engine.has_unfinished()) {
    for (auto& o : engine.step()) {
      if (o.finished && o.finish_reason == FinishReason::Abort) ++aborted;
    }
  }
  EXPECT_EQ(aborted, ids.size() - 1);
  engine.check_integrity();  // with nothing in flight, every block is free
  EXPECT_EQ(engine.stats().kv_usage, 0.0);
}

TEST(Engine, RejectsBadRequestsWithClearErrors) {
  REQUIRE_SMOLLM2();
  Engine engine(base_config());
  EXPECT_THROW(engine.add_request({}, greedy_params(4)), Error);
  EXPECT_THROW(engine.add_request({1, 2, 999999}, greedy_params(4)), Error);
  std::vector<int32_t> too_long(600, 42);
  try {
    engine.add_request(too_long, greedy_params(4));
    FAIL() << "a prompt over max_model_len must be rejected";
  } catch (const ParamError& e) {
    EXPECT_NE(std::string(e.what()).find("maximum context length"), std::string::npos);
  }
  EXPECT_THROW(engine.add_request({1, 2, 3}, greedy_params(600)), ParamError);
  SamplingParams bad = greedy_params(4);
  bad.temperature = -1;
  EXPECT_THROW(engine.add_request({1, 2, 3}, bad), ParamError);
  EXPECT_FALSE(engine.has_unfinished());
  engine.check_integrity();
}

TEST(Engine, StopStringsTruncateTheOutput) {
  REQUIRE_SMOLLM2();
  EngineConfig c = base_config();
  LLM llm(c);
  GenerateInput in;
  in.prompt = "1, 2, 3, 4, 5, 6, 7,";
  in.params = greedy_params(24);
  CompletionOutput free_run = llm.generate({in})[0];
  const std::string& text = free_run.choices[0].text;
  ASSERT_GT(text.size(), 6u);
  // Stop at the second comma of the free-running continuation.
  size_t first = text.find(',');
  ASSERT_NE(first, std::string::npos);
  in.params.stop = {text.substr(first, 2)};
  CompletionOutput stopped = llm.generate({in})[0];
  EXPECT_EQ(stopped.choices[0].finish_reason, FinishReason::Stop);
  EXPECT_EQ(stopped.choices[0].text, text.substr(0, first));
  EXPECT_EQ(stopped.choices[0].stop_reason, text.substr(first, 2));
  llm.engine().check_integrity();
}

TEST(Engine, NSamplesAreSeededAndDistinctFromEachOther) {
  REQUIRE_SMOLLM2();
  LLM llm(base_config());
  GenerateInput in;
  in.prompt = "My favourite animal is";
  in.params.temperature = 1.0f;
  in.params.max_tokens = 8;
  in.params.n = 4;
  in.params.seed = 1234;
  in.params.ignore_eos = true;
  auto a = llm.generate({in})[0];
  auto b = llm.generate({in})[0];
  ASSERT_EQ(a.choices.size(), 4u);
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a.choices[i].token_ids, b.choices[i].token_ids) << "same seed, same samples";
    distinct.insert(a.choices[i].token_ids);
  }
  EXPECT_GT(distinct.size(), 1u);
  llm.engine().check_integrity();
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// A model whose every layer has a sliding window (tiny random Mistral, window
// 8) releases KV pages that leave the window while keeping its output intact.
TEST(Engine, SlidingWindowModelReleasesPagesOutsideTheWindow) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/hf_tiny/";
  auto run = [&](int32_t block_size, int64_t* max_held) {
    EngineConfig c;
    c.model_path = dir + "mistral_window8";
    c.tokenizer_path = dir + "tokenizer.json";
    c.block_size = block_size;
    c.max_model_len = 128;
    c.kv_cache_tokens = 1024;
    Engine engine(c);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 300);
    SamplingParams p = greedy_params(24);
    engine.add_request(prompt, p);
    std::vector<int32_t> tokens;
    *max_held = 0;
    while (engine.has_unfinished()) {
      for (auto& o : engine.step()) {
        for (auto& t : o.new_tokens) tokens.push_back(t.token);
      }
      const int64_t total = 1024 / block_size;
      *max_held = std::max<int64_t>(*max_held, std::llround(engine.stats().kv_usage * total));
      engine.check_integrity();
    }
    engine.check_integrity();
    return tokens;
  };
  int64_t held_small = 0, held_large = 0;
  auto small_pages = run(4, &held_small);
  auto large_pages = run(64, &held_large);
  EXPECT_EQ(small_pages, large_pages);  // one 64-token page is never released: same math, nothing dropped
  // 64 tokens in 4-token pages would hold 16 pages by the end; keys within a
  // window of 8 span at most 3 pages, plus the page the next token goes to.
  EXPECT_LE(held_small, 4) << "pages were not released";
  EXPECT_GT(held_small, 0);
}

}  // namespace
}  // namespace deepinfer
