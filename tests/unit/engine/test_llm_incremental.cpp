// LLM's incremental interface (submit / step / take_deltas / take / release):
// what generate(), stream() and the Python binding share. Requests of several
// callers run on one engine; each gets exactly its own outputs.
#include <gtest/gtest.h>

#include "deepinfer/llm.h"
#include "engine/generate_io.h"
#include "../../support/greedy_reference.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

EngineConfig config() {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.batch_invariant = true;  // equal tokens alone or batched, by construction
  c.max_model_len = 512;
  c.max_num_seqs = 16;
  c.kv_cache_tokens = 4096;
  return c;
}

GenerateInput input(const std::string& prompt, int32_t max_tokens) {
  GenerateInput in;
  in.prompt = prompt;
  in.params.temperature = 0;
  in.params.max_tokens = max_tokens;
  in.params.ignore_eos = true;
  return in;
}

TEST(LlmIncremental, StreamsAndBatchesShareTheEngineAndKeepTheirOutputs) {
  REQUIRE_SMOLLM2();
  LLM llm(config());
  const std::vector<int32_t> alone_a = llm.generate({input("Water boils at", 12)})[0].choices[0].token_ids;
  const std::vector<int32_t> alone_b = llm.generate({input("The moon is", 12)})[0].choices[0].token_ids;

  // A stream is half read when a batch runs: the batch steps the stream's
  // request too, and its deltas wait for the stream's reader.
  const GenerationHandle stream = llm.submit(input("Water boils at", 12), /*keep_deltas=*/true);
  llm.step();
  llm.step();
  std::vector<int32_t> streamed;
  for (const CompletionDelta& d : llm.take_deltas(stream)) {
    for (const TokenOutput& t : d.tokens) streamed.push_back(t.token);
  }
  EXPECT_FALSE(streamed.empty());
  std::vector<CompletionOutput> batch = llm.generate({input("The moon is", 12)});
  EXPECT_EQ(batch[0].choices[0].token_ids, alone_b);
  while (!llm.finished(stream)) llm.step();
  bool saw_finish = false;
  for (const CompletionDelta& d : llm.take_deltas(stream)) {
    for (const TokenOutput& t : d.tokens) streamed.push_back(t.token);
    saw_finish = saw_finish || d.finished;
  }
  EXPECT_TRUE(saw_finish);
  EXPECT_EQ(streamed, alone_a);
  CompletionOutput whole = llm.take(stream);
  EXPECT_EQ(whole.choices[0].token_ids, alone_a);
  EXPECT_EQ(whole.choices[0].finish_reason, FinishReason::Length);
  EXPECT_THROW(llm.take(stream), Error);  // forgotten once taken
  EXPECT_FALSE(llm.has_unfinished());
  llm.engine().check_integrity();
}

TEST(LlmIncremental, ReleaseAbortsAndFreesAtAnyTime) {
  REQUIRE_SMOLLM2();
  LLM llm(config());
  GenerateInput three = input("Count with me: one, two,", 64);
  three.params.n = 3;
  three.params.temperature = 0.8f;
  three.params.seed = 5;
  const GenerationHandle h = llm.submit(three);
  const GenerationHandle other = llm.submit(input("The sky is", 8));
  llm.step();
  llm.step();
  llm.release(h);
  llm.release(h);     // twice is harmless
  llm.release(9999);  // unknown handles are ignored
  while (!llm.finished(other)) llm.step();
  EXPECT_EQ(llm.take(other).choices[0].token_ids.size(), 8u);
  while (llm.has_unfinished()) llm.step();  // the released samples' abort outputs are dropped
  llm.engine().check_integrity();
  EXPECT_EQ(llm.engine().stats().num_running, 0u);
}

TEST(LlmIncremental, ABadInputAddsNothing) {
  REQUIRE_SMOLLM2();
  LLM llm(config());
  GenerateInput bad = input("x", 8);
  bad.params.temperature = -1;
  EXPECT_THROW(llm.submit(bad), ParamError);
  GenerateInput too_long = input(std::string(5000, 'a'), 8);
  EXPECT_THROW(llm.submit(too_long), Error);
  EXPECT_FALSE(llm.has_unfinished());
  // generate() with one bad input among good ones throws; the good one is
  // aborted and its KV freed by the next step.
  EXPECT_THROW(llm.generate({input("fine", 4), bad}), ParamError);
  llm.step();
  EXPECT_FALSE(llm.has_unfinished());
  llm.engine().check_integrity();
}

TEST(GenerateIo, ParsesInputObjectsAndRefusesBadOnes) {
  nlohmann::ordered_json defaults = {{"max_tokens", 7}};
  GenerateInput g = parse_generate_input({{"prompt", "hi"}, {"temperature", 0.5}}, defaults, "t");
  EXPECT_EQ(g.prompt, "hi");
  EXPECT_EQ(*g.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(g.params.temperature, 0.5f);
  g = parse_generate_input({{"prompt_token_ids", {1, 2, 3}}, {"max_tokens", 3}}, defaults, "t");
  EXPECT_EQ(g.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*g.params.max_tokens, 3);
  EXPECT_THROW(parse_generate_input({{"temperature", 1}}, {}, "t"), Error);  // no prompt
  EXPECT_THROW(parse_generate_input({{"prompt", "a"}, {"messages", nlohmann::json::array()}}, {}, "t"), Error);
  EXPECT_THROW(parse_generate_input({{"prompt_token_ids", {1, -2}}}, {}, "t"), Error);
  EXPECT_THROW(parse_generate_input({{"prompt_token_ids", nlohmann::json::array()}}, {}, "t"), Error);
  EXPECT_THROW(parse_generate_input({{"prompt", 5}}, {}, "t"), Error);
  try {
    parse_generate_input({{"prompt", "a"}, {"top_p", "high"}}, {}, "line 4");
    FAIL();
  } catch (const ParamError& e) {
    EXPECT_EQ(e.param(), "top_p");
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("invalid sampling parameter 'top_p': line 4: ", 0), 0u) << what;
    EXPECT_EQ(what.find("invalid sampling parameter", 10), std::string::npos) << what;  // said once
  }
}

}  // namespace
}  // namespace deepinfer
