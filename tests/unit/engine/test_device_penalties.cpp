// logit_bias, min_tokens and the repetition / frequency / presence penalties
// run on the device (PenaltyState + apply_penalties) for requests without
// logprobs. The same requests with logprobs still go through the host Sampler
// (copied logits, no token in flight), which is what every request did before,
// so the two runs must give every request the same tokens — greedy and seeded
// sampling, penalised requests batched with plain ones, joining mid-run, in
// the pipelined and the synchronous loop. The device path must copy no logits
// and keep penalised requests in every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "engine/engine.h"
#include "runner/penalty_state.h"
#include "tokenizer/tokenizer.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

EngineConfig config(bool pipelined) {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.batch_invariant = true;  // a request's logits do not depend on its batch
  c.max_model_len = 256;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 64;  // prompts arrive in chunks
  c.kv_cache_tokens = 4096;
  c.zero_overhead_scheduling = pipelined;
  return c;
}

struct Job {
  int join_step = 0;
  std::string prompt;
  SamplingParams params;
};

SamplingParams greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

RunResult run(const std::vector<Job>& jobs, bool pipelined) {
  Engine engine(config(pipelined));
  RunResult out;
  out.tokens.resize(jobs.size());
  std::map<uint64_t, size_t> index;
  for (int step = 0; step < 2000; ++step) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].join_step != step) continue;
      index[engine.add_request(engine.tokenizer().encode(jobs[i].prompt, true), jobs[i].params)] = i;
    }
    if (index.size() == jobs.size() && !engine.has_unfinished()) break;
    for (RequestOutput& o : engine.step()) {
      for (const TokenOutput& t : o.new_tokens) out.tokens[index.at(o.request_id)].push_back(t.token);
    }
    engine.check_integrity();
  }
  EXPECT_FALSE(engine.has_unfinished());
  out.stats = engine.stats();
  return out;
}

// The first token a plain greedy request generates for `prompt`.
int32_t first_greedy_token(const std::string& prompt) {
  const RunResult r = run({Job{0, prompt, greedy(1)}}, true);
  EXPECT_EQ(r.tokens[0].size(), 1u);
  return r.tokens[0].at(0);
}

std::vector<Job> workload(int32_t banned, int32_t eos_like) {
  const std::string a = "The history of the printing press begins";
  const std::string b = "1, 2, 3, 5, 8, 13,";
  const std::string c = "Once upon a time, a dragon";
  std::vector<Job> jobs;
  auto add = [&](int join, const std::string& prompt, SamplingParams p) { jobs.push_back(Job{join, prompt, p}); };
  add(0, a, greedy(20));  // plain
  SamplingParams p = greedy(20);
  p.repetition_penalty = 1.3f;
  add(0, a, p);
  p = greedy(20);
  p.frequency_penalty = 0.9f;
  add(0, b, p);
  p = greedy(18);
  p.presence_penalty = 1.2f;
  add(2, b, p);
  p = greedy(20);
  p.logit_bias = {{banned, -100.0f}, {banned + 1, 4.0f}};
  add(0, a, p);
  p = greedy(24);
  p.temperature = 0.8f, p.seed = 5;
  p.repetition_penalty = 1.2f, p.frequency_penalty = 0.4f, p.presence_penalty = -0.3f;
  p.logit_bias = {{banned, 2.0f}};
  add(1, c, p);
  p = greedy(16);
  p.ignore_eos = false, p.min_tokens = 8, p.stop_token_ids = {eos_like};
  p.repetition_penalty = 1.15f;
  add(3, c, p);
  p = greedy(22);
  p.temperature = 0.9f, p.seed = 3;
  add(1, c, p);  // plain, sampled
  // A strongly favoured token that the frequency penalty overtakes after a
  // few occurrences: the step at which it loses depends on every occurrence,
  // the one still in flight included.
  p = greedy(24);
  p.logit_bias = {{banned + 1, 30.0f}};
  p.frequency_penalty = 2.0f, p.presence_penalty = 2.0f;
  add(0, b, p);
  return jobs;
}

// The same workload, every processed request with logprobs: the host path.
std::vector<Job> on_the_host(std::vector<Job> jobs) {
  for (Job& j : jobs) {
    if (PenaltyState::needed(j.params)) j.params.logprobs = 0;
  }
  return jobs;
}

TEST(DevicePenalties, SameTokensAsTheHostSamplerWithoutCopiesOrHalfRate) {
  REQUIRE_SMOLLM2();
  const std::string a = "The history of the printing press begins";
  const int32_t banned = first_greedy_token(a);
  const int32_t comma = Engine(config(true)).tokenizer().encode(",", false).at(0);
  const std::vector<Job> jobs = workload(banned, comma);

  const RunResult host = run(on_the_host(jobs), true);
  const RunResult device = run(jobs, true);
  const RunResult device_sync = run(jobs, false);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(device.tokens[i], host.tokens[i]) << "request " << i;
    EXPECT_EQ(device_sync.tokens[i], host.tokens[i]) << "request " << i;
    EXPECT_GE(host.tokens[i].size(), 8u) << "request " << i;
  }
  // The processing did something: the banned token no longer comes first,
  // and the repetition penalty changed the greedy continuation.
  ASSERT_EQ(host.tokens[0].at(0), banned);
  EXPECT_NE(host.tokens[4].at(0), banned);
  EXPECT_NE(host.tokens[1], host.tokens[0]);
  const auto favoured = std::count(host.tokens[8].begin(), host.tokens[8].end(), banned + 1);
  EXPECT_GE(favoured, 3);
  EXPECT_LT(favoured, static_cast<long>(host.tokens[8].size())) << "the penalty must overtake the bias";

  EXPECT_GT(host.stats.logits_rows_copied, 0);
  EXPECT_EQ(device.stats.logits_rows_copied, 0) << "penalised rows must not copy their logits";
  // The host path holds a processed request back until its token is known
  // (every other step); the device path keeps it in every step.
  EXPECT_LT(device.stats.steps, host.stats.steps);
}

}  // namespace
}  // namespace deepinfer
