// MtpProposer: drafts with the target's own multi-token-prediction layer
// (DeepSeek-V3's num_nextn_predict_layers). The layer at position i reads the
// target's final hidden state h_i and the embedding of token i + 1, and
// predicts token i + 2; its KV is one more layer of the target's KV cache
// (same pages, same prefix-cache blocks).
//
// Two kinds of MTP steps run on a ModelRunner of their own, on the target's
// stream:
//  - catch-up, after every target step (observe()): the MTP layer runs over
//    the positions the step computed whose next token is now known (a
//    verify step's accepted prefix, a prefill chunk, a decode), reading the
//    target's hidden states where the target runner left them, writing its
//    KV, and sampling after each sequence's last such position — that token
//    is the sequence's first draft. Its results are read at the
//    next observe() or propose, so the pipelined loop is not held up.
//  - the draft chain (propose_batch()), for the remaining K - 1 drafts: one
//    token per sequence per step, whose hidden input is the MTP layer's own
//    output at the previous position (as vLLM chains DeepSeek's MTP), the
//    token the previous step sampled fed on the device. The chain writes KV
//    at positions the next verify step overwrites; it stops where the
//    sequence's KV pages end (the scheduler reserves K slots ahead).
// Drafts are sampled as the target samples the request, with the target's
// random numbers (its seed, the draft's output position), so a draft is the
// token the target draws wherever the layer's distribution is close to the
// target's (greedy requests: the layer's argmax). Each draft's confidence is
// the MTP layer's probability of it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "runner/model_runner.h"
#include "spec/proposer.h"

namespace deepinfer {

class Backend;
class KvCacheManager;
class KvStorage;
class LoadedModel;

class MtpProposer final : public spec::Proposer {
 public:
  // target_limits: the target runner's limits (the MTP runner takes its
  // batch sizes). Throws deepinfer::Error when the model has no MTP layer.
  MtpProposer(LoadedModel& target, Backend& backend, KvStorage& kv, const KvCacheManager& kv_manager,
              ModelRunner& target_runner, const RunnerLimits& target_limits);
  ~MtpProposer() override;

  // A sequence of a completed target step: it computed the query tokens at
  // plan rows [token_begin, token_begin + next_tokens.size()), positions
  // from `start`, and each one's next token is now known.
  struct ObservedSeq {
    uint64_t request_id = 0;
    int32_t start = 0;
    int32_t token_begin = 0;
    std::vector<int32_t> next_tokens;
  };
  // After the target step in target_slot completed (its hidden states still
  // in that slot): the catch-up step for its sequences.
  void observe(int target_slot, std::span<const ObservedSeq> seqs);

  void start(uint64_t request_id, std::span<const int32_t> prompt) override;
  void set_target_sampling(uint64_t request_id, const spec::TargetSampling& sampling) override;
  void append(uint64_t request_id, std::span<const int32_t> tokens) override;
  void propose(uint64_t request_id, int32_t max_tokens, spec::Draft& out) override;
  void propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                     std::vector<spec::Draft>& out) override;
  void finish(uint64_t request_id) override;

  const Model& model() const { return *model_; }

 private:
  struct State {
    int32_t prompt_len = 0;
    spec::TargetSampling sampling;  // greedy until set_target_sampling
    int32_t num_tokens = 0;  // tokens the engine reported (prompt + accepted)
    int32_t computed = 0;    // positions whose MTP KV the catch-ups wrote: [.., computed)
    // The last catch-up's draft after position computed - 1, and where its
    // hidden state is (the MTP runner's launch number and token index).
    int32_t draft = -1;
    float confidence = 0.0f;
    uint64_t launch = 0;
    int slot = -1;
    int32_t hidden_row = -1;
  };
  struct PendingCatchUp {
    int slot = -1;
    uint64_t launch = 0;
    std::vector<uint64_t> ids;
    std::vector<int32_t> ends;  // per sequence: the catch-up computed through ends - 1
    std::vector<int32_t> rows;  // per sequence: its last token's index in the step
  };
  // Reads the catch-up in flight, if any, into the states.
  void settle();
  // Whether the MTP runner still holds the hidden states of launch `launch`.
  bool hidden_alive(uint64_t launch) const { return launches_ - launch < ModelRunner::kSlots; }
  int launch(const StepPlan& plan);

  const KvCacheManager& kv_manager_;
  ModelRunner& target_runner_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<uint64_t, State> states_;
  std::optional<PendingCatchUp> pending_;
  uint64_t launches_ = 0;  // MTP runner launches so far
};

}  // namespace deepinfer
