// A scripted workload for engine-level equivalence tests: requests join
// before given step() calls, may be aborted once some tokens arrived, and
// every output is collected per request, with the pool checked after each
// step. Two engine configurations that must agree (pipelined vs synchronous,
// speculative vs not) run the same script and their results are compared.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::testing {

struct ScriptedJob {
  int join_step = 0;  // step() call before which the request is added
  std::string prompt;
  SamplingParams params;
  int abort_after = -1;  // abort once this many tokens have arrived
};

struct ScriptedResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  FinishReason reason = FinishReason::None;
  std::string stop_reason;
  int64_t accepted_drafts = 0;  // speculative decoding, from the request's summary
};

inline std::vector<ScriptedResult> run_scripted(Engine& engine, const std::vector<ScriptedJob>& jobs) {
  std::vector<ScriptedResult> results(jobs.size());
  std::map<uint64_t, size_t> index;
  for (int step = 0; step < 20000; ++step) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].join_step == step) {
        index[engine.add_request(engine.tokenizer().encode(jobs[i].prompt, true), jobs[i].params)] = i;
      }
    }
    if (step > 20 && !engine.has_unfinished()) break;
    for (RequestOutput& o : engine.step()) {
      const size_t i = index.at(o.request_id);
      ScriptedResult& r = results[i];
      for (const TokenOutput& t : o.new_tokens) {
        r.tokens.push_back(t.token);
        r.logprobs.push_back(t.logprob);
      }
      r.text += o.new_text;
      if (o.finished) {
        r.reason = o.finish_reason;
        r.stop_reason = o.stop_reason;
        if (auto s = engine.summary(o.request_id)) r.accepted_drafts = s->num_accepted_drafts;
      }
      if (!o.finished && jobs[i].abort_after >= 0 && static_cast<int>(r.tokens.size()) >= jobs[i].abort_after) {
        engine.abort(o.request_id);
      }
    }
    engine.check_integrity();
  }
  EXPECT_FALSE(engine.has_unfinished());
  engine.check_integrity();  // nothing in flight: every block is back in the pool
  EXPECT_EQ(engine.stats().kv_usage, 0.0);
  return results;
}

// Aborted requests: an engine that delivers several tokens per step (accepted
// drafts) is aborted later in the token stream, so with aborted_prefix_only
// only the common prefix of their tokens must agree.
inline void expect_same_results(const std::vector<ScriptedResult>& a, const std::vector<ScriptedResult>& b,
                                const std::string& what, bool aborted_prefix_only = false) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (aborted_prefix_only && (a[i].reason == FinishReason::Abort || b[i].reason == FinishReason::Abort)) {
      EXPECT_EQ(a[i].reason, b[i].reason) << what << ", request " << i;
      const size_t n = std::min(a[i].tokens.size(), b[i].tokens.size());
      EXPECT_GT(n, 0u);
      EXPECT_TRUE(std::equal(a[i].tokens.begin(), a[i].tokens.begin() + static_cast<ptrdiff_t>(n),
                             b[i].tokens.begin()))
          << what << ", request " << i;
      continue;
    }
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ", request " << i;
    EXPECT_EQ(a[i].text, b[i].text) << what << ", request " << i;
    EXPECT_EQ(a[i].reason, b[i].reason) << what << ", request " << i;
    EXPECT_EQ(a[i].stop_reason, b[i].stop_reason) << what << ", request " << i;
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size()) << what << ", request " << i;
    for (size_t t = 0; t < a[i].logprobs.size(); ++t) EXPECT_EQ(a[i].logprobs[t], b[i].logprobs[t]) << what;
  }
}

}  // namespace deepinfer::testing
