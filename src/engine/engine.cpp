#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/draft_model_proposer.h"
#include "engine/engine_internal.h"
#include "engine/mtp_proposer.h"
#include "engine/output_processor.h"
#include "engine/step_broadcast.h"
#include "kv/kv_cache_manager.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/transport/ucx_kv_server.h"
#include "model/model_loader.h"
#include "moe/expert_load_monitor.h"
#include "runner/model_runner.h"
#include "runner/penalty_state.h"
#include "runner/rng.h"
#include "sched/scheduler.h"
#include "sched/step_plan_builder.h"
#include "structured/grammar_compiler.h"
#include "structured/token_matcher.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

namespace {

// The min_tokens mask, logit_bias and penalties run on the device
// (PenaltyState). Logprobs are those of the raw logits, which the device
// would overwrite, so such a request with logprobs is sampled on the host.
// The same holds for a grammar's token mask.
bool needs_host_sampling(const SamplingParams& p) {
  return p.logprobs.has_value() && (PenaltyState::needed(p) || p.structured_outputs.has_value());
}

}  // namespace

Engine::Engine(EngineConfig config) : parts_(build_engine(std::move(config))) {
  sampler_ = std::make_unique<Sampler>(parts_.model->config().vocab_size);
  if (parts_.config.speculative.enabled()) {
    speculator_ = std::make_unique<Speculator>(parts_.config.speculative, make_proposer());
    const ModelRunner* runner = parts_.runner.get();
    speculator_->set_padding_rule([runner](int32_t seqs, int32_t longest, int64_t tokens) {
      return runner->pads_verify_step(seqs, longest, tokens);
    });
  }
  if (parts_.kv_tiers) calibrate_kv_tiers();
}

Engine::~Engine() = default;

std::unique_ptr<spec::Proposer> Engine::make_proposer() {
  const spec::SpeculativeConfig& sc = parts_.config.speculative;
  if (sc.method == spec::SpecMethod::DraftModel) {
    return std::make_unique<DraftModelProposer>(parts_.config, vocab_size(), parts_.backend->memory_info());
  }
  if (sc.method == spec::SpecMethod::Mtp) {
    auto mtp = std::make_unique<MtpProposer>(*parts_.model, *parts_.backend, *parts_.kv, *parts_.kv_manager,
                                             *parts_.runner, parts_.runner->limits());
    mtp_ = mtp.get();
    return mtp;
  }
  return spec::make_proposer(sc);
}

void Engine::move_experts() {
  Model& model = parts_.model->model();
  const moe::ExpertLoadMonitor& monitor = *parts_.expert_load;
  for (size_t k = 0; k < monitor.moe_layers().size(); ++k) {
    if (!model.expert_placement(k)) return;  // simulated only: the experts are not spread over ranks
    const auto& placement = monitor.layer_stats(k).placement();
    if (!placement) continue;
    // The other ranks move theirs at the same point of the step sequence.
    if (parts_.step_broadcaster) parts_.step_broadcaster->publish_placement(k, *placement);
    model.set_expert_placement(k, *placement);
  }
  log_info("expert parallel: experts of {} MoE layers re-placed over {} ranks (weights moved between ranks)",
           monitor.moe_layers().size(), model.expert_placement(0)->num_ranks());
}

void Engine::observe_for_mtp(const InflightStep& step) {
  std::vector<MtpProposer::ObservedSeq> seqs;
  for (const InflightStep::Seq& s : step.seqs) {
    auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;
    const Live& live = *it->second;
    const Request& r = *live.request;
    if (live.abort_requested || r.is_finished() || r.generation != s.generation) continue;
    // Positions whose next token is known: a verify step's accepted prefix,
    // a prefill chunk, a decode whose token was read.
    const int32_t n = std::min(s.num_tokens, r.num_tokens() - 1 - s.start);
    if (n <= 0) continue;
    MtpProposer::ObservedSeq& o = seqs.emplace_back();
    o.request_id = s.request_id;
    o.start = s.start;
    o.token_begin = s.token_begin;
    for (int32_t i = 1; i <= n; ++i) o.next_tokens.push_back(r.token_at(s.start + i));
  }
  mtp_->observe(step.slot, seqs);
}

int32_t Engine::vocab_size() const { return parts_.model->config().vocab_size; }
const ModelConfig& Engine::model_config() const { return parts_.model->config(); }

uint64_t Engine::add_request(std::vector<int32_t> prompt_ids, SamplingParams params, std::string cache_salt,
                             std::string_view kv_source, int32_t first_sample_position) {
  const int32_t vocab = vocab_size();
  const int32_t max_len = parts_.max_model_len;
  DI_CHECK(!prompt_ids.empty(), "the prompt is empty");
  for (int32_t t : prompt_ids) {
    DI_CHECK(t >= 0 && t < vocab, "prompt token id {} is outside the vocabulary (size {})", t, vocab);
  }
  params.validate(vocab);
  DI_CHECK(params.n == 1, "Engine::add_request takes one sequence; fan out n = {} in the caller", params.n);
  if (params.prompt_logprobs) {
    // Rejected rather than silently ignored until the runner returns per-position logits.
    throw ParamError("prompt_logprobs", "prompt logprobs are not supported yet");
  }
  const int32_t prompt_len = static_cast<int32_t>(prompt_ids.size());
  if (prompt_len >= max_len) {
    throw ParamError("prompt", fmt::format("the prompt has {} tokens, but the maximum context length "
                                           "is {} (--max-model-len) and at least one token must be generated",
                                           prompt_len, max_len));
  }
  if (!params.max_tokens) {
    params.max_tokens = max_len - prompt_len;
  } else if (prompt_len + *params.max_tokens > max_len) {
    throw ParamError("max_tokens", fmt::format("max_tokens {} plus the prompt's {} tokens exceeds the "
                                               "maximum context length {}",
                                               *params.max_tokens, prompt_len, max_len));
  }
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  if (params.structured_outputs) grammar = compile_grammar(*params.structured_outputs);
  const uint64_t id = next_id_++;
  const uint64_t seed = params.seed ? *params.seed : rng::derive_seed(parts_.config.seed, id);
  const int32_t token_limit = std::min(max_len, prompt_len + *params.max_tokens);
  auto request = std::make_unique<Request>(id, std::move(prompt_ids), std::move(params), seed, std::move(cache_salt));
  request->token_limit = token_limit;
  DI_CHECK(first_sample_position >= 0, "a request's first sample position must not be negative");
  request->sample_position_base = first_sample_position;
  request->host_sampling = needs_host_sampling(request->params());
  auto live = std::make_unique<Live>(std::move(request), *parts_.tokenizer);
  const Request& r = *live->request;
  if (!r.host_sampling && PenaltyState::needed(r.params())) {
    live->penalties.emplace(r.params(), r.prompt_ids(), parts_.tokenizer->eos_ids());
  }
  if (grammar) {
    live->request->grammar = true;
    live->grammar.emplace(std::move(grammar), parts_.tokenizer->eos_ids());
    // Only rows the host samples apply the grammar there (its mask buffer is vocabulary-sized).
    if (live->request->host_sampling) {
      live->grammar_processor =
          std::make_unique<structured::GrammarLogitsProcessor>(*live->grammar, grammar_compiler_->mask_words());
    }
  }
  start_kv_prefetch(*live->request, kv_source);
  parts_.scheduler->add(live->request.get());
  stats_.prompt_tokens += prompt_len;
  requests_.emplace(id, std::move(live));
  return id;
}

void Engine::poll_kv_prefetches() {
  std::erase_if(kv_loading_, [&](uint64_t id) {
    if (!parts_.kv_tiers->prefetch_done(id)) return false;
    if (auto it = requests_.find(id); it != requests_.end()) it->second->request->kv_loading = false;
    return true;
  });
}

std::shared_ptr<const structured::CompiledGrammar> Engine::compile_grammar(const StructuredOutputs& so) const {
  std::call_once(grammar_once_, [&] {
    grammar_compiler_ = std::make_shared<structured::GrammarCompiler>(*parts_.tokenizer, vocab_size());
    grammar_ready_.store(true, std::memory_order_release);
  });
  return grammar_compiler_->compile(so);
}

void Engine::abort(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second->abort_requested) return;
  it->second->abort_requested = true;
  parts_.scheduler->finish(it->second->request.get(), newest_inflight_step());
  aborted_.push_back(request_id);
}

void Engine::finish(Live& live, FinishReason reason, RequestOutput& out) {
  Request& r = *live.request;
  live.output.finish(reason, out);
  r.state = reason == FinishReason::Abort ? RequestState::Aborted : RequestState::Finished;
  r.finish_reason = reason;
  r.timings.finished = Clock::now();
  // A client's abort (Engine::abort) has released it from the scheduler already.
  if (!live.abort_requested) parts_.scheduler->finish(&r, newest_inflight_step());
  finished_summaries_[r.id()] = RequestSummary{r.num_prompt_tokens(), r.num_cached_prompt_tokens,
                                               r.num_output_tokens(), r.num_verifications, r.num_verified_drafts,
                                               r.num_accepted_drafts, r.timings};
  if (speculator_) speculator_->finish(r.id());
  if (mtp_) mtp_->finish(r.id());  // also for requests that never drafted
}

std::optional<uint64_t> Engine::newest_inflight_step() const {
  if (!inflight_) return std::nullopt;
  return inflight_->id;
}

Engine::InflightStep Engine::launch(const ScheduledBatch& batch) {
  InflightStep step;
  step.id = next_step_id_++;
  step.num_tokens = batch.num_tokens;
  int32_t copied = 0;
  // The history a verify row's penalties see includes the drafts before it;
  // those rows get a copy of the request's state with them added, alive until
  // launch() returns.
  std::deque<PenaltyState> draft_penalties;
  const StepPlan plan = build_step_plan(batch, *parts_.kv_manager, [&](const Request& r, int32_t offset) {
    RowSampling rs = sampling_row(r, offset);
    const Live& live = *requests_.at(r.id());
    if (live.penalties && offset > 0) {
      PenaltyState& p = draft_penalties.emplace_back(*live.penalties);
      for (int32_t k = 0; k < offset; ++k) p.add_output(r.draft_ids[static_cast<size_t>(k)]);
      rs.penalties = &p;
    } else if (live.penalties) {
      rs.penalties = &*live.penalties;
    }
    StepRow row;
    row.request_id = r.id();
    row.generation = r.generation;
    row.host_sample = r.host_sampling;
    row.logits_index = rs.copy_logits ? copied++ : -1;
    row.mask_index = rs.token_mask ? step.num_masks++ : -1;
    row.num_drafts = r.num_draft_tokens();
    row.draft_index = offset;
    step.rows.push_back(row);
    return rs;
  });
  step.slot = parts_.runner->launch(plan);
  if (mtp_) {
    for (const PlannedSeq& ps : plan.seqs) {
      step.seqs.push_back({ps.request_id, requests_.at(ps.request_id)->request->generation, ps.start, ps.num_tokens,
                           ps.token_begin});
    }
  }
  stats_.logits_rows_copied += copied;
  // Rows are numbered in batch order: the tokens each request has in flight.
  // A request verifying drafts has none: it waits for this step's results.
  int32_t row = 0;
  for (const ScheduledSeq& s : batch.seqs) {
    prompt_tokens_computed_ += s.num_tokens - s.num_sample_rows;  // a chunk's tokens but its last
    for (int32_t j = 0; j < s.num_sample_rows; ++j, ++row) {
      if (s.num_draft_tokens == 0) s.request->inflight.push_back({step.slot, row});
    }
  }
  parts_.scheduler->commit(batch);
  // The tiers' copies enqueued while planning (loads) and committing
  // (offloads) are ordered around this step.
  if (parts_.kv_tiers) parts_.kv_tiers->step_launched(step.id);
  ++stats_.steps;
  return step;
}

void Engine::propose_drafts() {
  std::vector<Request*> candidates;
  for (auto& [id, live] : requests_) {
    Request& r = *live->request;
    if (r.state != RequestState::Running || live->abort_requested || r.verifying || r.host_sampling || r.grammar ||
        !r.inflight.empty() || r.num_computed_tokens != r.num_tokens() - 1) {
      continue;
    }
    candidates.push_back(&r);
  }
  // requests_ is unordered: a fixed order keeps the verify-length choice reproducible.
  std::sort(candidates.begin(), candidates.end(), [](const Request* a, const Request* b) { return a->id() < b->id(); });
  speculator_->propose(candidates, static_cast<int32_t>(parts_.scheduler->num_running()));
}

void Engine::keep_proposer_up() {
  // Running requests, a different share first each step, within a token
  // budget that the pipelined loop hides behind the device's step.
  constexpr int64_t kTokensPerStep = 4096;
  std::vector<const Request*> running;
  for (const auto& [id, live] : requests_) {
    const Request& r = *live->request;
    if (r.state == RequestState::Running && !live->abort_requested) running.push_back(&r);
  }
  if (running.empty()) return;
  std::sort(running.begin(), running.end(), [](const Request* a, const Request* b) { return a->id() < b->id(); });
  std::rotate(running.begin(), running.begin() + static_cast<ptrdiff_t>(keep_up_cursor_++ % running.size()),
              running.end());
  speculator_->keep_up(running, kTokensPerStep);
}

std::vector<RequestOutput> Engine::step() {
  finished_summaries_.clear();
  std::vector<RequestOutput> outputs;
  for (uint64_t id : aborted_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RequestOutput out;
    out.request_id = id;
    finish(*it->second, FinishReason::Abort, out);
    outputs.push_back(std::move(out));
    requests_.erase(it);
  }
  aborted_.clear();
  if (!kv_loading_.empty()) poll_kv_prefetches();

  if (speculator_) {
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    speculator_->record_progress(stats_.generation_tokens, prompt_tokens_computed_, now,
                                 static_cast<int32_t>(parts_.scheduler->num_running()), capture_s_since_progress_);
    capture_s_since_progress_ = 0.0;
  }
  const bool drafting = speculator_ && speculator_->should_propose();
  if (drafting) {
    // Drafts continue the latest tokens, and a verified step's accepted count
    // decides the next step's positions: a drafting step finishes the step in
    // flight before the next is planned (the host's work between steps is
    // device idle time; the caller's handling of these outputs still overlaps
    // the next step).
    if (inflight_) {
      std::unique_ptr<InflightStep> current = std::move(inflight_);
      complete(*current, outputs);
    }
    propose_drafts();
  } else if (speculator_) {
    keep_proposer_up();
  }

  ScheduledBatch batch = schedule();
  stats_.num_preemptions += static_cast<int64_t>(batch.preempted.size());
  // Launch this step before finishing the previous one: the device works on
  // it while the host reads the previous step's tokens.
  std::unique_ptr<InflightStep> previous = std::move(inflight_);
  if (!batch.empty()) {
    inflight_ = std::make_unique<InflightStep>(launch(batch));
    inflight_->drafting = drafting;
  } else if (group_forward_) {
    inflight_ = std::make_unique<InflightStep>(launch_padding());
  }
  if (previous) complete(*previous, outputs);
  // The new step's grammar masks need the tokens just read: the device runs
  // the step's forward meanwhile.
  if (inflight_ && inflight_->num_masks > 0) fill_token_masks(*inflight_);
  // Synchronous loop, or nothing left that the step in flight could serve
  // (flush at the end of the pipeline): finish it now.
  if (inflight_ && (!pipelined() || requests_.empty())) {
    std::unique_ptr<InflightStep> current = std::move(inflight_);
    complete(*current, outputs);
  }
  if (!inflight_) {
    parts_.backend->synchronize();  // surfaces device-side input errors while idle
    if (parts_.kv_tiers) {
      parts_.kv_tiers->device_idle();
      parts_.kv_manager->collect_tier_releases();
    }
    // Only requests waiting on disk reads are left: let the reads run.
    if (batch.empty() && !kv_loading_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return outputs;
}

Engine::InflightStep Engine::launch_padding() {
  InflightStep step;
  step.id = next_step_id_++;
  step.slot = parts_.runner->launch_padding();
  if (parts_.kv_tiers) parts_.kv_tiers->step_launched(step.id);
  ++stats_.padding_steps;
  return step;
}

}  // namespace deepinfer
