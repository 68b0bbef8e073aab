#include "engine/speculator.h"

#include <algorithm>
#include <thread>

#include "backend/cpu/thread_pool.h"
#include "core/error.h"
#include "sched/request.h"
#include "spec/verify_length.h"

namespace deepinfer {

namespace {

spec::SwitchConfig switch_config(const spec::SpeculativeConfig& c) {
  spec::SwitchConfig s;
  s.window_steps = std::max(c.switch_window_steps, 1);
  s.plain_window_steps = std::max(s.window_steps / 3, 1);
  return s;
}

}  // namespace

Speculator::Speculator(spec::SpeculativeConfig config, std::unique_ptr<spec::Proposer> proposer)
    : config_(std::move(config)), proposer_(std::move(proposer)), switch_(switch_config(config_)) {
  DI_CHECK(proposer_ != nullptr, "speculative decoding without a proposer");
  stats_.acceptance_lengths.assign(static_cast<size_t>(config_.num_speculative_tokens) + 1, 0);
}

Speculator::~Speculator() = default;

Speculator::Tracked& Speculator::start_if_new(const Request& r, int64_t& fed) {
  auto [it, fresh] = tracked_.try_emplace(r.id());
  Tracked& t = it->second;
  if (fresh) {
    proposer_->start(r.id(), r.prompt_ids());
    const SamplingParams& p = r.params();
    proposer_->set_target_sampling(r.id(), {p.temperature, p.top_k, p.top_p, p.min_p, r.seed()});
    t.fed = r.num_prompt_tokens();
    fed += t.fed;
  }
  return t;
}

int64_t Speculator::append_new(const Request& r, Tracked& t) {
  if (t.fed >= r.num_tokens()) return 0;
  const auto& out = r.output_ids();
  const auto from = static_cast<size_t>(t.fed - r.num_prompt_tokens());
  proposer_->append(r.id(), std::span<const int32_t>(out).subspan(from));
  const int64_t fed = r.num_tokens() - t.fed;
  t.fed = r.num_tokens();
  return fed;
}

int64_t Speculator::feed(const Request& r) {
  int64_t fed = 0;
  Tracked& t = start_if_new(r, fed);
  return fed + append_new(r, t);
}

cpu::ThreadPool* Speculator::drafting_pool(size_t candidates) {
  // Fewer requests a thread than this are not worth waking it for (a
  // request's append and proposal take a few microseconds).
  constexpr size_t kRequestsPerThread = 4;
  if (!proposer_->concurrent_requests()) return nullptr;
  if (!pool_) {
    int threads = config_.drafting_threads;
    if (threads == 0) threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u));
    if (threads <= 1) return nullptr;
    pool_ = std::make_unique<cpu::ThreadPool>(threads);
  }
  return candidates >= 2 * kRequestsPerThread ? pool_.get() : nullptr;
}

void Speculator::keep_up(std::span<const Request* const> requests, int64_t max_tokens) {
  for (const Request* r : requests) {
    if (max_tokens <= 0) return;
    max_tokens -= feed(*r);
  }
}

void Speculator::record_progress(int64_t output_tokens, int64_t prompt_tokens, double now_s, int32_t running,
                                 double one_time_s) {
  if (!switched()) return;
  if (host_costs_small()) {
    switch_.pause();
    ++stats_.unswitched_steps;
    return;
  }
  const bool was = switch_.speculating();
  switch_.record_step(output_tokens, prompt_tokens, now_s, running, one_time_s);
  // Back from plain windows: draft at once rather than wait for a probe.
  if (switch_.speculating() && !was) last_round_drafts_ = 1;
  stats_.windows = switch_.windows();
  stats_.speculative_windows = switch_.speculative_windows();
}

bool Speculator::should_propose() {
  probing_ = false;
  if (!speculating_window()) return false;
  if (!config_.dynamic || last_round_drafts_ > 0) {
    steps_since_probe_ = 0;
    return true;
  }
  if (++steps_since_probe_ >= kProbeInterval) {
    steps_since_probe_ = 0;
    probing_ = true;
    return true;
  }
  return false;
}

void Speculator::propose(std::span<Request* const> candidates, int32_t base_tokens) {
  std::vector<Request*> asked;
  std::vector<uint64_t> ids;
  std::vector<int32_t> rooms;
  std::vector<Tracked*> tracked;
  for (Request* r : candidates) {
    int64_t fed = 0;
    tracked.push_back(&start_if_new(*r, fed));
    // Every output the step could yield must fit the request's limit: the
    // drafts plus the token sampled after them.
    const int32_t room = std::min(config_.num_speculative_tokens, r->token_limit - r->num_tokens() - 1);
    if (room <= 0) continue;
    asked.push_back(r);
    ids.push_back(r->id());
    rooms.push_back(room);
  }
  // The device waits for these drafts (they follow the step just finished):
  // a large batch's appends and proposals spread over threads.
  cpu::ThreadPool* pool = drafting_pool(candidates.size());
  auto append_range = [&](int64_t begin, int64_t end, int /*thread*/) {
    for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
      append_new(*candidates[i], *tracked[i]);
    }
  };
  if (pool) {
    ++stats_.parallel_drafting_rounds;
    pool->parallel_for(static_cast<int64_t>(candidates.size()), append_range, /*grain=*/4, /*chunk=*/4);
    drafts_.resize(ids.size());
    pool->parallel_for(
        static_cast<int64_t>(ids.size()),
        [&](int64_t begin, int64_t end, int /*thread*/) {
          for (int64_t i = begin; i < end; ++i) {
            const auto k = static_cast<size_t>(i);
            proposer_->propose(ids[k], rooms[k], drafts_[k]);
          }
        },
        /*grain=*/4, /*chunk=*/4);
  } else {
    append_range(0, static_cast<int64_t>(candidates.size()), 0);
    proposer_->propose_batch(ids, rooms, drafts_);
  }
  std::vector<std::vector<double>> accept;
  std::vector<Request*> drafted;
  for (size_t i = 0; i < asked.size(); ++i) {
    const spec::Draft& d = drafts_[i];
    if (d.tokens.empty()) continue;
    DI_CHECK(d.size() <= rooms[i] && d.confidence.size() == d.tokens.size(),
             "proposer returned {} drafts with {} confidences for room {}", d.size(), d.confidence.size(), rooms[i]);
    Request* r = asked[i];
    stats_.num_proposed_tokens += d.size();
    r->draft_ids = d.tokens;
    tracked_[r->id()].raw_confidence = d.confidence;
    std::vector<double>& a = accept.emplace_back();
    for (float c : d.confidence) a.push_back(calibrator_.optimistic(c));
    drafted.push_back(r);
  }
  if (config_.dynamic && !drafted.empty()) {
    const spec::VerifyChoice choice =
        spec::choose_verify_lengths(accept, base_tokens, base_tokens, curve_, drafting_overhead_ms());
    const int32_t explore = ++rounds_ % kProbeInterval == 0 ? 1 : 0;
    std::vector<int32_t> lengths(drafted.size());
    int32_t longest = 0;
    int64_t tokens = base_tokens;
    for (size_t i = 0; i < drafted.size(); ++i) {
      const int32_t chosen = std::max(choice.lengths[i] + explore, probing_ ? 1 : 0);
      lengths[i] = std::min(chosen, drafted[i]->num_draft_tokens());
      longest = std::max(longest, lengths[i]);
      tokens += lengths[i];
    }
    // A step padded to its longest sequence computes the padding anyway: let
    // every request verify up to that length for free.
    const bool padded = longest > 0 && pads_ && pads_(base_tokens, longest + 1, tokens);
    for (size_t i = 0; i < drafted.size(); ++i) {
      const auto n = static_cast<size_t>(padded ? std::min(longest, drafted[i]->num_draft_tokens()) : lengths[i]);
      drafted[i]->draft_ids.resize(n);
      tracked_[drafted[i]->id()].raw_confidence.resize(n);
    }
  }
  // No request could draft (all prefilling): no evidence either way. While
  // the host's costs of speculating are small, ask again at the next step
  // whatever this round gave (no drafts, or all cut): each step's choice
  // stands on its own, and waiting kProbeInterval steps left stretches of
  // copied text undrafted at batch 1. Otherwise a round that verifies nothing
  // backs off to probes.
  if (candidates.empty() || host_costs_small()) {
    last_round_drafts_ = 1;
    return;
  }
  last_round_drafts_ = 0;
  for (const Request* r : drafted) last_round_drafts_ += r->num_draft_tokens();
}

void Speculator::record_step(int32_t tokens, double device_ms, double idle_ms_before, bool drafting) {
  curve_.record(tokens, device_ms);
  if (idle_ms_before < 0.0) return;
  double& mean = drafting ? idle_drafting_ms_ : idle_pipelined_ms_;
  constexpr double kAlpha = 0.1;
  mean = mean < 0.0 ? idle_ms_before : (1.0 - kAlpha) * mean + kAlpha * idle_ms_before;
  // Every step of a speculating stretch (verify steps and the ones between).
  if (speculating_window()) {
    if (speculating_idle_ms_ < 0.0) {
      speculating_idle_ms_ = idle_ms_before;
      speculating_busy_ms_ = device_ms;
    } else {
      speculating_idle_ms_ = (1.0 - kAlpha) * speculating_idle_ms_ + kAlpha * idle_ms_before;
      speculating_busy_ms_ = (1.0 - kAlpha) * speculating_busy_ms_ + kAlpha * device_ms;
    }
  }
}

bool Speculator::speculating_window() const {
  return !switched() || host_costs_small() || switch_.speculating();
}

bool Speculator::host_costs_small() const {
  if (speculating_idle_ms_ < 0.0) return false;
  const double total = speculating_idle_ms_ + speculating_busy_ms_;
  return total > 0.0 && speculating_idle_ms_ < config_.switch_idle_share * total;
}

SpecDecodeStats Speculator::stats() const {
  SpecDecodeStats s = stats_;
  if (curve_.num_measured_bins() > 0) {
    for (int32_t t = 1; t <= config_.num_speculative_tokens + 1; ++t) s.small_step_ms.push_back(curve_.predict(t));
  }
  s.measured_step_ms = curve_.measured();
  s.drafting_overhead_ms = drafting_overhead_ms();
  return s;
}

double Speculator::drafting_overhead_ms() const {
  if (idle_drafting_ms_ < 0.0) return 0.0;
  return std::max(0.0, idle_drafting_ms_ - std::max(idle_pipelined_ms_, 0.0));
}

void Speculator::record_verification(const Request& r, int32_t verified, int32_t accepted, bool rejected) {
  if (verified <= 0) return;
  ++stats_.num_drafts;
  stats_.num_draft_tokens += verified;
  stats_.num_accepted_tokens += accepted;
  ++stats_.acceptance_lengths[static_cast<size_t>(std::clamp(accepted, 0, config_.num_speculative_tokens))];
  auto it = tracked_.find(r.id());
  if (it == tracked_.end()) return;
  const std::vector<float>& raw = it->second.raw_confidence;
  // Draft j is an observation of P(accept | drafts before it accepted) only
  // when those were accepted: the first `accepted` succeeded, the next failed.
  const int32_t observed =
      std::min<int32_t>(std::min(accepted + (rejected ? 1 : 0), verified), static_cast<int32_t>(raw.size()));
  for (int32_t j = 0; j < observed; ++j) calibrator_.observe(raw[static_cast<size_t>(j)], j < accepted);
}

void Speculator::finish(uint64_t request_id) {
  if (tracked_.erase(request_id) > 0) proposer_->finish(request_id);
}

}  // namespace deepinfer
