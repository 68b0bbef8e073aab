#include "engine/mtp_proposer.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "kv/kv_cache_manager.h"
#include "model/model_loader.h"
#include "sched/step_plan_builder.h"

namespace deepinfer {

namespace {

// The row that draws the token at sequence position `position` as the
// target will: its sampling parameters and its random numbers.
RowSampling target_row(const spec::TargetSampling& t, int32_t prompt_len, int32_t position) {
  RowSampling rs;
  rs.params.temperature = t.temperature;
  rs.params.top_k = t.top_k;
  rs.params.top_p = t.top_p;
  rs.params.min_p = t.min_p;
  rs.params.seed = t.seed;
  rs.params.position = std::max(0, position - prompt_len);  // a position inside the prompt drafts nothing
  return rs;
}

float confidence_of(float prob) { return std::clamp(prob, 0.01f, 0.99f); }

}  // namespace

MtpProposer::MtpProposer(LoadedModel& target, Backend& backend, KvStorage& kv, const KvCacheManager& kv_manager,
                         ModelRunner& target_runner, const RunnerLimits& target_limits)
    : kv_manager_(kv_manager), target_runner_(target_runner) {
  model_ = target.load_mtp_layer(backend);
  RunnerLimits limits = target_limits;
  limits.max_rows_per_seq = 1;  // catch-up: a sequence's last position; chain: its one token
  limits.count_experts = false;
  limits.hidden_states = true;
  limits.sampled_probs = true;
  runner_ = std::make_unique<ModelRunner>(*model_, backend, kv, limits);
  log_info("speculative: MTP layer {} of {} ({:.1f} MiB of weights)", target.config().n_layers,
           target.config().arch, model_->weight_bytes() / 1048576.0);
}

MtpProposer::~MtpProposer() = default;

int MtpProposer::launch(const StepPlan& plan) {
  const int slot = runner_->launch(plan);
  ++launches_;
  return slot;
}

void MtpProposer::observe(int target_slot, std::span<const ObservedSeq> seqs) {
  settle();
  StepPlan plan;
  plan.page_size = kv_manager_.block_size();
  plan.groups.resize(static_cast<size_t>(kv_manager_.layout().num_groups()));
  plan.hidden_source = target_runner_.hidden_states(target_slot);
  PendingCatchUp p;
  for (const ObservedSeq& s : seqs) {
    const auto n = static_cast<int32_t>(s.next_tokens.size());
    if (n == 0 || !kv_manager_.holds(s.request_id)) continue;
    PlannedSeq ps;
    ps.request_id = s.request_id;
    ps.start = s.start;
    ps.num_tokens = n;
    ps.token_begin = plan.num_tokens();
    ps.row_begin = plan.num_rows();
    ps.num_rows = 1;
    // Position i combines the target's hidden state at i with token i + 1.
    for (int32_t i = 0; i < n; ++i) {
      plan.tokens.push_back(TokenSource::host(s.next_tokens[static_cast<size_t>(i)]));
      plan.hidden_rows.push_back(s.token_begin + i);
    }
    const State& state = states_[s.request_id];
    // The layer at position i predicts token i + 2: the last row's draft is
    // the token at start + n + 1.
    plan.rows.push_back({static_cast<int32_t>(plan.seqs.size()), n - 1,
                         target_row(state.sampling, state.prompt_len, s.start + n + 1)});
    add_sequence_pages(plan, kv_manager_, s.request_id, s.start, s.start + n);
    plan.seqs.push_back(ps);
    p.ids.push_back(s.request_id);
    p.ends.push_back(s.start + n);
    p.rows.push_back(ps.token_begin + n - 1);
  }
  if (plan.empty()) return;
  p.slot = launch(plan);
  p.launch = launches_;
  pending_ = std::move(p);
}

void MtpProposer::settle() {
  if (!pending_) return;
  const PendingCatchUp p = std::move(*pending_);
  pending_.reset();
  const StepResults r = runner_->wait(p.slot);
  for (size_t k = 0; k < p.ids.size(); ++k) {
    auto it = states_.find(p.ids[k]);
    if (it == states_.end()) continue;  // finished meanwhile
    State& s = it->second;
    s.computed = p.ends[k];
    s.draft = r.tokens[k];
    s.confidence = r.probs[k];
    s.launch = p.launch;
    s.slot = p.slot;
    s.hidden_row = p.rows[k];
  }
}

void MtpProposer::start(uint64_t request_id, std::span<const int32_t> prompt) {
  State& s = states_[request_id];
  s.num_tokens = static_cast<int32_t>(prompt.size());
  s.prompt_len = s.num_tokens;
}

void MtpProposer::set_target_sampling(uint64_t request_id, const spec::TargetSampling& sampling) {
  states_[request_id].sampling = sampling;
}

void MtpProposer::append(uint64_t request_id, std::span<const int32_t> tokens) {
  states_[request_id].num_tokens += static_cast<int32_t>(tokens.size());
}

void MtpProposer::finish(uint64_t request_id) {
  states_.erase(request_id);
  // A catch-up in flight may still name it; settle() skips unknown ids.
}

void MtpProposer::propose(uint64_t request_id, int32_t max_tokens, spec::Draft& out) {
  std::vector<spec::Draft> drafts;
  propose_batch(std::span(&request_id, 1), std::span(&max_tokens, 1), drafts);
  out = std::move(drafts.front());
}

void MtpProposer::propose_batch(std::span<const uint64_t> request_ids, std::span<const int32_t> max_tokens,
                                std::vector<spec::Draft>& out) {
  settle();
  out.assign(request_ids.size(), {});
  // Sequences that chain further drafts: all take their first hidden input
  // from the same catch-up (normally the step just completed).
  struct Chain {
    size_t out = 0;
    uint64_t id = 0;
    int32_t room = 0;
    int32_t position = 0;   // of the next chain step's token
    int32_t covered = 0;    // positions the sequence's KV pages hold
    int32_t hidden_row = 0; // its hidden input's row in `source`
  };
  std::vector<Chain> chains;
  int source_slot = -1;
  uint64_t source_launch = 0;
  const int32_t page = kv_manager_.block_size();
  for (size_t i = 0; i < request_ids.size(); ++i) {
    auto it = states_.find(request_ids[i]);
    if (it == states_.end() || max_tokens[i] <= 0) continue;
    const State& s = it->second;
    // The first draft follows the request's newest token only when the last
    // catch-up ended at the position before it.
    if (s.draft < 0 || s.computed != s.num_tokens - 1) continue;
    out[i].tokens.push_back(s.draft);
    out[i].confidence.push_back(confidence_of(s.confidence));
    if (max_tokens[i] < 2 || !hidden_alive(s.launch) || !kv_manager_.holds(request_ids[i])) continue;
    if (source_slot < 0) {
      source_slot = s.slot;
      source_launch = s.launch;
    } else if (s.launch != source_launch) {
      continue;
    }
    int32_t covered = INT32_MAX;
    for (const GroupTable& t : kv_manager_.tables(request_ids[i]).groups) {
      covered = std::min(covered, static_cast<int32_t>(t.blocks.size()) * page);
    }
    chains.push_back({i, request_ids[i], max_tokens[i], s.num_tokens - 1, covered, s.hidden_row});
  }
  Tensor source = source_slot >= 0 ? runner_->hidden_states(source_slot) : Tensor();
  for (int32_t j = 1; !chains.empty(); ++j) {
    // Chain step j drafts token j + 1 of each sequence still going.
    std::erase_if(chains, [&](const Chain& c) { return j >= c.room || c.position >= c.covered; });
    if (chains.empty()) break;
    StepPlan plan;
    plan.page_size = page;
    plan.groups.resize(static_cast<size_t>(kv_manager_.layout().num_groups()));
    plan.hidden_source = source;
    for (Chain& c : chains) {
      PlannedSeq ps;
      ps.request_id = c.id;
      ps.start = c.position;
      ps.num_tokens = 1;
      ps.token_begin = plan.num_tokens();
      ps.row_begin = plan.num_rows();
      ps.num_rows = 1;
      plan.tokens.push_back(TokenSource::host(out[c.out].tokens.back()));
      plan.hidden_rows.push_back(c.hidden_row);
      const State& state = states_.at(c.id);
      plan.rows.push_back({static_cast<int32_t>(plan.seqs.size()), 0,
                           target_row(state.sampling, state.prompt_len, c.position + 2)});
      add_sequence_pages(plan, kv_manager_, c.id, c.position, c.position + 1);
      c.hidden_row = ps.token_begin;
      plan.seqs.push_back(ps);
    }
    const int slot = launch(plan);
    const StepResults r = runner_->wait(slot);
    for (size_t k = 0; k < chains.size(); ++k) {
      Chain& c = chains[k];
      const int32_t token = r.tokens[k];
      if (token < 0) {
        c.room = 0;  // a numerical fault ends this chain; its drafts so far stand
        continue;
      }
      out[c.out].tokens.push_back(token);
      out[c.out].confidence.push_back(confidence_of(r.probs[k]));
      ++c.position;
    }
    source = runner_->hidden_states(slot);
  }
}

}  // namespace deepinfer
