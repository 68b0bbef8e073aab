// Proposer: drafts tokens for the requests the engine is generating. One
// object serves every request and keeps its per-request state by request id;
// the engine feeds it each request's tokens as they become known (prompt,
// then accepted outputs) and asks for up to max_tokens drafts before a step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "spec/draft.h"
#include "spec/ngram_index.h"
#include "spec/speculative_config.h"

namespace deepinfer::spec {

// How the target samples a request's outputs (sampling is keyed on
// (seed, output position)).
struct TargetSampling {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // How the target samples the request (called after start()). A proposer
  // that samples its drafts from a distribution draws them with the target's
  // random numbers: where the two distributions agree the draft is the token
  // the target samples, so it is accepted, at any temperature. Default: unused.
  virtual void set_target_sampling(uint64_t request_id, const TargetSampling& sampling) {
    (void)request_id;
    (void)sampling;
  }
  // A new request and its prompt.
  virtual void start(uint64_t request_id, std::span<const int32_t> prompt) = 0;
  // Tokens appended to the request's sequence (accepted outputs), in order.
  virtual void append(uint64_t request_id, std::span<const int32_t> tokens) = 0;
  // Up to max_tokens drafts following the request's last token (possibly none).
  virtual void propose(uint64_t request_id, int32_t max_tokens, Draft& out) = 0;
  // Drafts for several requests at once (out[i] for request_ids[i]); a
  // proposer that runs a model batches them. Default: one by one.
  virtual void propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                             std::vector<Draft>& out);
  // The request ended; its state is dropped (or kept in shared form).
  virtual void finish(uint64_t request_id) = 0;
  // Whether append and propose may run for different requests on several
  // threads at once (each request's state its own; start and finish stay on
  // one thread). Default: no.
  virtual bool concurrent_requests() const { return false; }
};

// Prompt lookup: an NgramIndex per request.
class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(NgramConfig config) : config_(config) { NgramIndex::check_config(config); }
  void start(uint64_t request_id, std::span<const int32_t> prompt) override;
  void append(uint64_t request_id, std::span<const int32_t> tokens) override;
  void propose(uint64_t request_id, int32_t max_tokens, Draft& out) override;
  void finish(uint64_t request_id) override { indexes_.erase(request_id); }
  bool concurrent_requests() const override { return true; }

 private:
  NgramIndex& index(uint64_t request_id);
  NgramConfig config_;
  std::unordered_map<uint64_t, NgramIndex> indexes_;
};

// The proposer of a configuration whose method needs no model (n-gram,
// suffix); the engine builds the draft-model one.
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config);

}  // namespace deepinfer::spec
