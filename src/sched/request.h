// Request: one sequence being generated — its immutable parameters plus its
// progress, with an explicit lifecycle:
//   Waiting -> Running -> Finished | Aborted, and Running -> Preempted -> Running.
// A preempted request lost its KV blocks and recomputes them (prompt + the
// tokens generated so far) when it is admitted again; its outputs are kept.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "kv/kv_cache_manager.h"

namespace deepinfer {

enum class RequestState : uint8_t { Waiting, Running, Preempted, Finished, Aborted };
enum class FinishReason : uint8_t { None, Stop, Length, Abort };

std::string_view to_string(RequestState s);
std::string_view to_string(FinishReason r);

using Clock = std::chrono::steady_clock;

// A token sampled on the device by an earlier step: the runner slot of that
// step and the token's sampling row in it.
struct DeviceToken {
  int32_t slot = -1;
  int32_t row = -1;
};

struct RequestTimings {
  Clock::time_point arrival{};
  Clock::time_point first_scheduled{};
  Clock::time_point first_token{};
  Clock::time_point finished{};
};

class Request {
 public:
  Request(uint64_t id, std::vector<int32_t> prompt_ids, SamplingParams params, uint64_t seed,
          std::string cache_salt = {});

  uint64_t id() const { return id_; }
  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }
  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }
  const std::string& cache_salt() const { return cache_salt_; }

  int32_t num_prompt_tokens() const { return static_cast<int32_t>(prompt_ids_.size()); }
  int32_t num_output_tokens() const { return static_cast<int32_t>(output_ids_.size()); }
  int32_t num_tokens() const { return num_prompt_tokens() + num_output_tokens(); }
  int32_t token_at(int32_t i) const {
    return i < num_prompt_tokens() ? prompt_ids_[i] : output_ids_[i - num_prompt_tokens()];
  }
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  // Prompt followed by outputs (what is recomputed after a preemption).
  std::vector<int32_t> all_tokens() const;

  RequestState state = RequestState::Waiting;
  FinishReason finish_reason = FinishReason::None;
  bool is_finished() const {
    return state == RequestState::Finished || state == RequestState::Aborted;
  }

  // Progress: tokens whose K/V are in the cache (the pages themselves are
  // the KvCacheManager's).
  int32_t num_computed_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache (first admission)
  // Its prefix is being read from the disk KV tier: it waits (others pass it)
  // until the blocks are in host memory.
  bool kv_loading = false;
  int32_t num_preemptions = 0;

  // The pipelined step loop (Engine). Tokens
  // sampled by steps whose results the host has not read yet are "in
  // flight": they count towards the sequence length for scheduling and KV
  // capacity (total_tokens), and a later step takes their ids from the
  // device (each one's source: the runner slot and sampling row that made it).
  std::vector<DeviceToken> inflight;
  int32_t num_inflight_tokens() const { return static_cast<int32_t>(inflight.size()); }
  // Bumped whenever the request loses its place (preemption): results of steps
  // launched before that carry the old value and are ignored when they arrive.
  uint32_t generation = 0;
  // The sequence ends by length at this many tokens (prompt + max_tokens,
  // capped by the model length); a request that has reached it with tokens in
  // flight is not scheduled again.
  int32_t token_limit = 0;
  // The random draws' position of the first output token (sampling is keyed
  // on (seed, position)): 0, except for a draft model's request continuing a
  // target request's outputs, which draws the target's numbers.
  int32_t sample_position_base = 0;
  // Sampled by the host from copied logits (logits processing that the
  // device cannot do for it, e.g. penalties together with raw logprobs): such
  // a request is never scheduled with a token in flight, because its next
  // input is only known after host sampling.
  bool host_sampling = false;
  // A grammar constrains the output (structured output): the host fills a
  // token mask for each of its rows from the request's grammar state, which
  // the previous token must have advanced. It does not draft.
  bool grammar = false;
  // Speculative decoding: draft tokens proposed to follow the known ones.
  // They count towards total_tokens while the next step is planned; a step
  // that verifies them leaves the request `verifying` (never scheduled) until
  // its results are read, when the accepted drafts become outputs and the KV
  // of rejected ones is rolled back (Scheduler::accept_drafts). A request
  // with drafts has no tokens in flight.
  std::vector<int32_t> draft_ids;
  bool verifying = false;
  int32_t num_draft_tokens() const { return static_cast<int32_t>(draft_ids.size()); }
  // Draft tokens this request verified and accepted over its life.
  int64_t num_verifications = 0;
  int64_t num_verified_drafts = 0;
  int64_t num_accepted_drafts = 0;

  int32_t total_tokens() const { return num_tokens() + num_inflight_tokens() + num_draft_tokens(); }
  bool schedulable() const {
    if (verifying) return false;
    return inflight.empty() || (!host_sampling && (token_limit <= 0 || total_tokens() < token_limit));
  }
  // The token ids known on the host, as the KV cache manager reads them.
  SequenceTokens tokens() const { return {prompt_ids_, output_ids_}; }

  RequestTimings timings;

  void append_output(int32_t token) { output_ids_.push_back(token); }

 private:
  uint64_t id_;
  std::vector<int32_t> prompt_ids_;
  SamplingParams params_;
  uint64_t seed_;
  std::string cache_salt_;
  std::vector<int32_t> output_ids_;
};

}  // namespace deepinfer
