// Speculative decoding end to end on the real default model (CPU,
// batch-invariant, so a token's logits do not depend on how many tokens its
// step verifies): the same scripted workload — requests joining at different
// steps, prompt chunks, prefix-cache hits, greedy and seeded sampling, stop
// strings, max_tokens reached in the middle of a draft, EOS, aborts, device
// penalties, logprobs, host sampling, preemption under a small KV cache —
// must give every request exactly the tokens, logprobs, text and finish
// reason it gets without speculation, for every method, with the pool
// consistent after every step. A draft is accepted only when the target
// samples it with the same (seed, position) draw, so the equality holds at
// any temperature; a two-sample test on independent seeds checks the sampled
// distribution directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"
#include "../../support/scripted_workload.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

EngineConfig config(const std::string& speculative, int64_t kv_tokens) {
  EngineConfig c;
  c.model_path = testing::smollm2_path();
  c.batch_invariant = true;
  c.max_model_len = 320;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 64;  // prompts arrive in chunks; drafts compete for the budget
  c.kv_cache_tokens = kv_tokens;
  if (!speculative.empty()) c.speculative = spec::SpeculativeConfig::parse(speculative);
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

// Input-grounded prompts: the answer repeats spans of the prompt, so prompt
// lookup and suffix trees find drafts that the model accepts.
std::vector<Job> workload() {
  const std::vector<std::string> prompts = {
      "Copy this list: red, green, blue, yellow, red, green, blue, yellow, red, green, blue,",
      "def area(w, h):\n    return w * h\n\ndef area(w, h):\n    return w * h\n\ndef area(w, h):\n",
      "Monday Tuesday Wednesday Thursday Friday Monday Tuesday Wednesday Thursday Friday Monday",
      "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
      "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3 4",
      "Once upon a time there was a dragon. Once upon a time there was a dragon. Once upon"};
  std::vector<Job> jobs;
  for (int i = 0; i < 16; ++i) {
    Job j;
    j.join_step = (i * 5) % 13;
    // Jobs 12.. repeat earlier prompts word for word: prefix-cache hits.
    j.prompt = (i < 12 ? "(" + std::to_string(i) + ") " : "") + prompts[static_cast<size_t>(i) % prompts.size()];
    j.params = params(8 + (i * 7) % 29);
    switch (i % 8) {
      case 1: j.params = params(30, 0.8f), j.params.seed = 1000 + i; break;      // seeded sampling
      case 2: j.abort_after = 3 + i % 4; break;                                    // aborted mid-flight
      case 3: j.params.stop = {"yellow", "Friday", "mat."}, j.params.max_tokens = 40; break;  // stop strings
      case 4: j.params.ignore_eos = false, j.params.max_tokens = 40; break;        // may end by EOS
      case 5:  // device penalties, on prompts the model continues by repeating
        if (i == 5) {
          j.prompt = prompts[0];
          j.params.repetition_penalty = 1.05f, j.params.frequency_penalty = 0.02f, j.params.min_tokens = 4;
        } else {
          // A penalty that grows with each repeat within a draft: a verify
          // row must count the drafts before it, or this output changes.
          j.prompt = "ha ha ha ha ha ha ha ha ha ha ha ha";
          j.params.frequency_penalty = 0.2f, j.params.max_tokens = 30;
        }
        break;
      case 6: j.params.logprobs = 2; break;                                         // target logprobs per row
      case 7: j.params.repetition_penalty = 1.3f, j.params.temperature = 0.7f, j.params.seed = 7,
              j.params.logprobs = 1; break;                                         // host sampling
      default: j.params.max_tokens = 3 + i % 5; break;                             // max_tokens inside a draft
    }
    jobs.push_back(j);
  }
  return jobs;
}

std::vector<Result> run(Engine& engine, const std::vector<Job>& jobs) { return testing::run_scripted(engine, jobs); }

// Several tokens arrive per step when drafts are accepted: an aborted
// request stops later in its stream, so only their common prefix must agree.
void expect_same(const std::vector<Result>& a, const std::vector<Result>& b, const std::string& what) {
  testing::expect_same_results(a, b, what, /*aborted_prefix_only=*/true);
}

// Every method, dynamic and fixed K. The draft model is the target itself:
// its greedy drafts are what the target samples greedily, so it must be
// accepted almost always there, and the outputs must still be the same
// (fixed K: the dynamic policy rightly stops drafting with a draft model as
// costly as the target).
std::vector<std::string> methods() {
  return {
      R"({"method": "ngram", "speculation_switch_window": 0})",
      R"({"method": "ngram", "dynamic": false, "num_speculative_tokens": 7})",
      R"({"method": "suffix", "speculation_switch_window": 0})",
      R"({"method": "suffix", "dynamic": false, "num_speculative_tokens": 3})",
      // Drafting spread over threads from 8 candidates on (the workload has up to 16).
      R"({"method": "ngram", "speculation_switch_window": 0, "drafting_threads": 3})",
      R"({"method": "suffix", "dynamic": false, "num_speculative_tokens": 3, "drafting_threads": 3})",
      R"({"method": "draft_model", "dynamic": false, "num_speculative_tokens": 4, "model": ")" +
          testing::smollm2_path() + "\"}",
  };
}

TEST(Speculative, SameOutputsAsWithoutSpeculationForEveryMethod) {
  REQUIRE_SMOLLM2();
  const auto jobs = workload();
  Engine plain(config("", 8192));
  const auto expected = run(plain, jobs);
  for (const std::string& method : methods()) {
    Engine engine(config(method, 8192));
    const auto got = run(engine, jobs);
    expect_same(expected, got, method);
    const EngineStats s = engine.stats();
    ASSERT_TRUE(s.speculative);
    EXPECT_GT(s.spec.num_draft_tokens, 50) << method << ": the workload must verify drafts";
    EXPECT_GT(s.spec.num_accepted_tokens, 20) << method << ": and accept some";
    EXPECT_LE(s.spec.num_accepted_tokens, s.spec.num_draft_tokens);
    if (method.find("draft_model") != std::string::npos) {
      // The target as its own draft: only sampled and penalised rows differ.
      EXPECT_GT(s.spec.num_accepted_tokens * 2, s.spec.num_draft_tokens) << method;
    }
    EXPECT_GT(s.prefix_hit_tokens, 0) << method << ": the workload must hit the prefix cache";
    EXPECT_LT(s.steps, plain.stats().steps) << method << ": accepted drafts save steps";
    int64_t hist = 0;
    for (int64_t c : s.spec.acceptance_lengths) hist += c;
    EXPECT_EQ(hist, s.spec.num_drafts);
    // Drafts were accepted under sampling and penalties too, not only greedily.
    EXPECT_GT(got[1].accepted_drafts + got[9].accepted_drafts, 0) << method << ": seeded sampling";
    EXPECT_GT(got[5].accepted_drafts + got[13].accepted_drafts, 0) << method << ": penalties";
    EXPECT_EQ(got[7].accepted_drafts + got[15].accepted_drafts, 0) << method << ": host-sampled requests do not draft";
    if (method.find("drafting_threads") != std::string::npos) {
      EXPECT_GT(s.spec.parallel_drafting_rounds, 0) << method << ": some rounds must draft on several threads";
    }
  }
}

// A draft model samples its drafts as the target samples, with the target's
// random numbers (its seed, its output positions): the target as its own
// draft then draws the target's tokens, so nearly every sampled draft is
// accepted, where greedy drafts would be accepted only as often as the target
// happens to sample its most likely token. Outputs stay those of no speculation.
TEST(Speculative, DraftModelDrawsTheTargetsRandomNumbers) {
  REQUIRE_SMOLLM2();
  std::vector<Job> jobs;
  const std::vector<std::string> prompts = {"Write a short poem about the sea.", "Tell me about your favourite city.",
                                            "List some fruits and their colours.", "What makes a good friend?"};
  for (size_t i = 0; i < 8; ++i) {
    Job j;
    j.join_step = static_cast<int>(i % 3);
    j.prompt = prompts[i % prompts.size()];
    j.params = params(40, i % 2 == 0 ? 0.8f : 1.0f);
    j.params.seed = 500 + i;
    if (i % 4 == 1) j.params.top_p = 0.9f;
    if (i % 4 == 2) j.params.top_k = 20;
    jobs.push_back(j);
  }
  Engine plain(config("", 8192));
  const auto expected = run(plain, jobs);
  Engine engine(config(R"({"method": "draft_model", "dynamic": false, "num_speculative_tokens": 4, "model": ")" +
                           testing::smollm2_path() + "\"}",
                       8192));
  const auto got = run(engine, jobs);
  expect_same(expected, got, "sampled drafts");
  const EngineStats s = engine.stats();
  ASSERT_GT(s.spec.num_draft_tokens, 100);
  const double rate = static_cast<double>(s.spec.num_accepted_tokens) / static_cast<double>(s.spec.num_draft_tokens);
  std::printf("sampled drafts from the target itself: %lld of %lld accepted (%.1f%%)\n",
              static_cast<long long>(s.spec.num_accepted_tokens), static_cast<long long>(s.spec.num_draft_tokens),
              100.0 * rate);
  EXPECT_GT(rate, 0.9);
}

// The throughput switch (on by default with the dynamic policy) turns
// speculation on and off between windows of steps by wall-clock rates, so
// what it chooses varies from run to run; the outputs must not.
TEST(Speculative, ThroughputSwitchKeepsOutputs) {
  REQUIRE_SMOLLM2();
  const auto jobs = workload();
  Engine plain(config("", 8192));
  const auto expected = run(plain, jobs);
  // Consulted whatever the idle share (a CPU step leaves no device idle).
  Engine engine(
      config(R"({"method": "ngram", "speculation_switch_window": 3, "speculation_switch_idle_share": 0})", 8192));
  const auto got = run(engine, jobs);
  expect_same(expected, got, "switch");
  const EngineStats s = engine.stats();
  EXPECT_GT(s.spec.windows, 10);
  EXPECT_GT(s.spec.speculative_windows, 0) << "the first window speculates";
  EXPECT_LE(s.spec.speculative_windows, s.spec.windows);
}

TEST(Speculative, SameOutputsUnderPreemption) {
  REQUIRE_SMOLLM2();
  auto jobs = workload();
  for (Job& j : jobs) j.join_step = 0;  // everyone at once into a small cache
  Engine plain(config("", 16 * 14));
  const auto expected = run(plain, jobs);
  Engine engine(config(methods()[1], 16 * 14));
  const auto got = run(engine, jobs);
  EXPECT_GT(engine.stats().num_preemptions, 0) << "the test must exercise preemption";
  EXPECT_GT(engine.stats().spec.num_accepted_tokens, 0);
  expect_same(expected, got, "preemption");
}

// On a GPU a verify step whose requests verify different numbers of drafts
// runs as the CUDA graph of its longest one, the others padded at their end
// (ModelRunner::graph_shape). Staged in those shapes on the CPU (eagerly:
// the padding is the same), every output must stay what it is without
// speculation, under preemption too.
TEST(Speculative, VerifyStepsPaddedToTheLongestKeepOutputs) {
  REQUIRE_SMOLLM2();
  const auto jobs = workload();
  Engine plain(config("", 8192));
  const auto expected = run(plain, jobs);
  for (const std::string& method : {methods()[0], methods()[3]}) {
    EngineConfig c = config(method, 8192);
    c.graph_shapes_eager = true;
    Engine engine(c);
    expect_same(expected, run(engine, jobs), "padded: " + method);
    EXPECT_GT(engine.stats().steps_with_padded_seqs, 5) << method << ": verify steps must mix draft lengths";
    EXPECT_GT(engine.stats().spec.num_accepted_tokens, 20) << method;
  }
  auto crowded = jobs;
  for (Job& j : crowded) j.join_step = 0;
  Engine plain_small(config("", 16 * 14));
  const auto expected_small = run(plain_small, crowded);
  EngineConfig c = config(methods()[0], 16 * 14);
  c.graph_shapes_eager = true;
  Engine engine(c);
  expect_same(expected_small, run(engine, crowded), "padded, preemption");
  EXPECT_GT(engine.stats().num_preemptions, 0);
  EXPECT_GT(engine.stats().steps_with_padded_seqs, 0);
}

// Independent seeds with and without speculation: the distribution of the
// tokens sampled after drafts were verified must be the same. A two-sample
// chi-square test per output position over the tokens seen (rare ones pooled);
// the seeds are fixed, so the test is deterministic.
TEST(Speculative, SampledDistributionEqualsNonSpeculative) {
  REQUIRE_SMOLLM2();
  constexpr int kSamples = 240;
  constexpr int kTokens = 6;
  auto sample = [&](const std::string& speculative, uint64_t seed_base, int64_t* accepted) {
    EngineConfig c = config(speculative, 1 << 15);
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 512;
    Engine engine(c);
    const auto prompt = engine.tokenizer().encode("a b c d a b c d a b c d a b c d a b", true);
    std::map<uint64_t, std::vector<int32_t>> out;
    for (int i = 0; i < kSamples; ++i) {
      SamplingParams p = params(kTokens, 1.0f);
      p.top_k = 4;
      p.seed = seed_base + static_cast<uint64_t>(i);
      out[engine.add_request(prompt, p)];
    }
    while (engine.has_unfinished()) {
      for (RequestOutput& o : engine.step()) {
        for (const TokenOutput& t : o.new_tokens) out[o.request_id].push_back(t.token);
      }
    }
    if (accepted) *accepted = engine.stats().spec.num_accepted_tokens;
    std::vector<std::vector<int32_t>> v;
    for (auto& [id, toks] : out) v.push_back(toks);
    return v;
  };
  int64_t accepted = 0;
  const auto plain = sample("", 1'000'000, nullptr);
  const auto specd = sample(R"({"method": "ngram", "dynamic": false})", 2'000'000, &accepted);
  ASSERT_GT(accepted, kSamples) << "drafts must be accepted under sampling for the test to mean anything";
  for (int pos = 1; pos < kTokens; ++pos) {
    std::map<int32_t, std::pair<double, double>> counts;
    for (const auto& t : plain) counts[t[static_cast<size_t>(pos)]].first += 1;
    for (const auto& t : specd) counts[t[static_cast<size_t>(pos)]].second += 1;
    // Pool tokens expected fewer than 5 times per sample into one cell.
    std::vector<std::pair<double, double>> cells;
    std::pair<double, double> rare{0, 0};
    for (const auto& [tok, c] : counts) {
      if (c.first + c.second < 10) {
        rare.first += c.first, rare.second += c.second;
      } else {
        cells.push_back(c);
      }
    }
    if (rare.first + rare.second > 0) cells.push_back(rare);
    double chi2 = 0;
    for (const auto& [a, b] : cells) {
      const double e = (a + b) / 2;  // equal sample sizes
      chi2 += (a - e) * (a - e) / e + (b - e) * (b - e) / e;
    }
    const int dof = static_cast<int>(cells.size()) - 1;
    if (dof < 1) continue;
    // Wilson–Hilferty: the chi-square quantile at p = 0.001.
    const double z = 3.09, k = dof;
    const double limit = k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
    EXPECT_LT(chi2, limit) << "position " << pos << ": " << cells.size() << " cells";
  }
}

TEST(Speculative, ConfigErrorsNameTheField) {
  auto error_of = [](const std::string& json) {
    try {
      spec::SpeculativeConfig::parse(json);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"({"method": "eagle"})").find("not supported yet"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "draft_model"})").find("needs \"model\""), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "model": "x"})").find("draft_model method only"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 0})").find("num_speculative_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 2.5})").find("integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "colour": 1})").find("unknown field"), std::string::npos);
  EXPECT_NE(error_of(R"({"num_speculative_tokens": 3})").find("\"method\" is required"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3})").find("exceed"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "suffix", "drafting_threads": 65})").find("drafting_threads"), std::string::npos);
  EXPECT_NE(error_of("[1,2]").find("object"), std::string::npos);
  EXPECT_NE(error_of("{").find("--speculative-config"), std::string::npos);
  const auto c = spec::SpeculativeConfig::parse(R"({"method": "suffix", "num_speculative_tokens": 8, "dynamic": false})");
  EXPECT_EQ(c.method, spec::SpecMethod::Suffix);
  EXPECT_EQ(c.num_speculative_tokens, 8);
  EXPECT_FALSE(c.dynamic);
  EXPECT_EQ(spec::SpeculativeConfig::parse(c.to_json()).to_json(), c.to_json());
}

TEST(Speculative, DraftModelMustShareTheVocabulary) {
  REQUIRE_SMOLLM2();
  const std::string gemma = std::string(DEEPINFER_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(gemma)) GTEST_SKIP() << "Gemma 3 270M not fetched: run ./build.sh";
  try {
    Engine engine(config(R"({"method": "draft_model", "model": ")" + gemma + "\"}", 1024));
    FAIL() << "a draft model with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("share the target's vocabulary"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
