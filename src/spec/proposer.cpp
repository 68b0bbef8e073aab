#include "spec/proposer.h"

#include "core/error.h"
#include "spec/suffix_proposer.h"

namespace deepinfer::spec {

void Proposer::propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                             std::vector<Draft>& out) {
  out.resize(request_ids.size());
  for (size_t i = 0; i < request_ids.size(); ++i) propose(request_ids[i], max_tokens[i], out[i]);
}

NgramIndex& NgramProposer::index(uint64_t request_id) {
  auto it = indexes_.find(request_id);
  DI_CHECK(it != indexes_.end(), "n-gram proposer: unknown request {}", request_id);
  return it->second;
}

void NgramProposer::start(uint64_t request_id, std::span<const int32_t> prompt) {
  auto [it, fresh] = indexes_.try_emplace(request_id, config_);
  DI_CHECK(fresh, "n-gram proposer: request {} started twice", request_id);
  it->second.append(prompt);
}

void NgramProposer::append(uint64_t request_id, std::span<const int32_t> tokens) { index(request_id).append(tokens); }

void NgramProposer::propose(uint64_t request_id, int32_t max_tokens, Draft& out) {
  index(request_id).propose(max_tokens, out);
}

namespace {

// SuffixProposer keeps its own request table; this adapts it to the interface.
class SuffixDrafts final : public Proposer {
 public:
  explicit SuffixDrafts(SuffixConfig config) : proposer_(config) {}
  void start(uint64_t id, std::span<const int32_t> prompt) override { proposer_.start(id, prompt); }
  void append(uint64_t id, std::span<const int32_t> tokens) override { proposer_.append(id, tokens); }
  void propose(uint64_t id, int32_t max_tokens, Draft& out) override { proposer_.propose(id, max_tokens, out); }
  void finish(uint64_t id) override { proposer_.finish(id); }

 private:
  SuffixProposer proposer_;
};

}  // namespace

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config) {
  switch (config.method) {
    case SpecMethod::Ngram:
      return std::make_unique<NgramProposer>(NgramConfig{config.prompt_lookup_min, config.prompt_lookup_max});
    case SpecMethod::Suffix: {
      SuffixConfig sc;
      sc.max_depth = config.suffix_max_depth;
      sc.propose.min_prob = config.suffix_min_token_prob;
      sc.propose.max_tokens = config.num_speculative_tokens;
      sc.global_max_tokens = config.suffix_global_max_tokens;
      return std::make_unique<SuffixDrafts>(sc);
    }
    case SpecMethod::DraftModel:
    case SpecMethod::Mtp:
    case SpecMethod::None: break;
  }
  fail("speculative decoding: no proposer for method {}", to_string(config.method));
}

}  // namespace deepinfer::spec
