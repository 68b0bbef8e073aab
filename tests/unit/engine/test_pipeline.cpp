// The pipelined (zero-overhead) step loop against the synchronous one on the
// real default model: the same scripted workload — requests joining at
// different steps, finishing by length, EOS and stop strings, aborted
// mid-flight, preempted under a small KV cache, seeded sampling, host-side
// penalties and logprobs — must give every request the same tokens, text and
// finish reason, with the pool consistent after every step and nothing leaked;
// n > 1 requests (fanned out by the LLM API) sample the same tokens.
// Batch-invariant mode makes a request's tokens independent of its batch, so
// equality is exact by construction.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"
#include "../../support/scripted_workload.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

EngineConfig config(bool pipelined, int64_t kv_tokens) {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.batch_invariant = true;
  c.max_model_len = 256;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 64;  // prompts arrive in chunks
  c.kv_cache_tokens = kv_tokens;
  c.zero_overhead_scheduling = pipelined;
  return c;
}

using Job = testing::ScriptedJob;
using Result = testing::ScriptedResult;

SamplingParams params(int32_t max_tokens, float temperature = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<Job> workload() {
  std::vector<Job> jobs;
  const std::vector<std::string> prompts = {
      "The history of the printing press begins", "Water boils at", "def add(a, b):\n    return",
      "In a small village by the sea, there lived an old fisherman who", "1, 2, 3, 5, 8, 13,",
      "The best way to learn a language is", "Photosynthesis converts light into", "Once upon a time, a dragon"};
  for (int i = 0; i < 14; ++i) {
    Job j;
    j.join_step = (i * 3) % 11;
    j.prompt = prompts[i % prompts.size()] + " (" + std::to_string(i) + ")";
    j.params = params(6 + (i * 7) % 23);
    switch (i % 7) {
      case 1: j.params = params(20, 0.8f), j.params.seed = 1000 + i; break;  // seeded sampling
      case 2: j.abort_after = 3 + i % 4; break;                                 // aborted mid-flight
      case 3: j.params.stop = {","}, j.params.max_tokens = 30; break;           // stop string
      case 4: j.params.ignore_eos = false, j.params.max_tokens = 40; break;     // may end by EOS
      case 5: j.params.repetition_penalty = 1.3f, j.params.temperature = 0.7f, j.params.seed = 7; break;  // host sampling
      case 6: j.params.logprobs = 3; break;
      default: break;
    }
    jobs.push_back(j);
  }
  return jobs;
}

std::vector<Result> run(Engine& engine, const std::vector<Job>& jobs) { return testing::run_scripted(engine, jobs); }

void expect_same(const std::vector<Result>& a, const std::vector<Result>& b) {
  testing::expect_same_results(a, b, "pipelined vs synchronous");
}

TEST(Pipeline, SameOutputsAsTheSynchronousLoopWithJoinsFinishesAbortsAndStops) {
  REQUIRE_SMOLLM2();
  const auto jobs = workload();
  Engine sync_engine(config(false, 4096));
  ASSERT_FALSE(sync_engine.pipelined());
  Engine pipe_engine(config(true, 4096));
  ASSERT_TRUE(pipe_engine.pipelined());
  const auto expected = run(sync_engine, jobs);
  const auto got = run(pipe_engine, jobs);
  expect_same(expected, got);
  int aborted = 0, stopped = 0, by_length = 0;
  for (const Result& r : got) {
    aborted += r.reason == FinishReason::Abort;
    stopped += r.reason == FinishReason::Stop;
    by_length += r.reason == FinishReason::Length;
  }
  EXPECT_EQ(aborted, 2) << "the workload must abort requests mid-flight";
  EXPECT_GT(stopped, 0) << "the workload must stop on stop strings";
  EXPECT_GT(by_length, 0);
}

TEST(Pipeline, SameOutputsUnderPreemption) {
  REQUIRE_SMOLLM2();
  auto jobs = workload();
  for (Job& j : jobs) j.join_step = 0;  // everyone at once into a small cache
  Engine sync_engine(config(false, 16 * 12));
  Engine pipe_engine(config(true, 16 * 12));
  const auto expected = run(sync_engine, jobs);
  const auto got = run(pipe_engine, jobs);
  EXPECT_GT(pipe_engine.stats().num_preemptions, 0) << "the test must exercise preemption";
  expect_same(expected, got);
}

TEST(Pipeline, NSamplesMatchTheSynchronousLoop) {
  REQUIRE_SMOLLM2();
  auto run = [](bool pipelined) {
    LLM llm(config(pipelined, 4096));
    EXPECT_EQ(llm.engine().pipelined(), pipelined);
    GenerateInput in;
    in.prompt = "My favourite animal is";
    in.params = params(12, 0.9f);
    in.params.n = 3;
    in.params.seed = 99;
    in.params.top_p = 0.9f;
    in.params.top_k = 40;
    GenerateInput greedy_in;
    greedy_in.prompt = "The capital of France is";
    greedy_in.params = params(10);
    greedy_in.params.n = 2;
    auto out = llm.generate({in, greedy_in});
    llm.engine().check_integrity();
    return out;
  };
  const auto sync = run(false);
  const auto piped = run(true);
  ASSERT_EQ(sync.size(), piped.size());
  for (size_t r = 0; r < sync.size(); ++r) {
    ASSERT_EQ(sync[r].choices.size(), piped[r].choices.size());
    for (size_t i = 0; i < sync[r].choices.size(); ++i) {
      EXPECT_EQ(sync[r].choices[i].token_ids, piped[r].choices[i].token_ids) << "request " << r << " choice " << i;
      EXPECT_EQ(sync[r].choices[i].text, piped[r].choices[i].text);
    }
  }
}

TEST(Pipeline, ResultsArriveOneStepLaterAndTheDeviceTimelineIsRecorded) {
  REQUIRE_SMOLLM2();
  Engine engine(config(true, 4096));
  engine.add_request(engine.tokenizer().encode("Water boils at", true), params(4));
  EXPECT_TRUE(engine.step().empty()) << "step 1 only launches the prefill";
  auto second = engine.step();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].new_tokens.size(), 1u);
  while (engine.has_unfinished()) engine.step();
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.timed_steps, s.steps);
  EXPECT_GT(s.device_busy_ms, 0.0);
  engine.check_integrity();
}

TEST(Pipeline, EnvironmentSwitchesItOff) {
  REQUIRE_SMOLLM2();
  ::setenv("DEEPINFER_ZERO_OVERHEAD_SCHEDULING", "0", 1);
  Engine engine(with_environment(config(true, 1024)));
  ::unsetenv("DEEPINFER_ZERO_OVERHEAD_SCHEDULING");
  EXPECT_FALSE(engine.pipelined());
  engine.add_request(engine.tokenizer().encode("Water boils at", true), params(2));
  auto first = engine.step();
  ASSERT_EQ(first.size(), 1u) << "the synchronous loop returns the first token at once";
}

}  // namespace
}  // namespace deepinfer
