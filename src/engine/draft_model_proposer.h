// DraftModelProposer: drafts from a smaller model with the target's
// vocabulary, run by an Engine of its own (its own weights, KV cache,
// scheduler and runner, on the target's device). A proposal is a generation
// of k tokens from the request's whole context, sampled as the target samples
// (temperature, top-k/p, min-p) with the target's random numbers: the draft
// request has the target's seed and continues its output positions, so where
// the draft model's distribution is close to the target's, its token is the
// one the target draws (greedy requests: greedy drafts); the draft engine's
// prefix cache holds the context's full blocks from the previous proposal, so
// each round computes only the tokens accepted since (and the last partial
// block) before the k decode steps — the draft's KV is rolled back simply by
// not matching in the cache. All requests of a step are drafted together, as
// one batch of the draft engine. Each draft token's confidence is the draft
// model's probability of it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "spec/proposer.h"

namespace deepinfer {

class Engine;

class DraftModelProposer final : public spec::Proposer {
 public:
  // target: the target engine's configuration (device, limits, flags the
  // draft engine shares); target_vocab: the target's vocabulary size, which
  // the draft model's must equal (throws deepinfer::Error otherwise).
  // device_memory: on a GPU, the memory left after the target engine took
  // its share; the draft engine sizes its KV cache to 90% of what its weights
  // leave of it.
  DraftModelProposer(const EngineConfig& target, int32_t target_vocab,
                     std::optional<DeviceMemoryInfo> device_memory);
  ~DraftModelProposer() override;

  void start(uint64_t request_id, std::span<const int32_t> prompt) override;
  void append(uint64_t request_id, std::span<const int32_t> tokens) override;
  void propose(uint64_t request_id, int32_t max_tokens, spec::Draft& out) override;
  void propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                     std::vector<spec::Draft>& out) override;
  void set_target_sampling(uint64_t request_id, const spec::TargetSampling& sampling) override;
  void finish(uint64_t request_id) override { contexts_.erase(request_id); }

  const Engine& engine() const { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
  struct Context {
    std::vector<int32_t> tokens;  // prompt + accepted outputs
    int32_t prompt_len = 0;
    spec::TargetSampling sampling;  // greedy until set_target_sampling
  };
  std::unordered_map<uint64_t, Context> contexts_;
};

}  // namespace deepinfer
