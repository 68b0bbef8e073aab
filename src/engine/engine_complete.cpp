// The Engine's completion of a launched step: reading back its sampled
// tokens (or sampling on the host where the device cannot), filling grammar
// masks after launch, accepting or rejecting drafts, and handing each token
// to its request's output processor.
#include <algorithm>
#include <chrono>
#include <thread>

#include "backend/cpu/thread_pool.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine_internal.h"
#include "engine/speculator.h"
#include "kv/kv_cache_manager.h"
#include "kv/tiers/kv_tiers.h"
#include "moe/expert_load_monitor.h"
#include "runner/model_runner.h"
#include "runner/sampler.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

SampleResult Engine::sample_on_host(Live& live, std::span<const float> logits) {
  const Request& r = *live.request;
  SamplingRow srow;
  srow.params = &r.params();
  srow.prompt_ids = r.prompt_ids();
  srow.output_ids = r.output_ids();
  srow.seed = r.seed();
  srow.position = r.sample_position_base + r.num_output_tokens();
  srow.eos_ids = parts_.tokenizer->eos_ids();
  srow.processor = live.grammar_processor.get();
  return sampler_->sample_row(logits, srow);
}

void Engine::fill_token_masks(const InflightStep& step) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelRunner& runner = *parts_.runner;
  struct Job {
    structured::TokenMatcher* matcher;
    std::span<int32_t> words;
  };
  std::vector<Job> jobs;
  for (const StepRow& row : step.rows) {
    if (row.mask_index < 0) continue;
    std::span<int32_t> words = runner.token_mask(step.slot, row.mask_index);
    auto it = requests_.find(row.request_id);
    Live* live = it == requests_.end() ? nullptr : it->second.get();
    if (live != nullptr && !live->abort_requested && !live->request->is_finished() &&
        live->request->generation == row.generation && live->grammar) {
      // The row samples output token num_output_tokens(): every token before
      // it has been read back (the step before this one was completed first).
      const Request& r = *live->request;
      if (live->grammar->num_accepted() == r.num_output_tokens()) {
        jobs.push_back({&*live->grammar, words});
        continue;
      }
      log_error("request {}: grammar state holds {} tokens but the row samples token {}", r.id(),
                live->grammar->num_accepted(), r.num_output_tokens());
    }
    // A row whose result will be dropped: any token.
    std::fill(words.begin(), words.end(), -1);
  }
  // One matcher per row, each touched by one thread: the rows' masks are
  // independent, so a large batch fills them in parallel.
  auto fill = [&](int64_t begin, int64_t end, int /*thread*/) {
    for (int64_t i = begin; i < end; ++i) {
      Job& job = jobs[static_cast<size_t>(i)];
      // A grammar that allows nothing: any token, which the grammar then
      // refuses, ending the request with an error (Engine::append_row).
      if (!job.matcher->fill_mask(job.words)) std::fill(job.words.begin(), job.words.end(), -1);
    }
  };
  constexpr size_t kParallelRows = 16;
  if (jobs.size() >= kParallelRows) {
    if (!mask_pool_) {
      const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
      mask_pool_ = std::make_unique<cpu::ThreadPool>(threads);
    }
    mask_pool_->parallel_for(static_cast<int64_t>(jobs.size()), fill, /*grain=*/4, /*chunk=*/4);
  } else {
    fill(0, static_cast<int64_t>(jobs.size()), 0);
  }
  stats_.grammar_masked_rows += static_cast<int64_t>(jobs.size());
  stats_.grammar_mask_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  runner.finish_launch(step.slot);
}

std::string Engine::sample_row(Live& live, std::span<const float> logits, bool host_sample,
                               int32_t device_token, SampleResult& result) {
  const Request& r = *live.request;
  try {
    if (host_sample) {
      result = sample_on_host(live, logits);
    } else {
      result.token = device_token;
    }
    if (result.token < 0 || result.token >= vocab_size()) {
      return fmt::format("numerical fault: no token can be sampled from the model's logits (NaN or -inf "
                         "everywhere, or +inf; sampler returned {})",
                         result.token);
    }
    if (!host_sample && r.params().logprobs) {
      Sampler::compute_logprobs(logits, result.token, *r.params().logprobs, result);
    }
  } catch (const Error& e) {
    return fmt::format("numerical fault while sampling: {}", e.what());
  }
  return {};
}

void Engine::complete(const InflightStep& step, std::vector<RequestOutput>& outputs) {
  const StepResults res = parts_.runner->wait(step.slot);
  // The tiers first: release_deferred() also returns the blocks whose offload copies landed.
  if (parts_.kv_tiers) parts_.kv_tiers->step_completed(step.id);
  // The device is done with this step: blocks held for it can be reused.
  parts_.kv_manager->release_deferred(step.id);
  stats_.device_busy_ms += res.device_ms;
  stats_.last_step_device_ms = res.device_ms;
  stats_.last_step_idle_ms = res.idle_ms_before;
  ++stats_.timed_steps;
  if (res.graph) ++stats_.graph_steps;
  if (res.padded_seqs > 0) ++stats_.steps_with_padded_seqs;
  if (parts_.expert_load) {
    const int32_t replaced = parts_.expert_load->replacements();
    parts_.expert_load->record_step(res.expert_counts);
    if (parts_.expert_load->replacements() != replaced) move_experts();
  }
  if (res.idle_ms_before >= 0) {
    stats_.device_idle_ms += res.idle_ms_before;
    stats_.device_idle_max_ms = std::max(stats_.device_idle_max_ms, res.idle_ms_before);
  }
  // A step that captured its graph timed the capture, not the step. At least
  // a microsecond: a capture always marks its window as one-time work.
  if (res.captured) {
    capture_s_since_progress_ += std::max(res.capture_ms, 1e-3) * 1e-3;
    ++stats_.graph_captures;
    stats_.graph_capture_ms += res.capture_ms;
  }
  if (speculator_ && !res.captured) {
    speculator_->record_step(step.num_tokens, res.device_ms, res.idle_ms_before, step.drafting);
  }
  const size_t vocab = static_cast<size_t>(vocab_size());
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const StepRow& row = step.rows[i];
    auto it = requests_.find(row.request_id);
    if (it == requests_.end()) continue;  // finished or aborted meanwhile
    Live& live = *it->second;
    Request& r = *live.request;
    if (live.abort_requested || r.is_finished() || r.generation != row.generation) continue;  // late result
    int32_t draft = -1;  // the draft this row's token is compared with
    if (row.num_drafts == 0) {
      // Steps complete in launch order, so this row is the request's oldest token in flight.
      DI_CHECK(!r.inflight.empty() && r.inflight.front().slot == step.slot,
               "request {} receives a token it did not wait for", r.id());
      r.inflight.erase(r.inflight.begin());
    } else {
      if (!r.verifying) continue;  // an earlier row of this verification was rejected
      if (row.draft_index < row.num_drafts) draft = r.draft_ids[static_cast<size_t>(row.draft_index)];
    }
    std::span<const float> logits;
    if (row.logits_index >= 0) logits = res.logits.subspan(static_cast<size_t>(row.logits_index) * vocab, vocab);
    const int32_t device_token = row.host_sample ? -1 : res.tokens[i];
    const int32_t token = append_row(live, logits, row.host_sample, device_token, outputs);
    if (row.num_drafts > 0) {
      // The draft is accepted when the target sampled it: with the sampler's
      // draws keyed on (seed, position), that is exactly the token the target
      // would have produced without speculation, at any temperature.
      const bool accepted = token >= 0 && token == draft;
      if (!accepted || r.is_finished()) {
        const int32_t n_accepted = row.draft_index + (accepted ? 1 : 0);
        speculator_->record_verification(r, row.num_drafts, n_accepted, token >= 0 && draft >= 0 && !accepted);
        ++r.num_verifications;
        r.num_verified_drafts += row.num_drafts;
        r.num_accepted_drafts += n_accepted;
        if (!r.is_finished()) parts_.scheduler->accept_drafts(r);
      }
    }
    if (r.is_finished()) requests_.erase(it);
  }
  if (mtp_) observe_for_mtp(step);
}

int32_t Engine::append_row(Live& live, std::span<const float> logits, bool host_sample, int32_t device_token,
                           std::vector<RequestOutput>& outputs) {
  Request& r = *live.request;
  RequestOutput out;
  out.request_id = r.id();
  SampleResult result;
  std::string fault = sample_row(live, logits, host_sample, device_token, result);
  if (!fault.empty()) ++stats_.numerical_faults;
  if (fault.empty() && live.grammar && !live.grammar->accept(result.token)) {
    fault = fmt::format("structured output: the grammar allows no continuation after {} tokens (token {} "
                        "was sampled); the constraint cannot be met with this vocabulary",
                        r.num_output_tokens(), result.token);
  }
  if (!fault.empty()) {
    // A numerical fault (NaN or infinite logits) or a grammar's dead end ends
    // this request only; the engine and every other request go on.
    log_error("request {}: {}", r.id(), fault);
    out.error = std::move(fault);
    finish(live, FinishReason::Abort, out);
    outputs.push_back(std::move(out));
    return -1;
  }
  if (live.penalties) live.penalties->add_output(result.token);
  ++stats_.generation_tokens;
  if (r.num_output_tokens() == 0) r.timings.first_token = Clock::now();
  FinishReason reason = live.output.add_token(r, result, parts_.max_model_len, out);
  // A grammar that has taken its stop token ends the output (even with ignore_eos).
  if (reason == FinishReason::None && live.grammar && live.grammar->terminated()) reason = FinishReason::Stop;
  if (reason != FinishReason::None) finish(live, reason, out);
  outputs.push_back(std::move(out));
  return result.token;
}

}  // namespace deepinfer
