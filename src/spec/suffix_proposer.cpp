#include "spec/suffix_proposer.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace deepinfer::spec {

void check_suffix_config(const SuffixConfig& config) {
  DI_CHECK(config.max_depth >= 2 && config.max_depth <= 256, "suffix decoding: max_depth must be in [2, 256], got {}",
           config.max_depth);
  check_propose_config(config.propose);
  DI_CHECK(config.global_max_tokens >= 0, "suffix decoding: global_max_tokens must be >= 0, got {}",
           config.global_max_tokens);
}

float expected_accepted(const Draft& draft) {
  float all_accepted = 1.0f, sum = 0.0f;
  for (float c : draft.confidence) {
    all_accepted *= c;
    sum += all_accepted;
  }
  return sum;
}

namespace {

// Validates before any member is built from the config.
const SuffixConfig& checked(const SuffixConfig& config) {
  check_suffix_config(config);
  return config;
}

}  // namespace

SuffixProposer::SuffixProposer(SuffixConfig config) : config_(checked(config)), global_(config.max_depth) {}

const SuffixProposer::Request& SuffixProposer::find(uint64_t request_id, const char* what) const {
  auto it = requests_.find(request_id);
  DI_CHECK(it != requests_.end(), "suffix decoding: {} of unknown request {} (never started, or already finished)",
           what, request_id);
  return it->second;
}

SuffixProposer::Request& SuffixProposer::find(uint64_t request_id, const char* what) {
  return const_cast<Request&>(std::as_const(*this).find(request_id, what));
}

void SuffixProposer::start(uint64_t request_id, std::span<const int32_t> prompt) {
  auto [it, inserted] = requests_.try_emplace(request_id, config_.max_depth);
  DI_CHECK(inserted, "suffix decoding: request {} started twice", request_id);
  Request& r = it->second;
  r.seq = r.tree.add_sequence();
  r.tree.append(r.seq, prompt);
  r.prompt_size = prompt.size();
}

void SuffixProposer::append(uint64_t request_id, std::span<const int32_t> tokens) {
  Request& r = find(request_id, "append");
  r.tree.append(r.seq, tokens);
}

void SuffixProposer::finish(uint64_t request_id) {
  const std::vector<int32_t> output = release(request_id);
  add_global(output);
}

std::vector<int32_t> SuffixProposer::release(uint64_t request_id) {
  const Request& r = find(request_id, "finish");
  std::span<const int32_t> output = r.tree.tokens(r.seq).subspan(r.prompt_size);
  // Only outputs: prompts are mostly request-specific (documents, user text),
  // while outputs are what a later request is likely to generate again. An
  // output longer than the whole budget keeps its tail, so the bound holds
  // without throwing away the newest request entirely.
  const auto budget = static_cast<size_t>(config_.global_max_tokens);
  std::vector<int32_t> kept;
  if (budget > 0 && !output.empty()) {
    if (output.size() > budget) output = output.subspan(output.size() - budget);
    kept.assign(output.begin(), output.end());
  }
  requests_.erase(request_id);
  return kept;
}

void SuffixProposer::add_global(std::span<const int32_t> output) {
  if (output.empty() || config_.global_max_tokens <= 0) return;
  const int32_t seq = global_.add_sequence();
  global_.append(seq, output);
  global_order_.push_back(seq);
  while (global_.num_tokens() > config_.global_max_tokens) {
    global_.remove_sequence(global_order_.front());
    global_order_.pop_front();
  }
}

SuffixSource SuffixProposer::propose(uint64_t request_id, int32_t max_tokens, Draft& out, bool use_global) const {
  const Request& r = find(request_id, "propose");
  out.clear();
  SuffixProposeConfig pc = config_.propose;
  pc.max_tokens = std::clamp(max_tokens, 0, pc.max_tokens);
  if (pc.max_tokens == 0) return SuffixSource::None;
  const std::span<const int32_t> context = r.tree.tokens(r.seq);

  r.tree.propose_after(r.seq, pc, out);
  SuffixSource source = out.size() > 0 ? SuffixSource::Request : SuffixSource::None;
  if (use_global && global_.num_sequences() > 0) {
    Draft other;
    global_.propose(context, pc, other);
    // Ties keep the request's own tree: its statistics are about this request.
    if (other.size() > 0 && expected_accepted(other) > expected_accepted(out)) {
      out = std::move(other);
      source = SuffixSource::Global;
    }
  }
  return source;
}

}  // namespace deepinfer::spec
