#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "backend/backend.h"
#include "core/error.h"
#include "core/logging.h"
#include "kv/block_pool.h"
#include "kv/kv_storage.h"
#include "kv/prefix_cache.h"
#include "model/model_loader.h"
#include "moe/expert_load_monitor.h"
#include "runner/model_runner.h"
#include "runner/penalty_state.h"
#include "runner/rng.h"
#include "sched/scheduler.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct Engine::Live {
  std::unique_ptr<Request> request;
  StreamingDetokenizer detokenizer;
  std::string text;     // detokenized output so far (truncated at a matched stop string)
  size_t emitted = 0;   // bytes of `text` already returned to the caller
  size_t max_stop_len = 0;
  bool abort_requested = false;
  // Logits processing done on the device (requests the host does not sample).
  std::optional<PenaltyState> penalties;

  Live(std::unique_ptr<Request> r, const Tokenizer& tok)
      : request(std::move(r)), detokenizer(tok, request->params().skip_special_tokens) {
    for (const auto& s : request->params().stop) max_stop_len = std::max(max_stop_len, s.size());
  }
};

// One sampling row of a launched step, and what completing it needs.
struct StepRow {
  uint64_t request_id = 0;
  uint32_t generation = 0;
  bool host_sample = false;    // sampled on the host from the copied logits
  int32_t logits_index = -1;   // row in the copied logits, or -1
};

struct Engine::InflightStep {
  uint64_t id = 0;
  int slot = -1;
  std::vector<StepRow> rows;
};

namespace {

// The min_tokens mask, logit_bias and penalties run on the device
// (PenaltyState). Logprobs are those of the raw logits, which the device
// would overwrite, so such a request with logprobs is sampled on the host.
bool needs_host_sampling(const SamplingParams& p) { return p.logprobs.has_value() && PenaltyState::needed(p); }

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::string_view(v) != "0" && std::string_view(v) != "false";
}

}  // namespace

Engine::Engine(EngineConfig config) : config_(std::move(config)) {
  DI_CHECK(config_.block_size > 0 && config_.block_size <= 1024, "--block-size {} out of range", config_.block_size);
  DI_CHECK(config_.max_num_seqs > 0, "--max-num-seqs must be positive");
  DI_CHECK(config_.max_num_batched_tokens > 0, "--max-num-batched-tokens must be positive");
  BackendOptions options;
  options.num_threads = config_.num_threads;
  options.batch_invariant = config_.batch_invariant;
  backend_ = create_backend(config_.device, options);
  log_info("engine: backend {}", backend_->name());
  model_ = LoadedModel::open(config_.model_path, *backend_);
  const ModelConfig& mc = model_->config();

  const auto t0 = std::chrono::steady_clock::now();
  if (!config_.tokenizer_path.empty()) {
    tokenizer_ = Tokenizer::from_file(config_.tokenizer_path);
  } else if (model_->gguf()) {
    tokenizer_ = Tokenizer::from_gguf(*model_->gguf());
  } else {
    tokenizer_ = Tokenizer::from_file(config_.model_path);
  }
  log_info("engine: tokenizer with {} tokens loaded in {:.2f} s", tokenizer_->vocab_size(),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  max_model_len_ = config_.max_model_len > 0 ? config_.max_model_len : std::min(mc.max_position, 8192);
  DI_CHECK(max_model_len_ > 1, "--max-model-len must be at least 2");
  DI_CHECK(mc.max_position <= 0 || max_model_len_ <= mc.max_position,
           "--max-model-len {} exceeds the model's context length {}", max_model_len_, mc.max_position);

  DI_CHECK(config_.kv_cache_dtype == "auto" || config_.kv_cache_dtype == "fp8" || config_.kv_cache_dtype == "fp8_e4m3",
           "--kv-cache-dtype must be auto, fp8 or fp8_e4m3, got '{}'", config_.kv_cache_dtype);
  const DType kv_dtype = config_.kv_cache_dtype == "auto" ? backend_->activation_dtype() : DType::F8E4M3;
  const KvCacheSpec spec = model_->model().kv_spec(config_.block_size, kv_dtype);
  int64_t pages = config_.kv_cache_tokens > 0
                      ? (config_.kv_cache_tokens + config_.block_size - 1) / config_.block_size
                      : config_.kv_cache_memory_bytes / static_cast<int64_t>(spec.bytes_per_page());
  if (config_.kv_cache_tokens == 0 && backend_->memory_info()) pages = plan_device_kv_pages(spec);
  DI_CHECK(pages >= 2 && pages < (int64_t{1} << 30), "KV cache of {} pages is out of range", pages);
  kv_ = std::make_unique<KvStorage>(*backend_, spec, static_cast<int32_t>(pages));
  const int64_t kv_tokens = pages * config_.block_size;
  log_info("engine: KV cache ({}) {:.1f} MiB = {} tokens in {} pages of {}; max concurrency at {} tokens: {:.1f}x",
           dtype_name(kv_dtype), kv_->bytes() / 1048576.0, kv_tokens, pages, config_.block_size, max_model_len_,
           static_cast<double>(kv_tokens) / max_model_len_);

  pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(pages));
  if (config_.enable_prefix_caching) {
    prefix_cache_ = std::make_unique<PrefixCache>(*pool_, config_.block_size);
  }
  SchedulerConfig sc;
  sc.capacity.block_size = config_.block_size;
  sc.capacity.max_num_seqs = config_.max_num_seqs;
  sc.planner.max_num_batched_tokens = config_.max_num_batched_tokens;
  sc.planner.cost_model = config_.cost_model;
  sc.planner.step_time_budget_s = config_.step_time_budget_s;
  // Pages can be released early only when every layer is windowed.
  const bool all_sliding = std::all_of(mc.layer_window.begin(), mc.layer_window.end(), [](int32_t w) { return w > 0; });
  sc.sliding_window = all_sliding ? *std::min_element(mc.layer_window.begin(), mc.layer_window.end()) : 0;
  scheduler_ = std::make_unique<Scheduler>(sc, *pool_, prefix_cache_.get());
  RunnerLimits limits;
  limits.max_num_batched_tokens = config_.max_num_batched_tokens;
  limits.max_num_seqs = config_.max_num_seqs;
  limits.max_model_len = max_model_len_;
  limits.use_graphs = !config_.enforce_eager;
  if (config_.eplb_ep_size != 0 || !config_.routing_trace_path.empty()) {
    std::vector<int32_t> moe_layers;
    for (int32_t i = 0; i < mc.n_layers; ++i) {
      if (mc.is_moe(i)) moe_layers.push_back(i);
    }
    DI_CHECK(!moe_layers.empty() && mc.moe.n_experts > 0,
             "--eplb-ep-size and --routing-trace need a mixture-of-experts model; {} has no MoE layer", mc.arch);
    moe::ExpertLoadMonitorOptions eo;
    eo.num_ranks = config_.eplb_ep_size;
    eo.schedule = {config_.eplb_window_steps, config_.eplb_interval_steps, config_.eplb_redundant_slots};
    eo.trace_path = config_.routing_trace_path;
    expert_load_ = std::make_unique<moe::ExpertLoadMonitor>(moe_layers, mc.moe.n_experts, eo);
    limits.count_experts = true;
    if (expert_load_->balancing()) {
      log_info("engine: EPLB statistics for {} MoE layers x {} experts, simulating {} ranks: window {} steps, "
               "re-placement every {} steps, {} redundant slot(s) per rank",
               moe_layers.size(), mc.moe.n_experts, eo.num_ranks, eo.schedule.window_steps,
               eo.schedule.interval_steps, eo.schedule.redundant_slots_per_rank);
    }
    if (!eo.trace_path.empty()) {
      log_info("engine: routing trace of {} MoE layers to {} (one file per layer)", moe_layers.size(),
               moe::ExpertLoadMonitor::trace_file(eo.trace_path, moe_layers.front()));
    }
  }
  runner_ = std::make_unique<ModelRunner>(model_->model(), *backend_, *kv_, limits);
  pipelined_ = env_flag("DEEPINFER_ZERO_OVERHEAD_SCHEDULING", config_.zero_overhead_scheduling);
  log_info("engine: {} step loop{}", pipelined_ ? "pipelined (zero-overhead)" : "synchronous",
           backend_->supports_graphs() && limits.use_graphs ? ", CUDA graphs for decode" : "");
  sampler_ = std::make_unique<Sampler>(mc.vocab_size);
}

Engine::~Engine() = default;

int64_t Engine::plan_device_kv_pages(const KvCacheSpec& spec) {
  DI_CHECK(config_.gpu_memory_utilization > 0.0 && config_.gpu_memory_utilization < 1.0,
           "--gpu-memory-utilization {} must be in (0, 1)", config_.gpu_memory_utilization);
  // Activations first (the runner's reservation is then a no-op), so the
  // free memory measured below is what weights and activations left.
  const int32_t max_rows = std::min(config_.max_num_batched_tokens, config_.max_num_seqs);
  model_->model().reserve(config_.max_num_batched_tokens, max_rows);
  const DeviceMemoryInfo mem = *backend_->memory_info();
  const auto total = static_cast<double>(mem.total_bytes);
  const double in_use = total - static_cast<double>(mem.free_bytes);  // weights, activations, other processes
  // Still to come besides the cache: the runner's logits and step inputs, and
  // room for CUDA graphs and library workspaces.
  const double logits = double(max_rows) * model_->config().vocab_size * 4.0;
  const double runner_inputs = 64.0 * (config_.max_num_batched_tokens + 4.0 * config_.max_num_seqs);
  constexpr double kGraphsAndLibraries = 512.0 * 1048576.0;
  const double budget = config_.gpu_memory_utilization * total - in_use - logits - runner_inputs - kGraphsAndLibraries;
  const double per_page = static_cast<double>(spec.bytes_per_page()) + 8.0;  // + two page-table entries per page
  const auto pages = static_cast<int64_t>(budget / per_page) - 1;         // - the padding page
  log_info("engine: device memory {:.1f} GiB, {:.1f} GiB in use after loading (weights {:.2f} GiB); "
           "--gpu-memory-utilization {:.2f} leaves {:.2f} GiB for the KV cache",
           total / 1073741824.0, in_use / 1073741824.0, model_->model().weight_bytes() / 1073741824.0,
           config_.gpu_memory_utilization, std::max(budget, 0.0) / 1073741824.0);
  DI_CHECK(pages >= 2,
           "not enough device memory for a KV cache: {:.2f} GiB of {:.2f} GiB are in use after loading the model; "
           "raise --gpu-memory-utilization or lower --max-num-batched-tokens / --max-num-seqs",
           in_use / 1073741824.0, total / 1073741824.0);
  return std::min<int64_t>(pages, (int64_t{1} << 30) - 2);
}

int32_t Engine::vocab_size() const { return model_->config().vocab_size; }
const ModelConfig& Engine::model_config() const { return model_->config(); }

uint64_t Engine::add_request(std::vector<int32_t> prompt_ids, SamplingParams params, std::string cache_salt) {
  const int32_t vocab = vocab_size();
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
  if (prompt_len >= max_model_len_) {
    throw ParamError("prompt", fmt::format("the prompt has {} tokens, but the maximum context length "
                                           "is {} (--max-model-len) and at least one token must be generated",
                                           prompt_len, max_model_len_));
  }
  if (!params.max_tokens) {
    params.max_tokens = max_model_len_ - prompt_len;
  } else if (prompt_len + *params.max_tokens > max_model_len_) {
    throw ParamError("max_tokens", fmt::format("max_tokens {} plus the prompt's {} tokens exceeds the "
                                               "maximum context length {}",
                                               *params.max_tokens, prompt_len, max_model_len_));
  }
  const uint64_t id = next_id_++;
  const uint64_t seed = params.seed ? *params.seed : rng::derive_seed(config_.seed, id);
  const int32_t token_limit = std::min(max_model_len_, prompt_len + *params.max_tokens);
  auto request = std::make_unique<Request>(id, std::move(prompt_ids), std::move(params), seed, std::move(cache_salt));
  request->token_limit = token_limit;
  request->host_sampling = needs_host_sampling(request->params());
  auto live = std::make_unique<Live>(std::move(request), *tokenizer_);
  const Request& r = *live->request;
  if (!r.host_sampling && PenaltyState::needed(r.params())) {
    live->penalties.emplace(r.params(), r.prompt_ids(), tokenizer_->eos_ids());
  }
  scheduler_->add(live->request.get());
  stats_.prompt_tokens += prompt_len;
  requests_.emplace(id, std::move(live));
  return id;
}

void Engine::abort(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second->abort_requested) return;
  it->second->abort_requested = true;
  scheduler_->finish(it->second->request.get(), newest_inflight_step());
  aborted_.push_back(request_id);
}

void Engine::finish(Live& live, FinishReason reason, RequestOutput& out) {
  Request& r = *live.request;
  if (reason != FinishReason::Abort && out.stop_reason.empty()) {
    // Nothing more will arrive: flush bytes held back for UTF-8 completeness.
    live.text += live.detokenizer.finish();
  }
  if (live.emitted < live.text.size()) out.new_text += live.text.substr(live.emitted);
  live.emitted = live.text.size();
  r.state = reason == FinishReason::Abort ? RequestState::Aborted : RequestState::Finished;
  r.finish_reason = reason;
  r.timings.finished = Clock::now();
  if (reason != FinishReason::Abort) scheduler_->finish(&r, newest_inflight_step());
  out.finished = true;
  out.finish_reason = reason;
  finished_summaries_[r.id()] = RequestSummary{r.num_prompt_tokens(), r.num_cached_prompt_tokens,
                                               r.num_output_tokens(), r.timings};
}

void Engine::process_sample(Live& live, const SampleResult& result, RequestOutput& out) {
  Request& r = *live.request;
  const SamplingParams& p = r.params();
  const int32_t token = result.token;
  r.append_output(token);
  if (live.penalties) live.penalties->add_output(token);
  ++stats_.generation_tokens;
  if (r.num_output_tokens() == 1) r.timings.first_token = Clock::now();
  TokenOutput t;
  t.token = token;
  if (p.logprobs) {
    t.logprob = result.logprob;
    t.rank = result.rank;
    auto top = result.top_logprobs();
    t.top.assign(top.begin(), top.end());
  }
  out.new_tokens.push_back(std::move(t));

  const bool min_reached = r.num_output_tokens() >= p.min_tokens;
  const auto& eos = tokenizer_->eos_ids();
  const bool is_eos = !p.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end();
  const bool is_stop_token =
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (min_reached && (is_eos || is_stop_token)) {
    if (is_stop_token && !is_eos) {
      // Like EOS, a stop token's text is part of the output only when it is not special.
      live.text += live.detokenizer.push(token);
      out.stop_reason = std::to_string(token);
    }
    finish(live, FinishReason::Stop, out);
    return;
  }
  live.text += live.detokenizer.push(token);
  if (!p.stop.empty() && min_reached) {
    const size_t from = live.emitted >= live.max_stop_len ? live.emitted - live.max_stop_len + 1 : 0;
    size_t best = std::string::npos;
    const std::string* matched = nullptr;
    for (const auto& s : p.stop) {
      size_t pos = live.text.find(s, from);
      if (pos != std::string::npos && (best == std::string::npos || pos < best)) {
        best = pos;
        matched = &s;
      }
    }
    if (matched) {
      live.text.resize(best + (p.include_stop_str_in_output ? matched->size() : 0));
      out.stop_reason = *matched;
      finish(live, FinishReason::Stop, out);
      return;
    }
  }
  if (r.num_output_tokens() >= *p.max_tokens || r.num_tokens() >= max_model_len_) {
    finish(live, FinishReason::Length, out);
    return;
  }
  // Hold back a tail that could still grow into a stop string.
  size_t safe = live.text.size();
  if (!p.stop.empty()) safe = live.text.size() > live.max_stop_len - 1 ? live.text.size() - (live.max_stop_len - 1) : 0;
  if (safe > live.emitted) {
    out.new_text += live.text.substr(live.emitted, safe - live.emitted);
    live.emitted = safe;
  }
}

std::optional<uint64_t> Engine::newest_inflight_step() const {
  if (!inflight_) return std::nullopt;
  return inflight_->id;
}

Engine::InflightStep Engine::launch(const ScheduledBatch& batch) {
  InflightStep step;
  step.id = next_step_id_++;
  std::vector<RowSampling> rows;
  int32_t copied = 0;
  for (const ScheduledSeq& s : batch.seqs) {
    if (!s.sample) continue;
    const Request& r = *s.request;
    const SamplingParams& p = r.params();
    RowSampling rs;
    rs.params.temperature = p.temperature;
    rs.params.top_p = p.top_p;
    rs.params.min_p = p.min_p;
    rs.params.top_k = p.top_k;
    rs.params.seed = r.seed();
    // Index of the sampled token within the output, counting tokens still in flight.
    rs.params.position = r.num_output_tokens() + r.num_inflight_tokens;
    rs.copy_logits = r.host_sampling || p.logprobs.has_value();
    if (!r.host_sampling && PenaltyState::needed(p)) rs.penalties = &*requests_.at(r.id())->penalties;
    StepRow row;
    row.request_id = r.id();
    row.generation = r.generation;
    row.host_sample = r.host_sampling;
    row.logits_index = rs.copy_logits ? copied++ : -1;
    rows.push_back(rs);
    step.rows.push_back(row);
  }
  step.slot = runner_->launch(batch, rows);
  stats_.logits_rows_copied += copied;
  int32_t j = 0;
  for (const ScheduledSeq& s : batch.seqs) {
    if (!s.sample) continue;
    Request& r = *s.request;
    ++r.num_inflight_tokens;
    r.inflight_slot = step.slot;
    r.inflight_row = j++;
  }
  scheduler_->commit(batch);
  ++stats_.steps;
  return step;
}

void Engine::complete(const InflightStep& step, std::vector<RequestOutput>& outputs) {
  const StepResults res = runner_->wait(step.slot);
  // The device is done with this step: blocks held for it can be reused.
  scheduler_->release_deferred(step.id);
  stats_.device_busy_ms += res.device_ms;
  stats_.last_step_device_ms = res.device_ms;
  stats_.last_step_idle_ms = res.idle_ms_before;
  ++stats_.timed_steps;
  if (res.graph) ++stats_.graph_steps;
  if (expert_load_) expert_load_->record_step(res.expert_counts);
  if (res.idle_ms_before >= 0) {
    stats_.device_idle_ms += res.idle_ms_before;
    stats_.device_idle_max_ms = std::max(stats_.device_idle_max_ms, res.idle_ms_before);
  }
  const size_t vocab = static_cast<size_t>(vocab_size());
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const StepRow& row = step.rows[i];
    auto it = requests_.find(row.request_id);
    if (it == requests_.end()) continue;  // finished or aborted meanwhile
    Live& live = *it->second;
    Request& r = *live.request;
    if (live.abort_requested || r.is_finished() || r.generation != row.generation) continue;  // late result
    DI_CHECK(r.num_inflight_tokens > 0, "request {} receives a token it did not wait for", r.id());
    if (--r.num_inflight_tokens == 0) r.inflight_slot = r.inflight_row = -1;
    std::span<const float> logits;
    if (row.logits_index >= 0) logits = res.logits.subspan(static_cast<size_t>(row.logits_index) * vocab, vocab);
    SampleResult result;
    if (row.host_sample) {
      SamplingRow srow;
      srow.params = &r.params();
      srow.prompt_ids = r.prompt_ids();
      srow.output_ids = r.output_ids();
      srow.seed = r.seed();
      srow.position = r.num_output_tokens();
      srow.eos_masked = r.num_output_tokens() < r.params().min_tokens;
      srow.eos_ids = tokenizer_->eos_ids();
      result = sampler_->sample_row(logits, srow);
    } else {
      result.token = res.tokens[i];
      DI_CHECK(result.token >= 0 && result.token < vocab_size(), "device sampler returned token {} (vocabulary {})",
               result.token, vocab_size());
      if (r.params().logprobs) Sampler::compute_logprobs(logits, result.token, *r.params().logprobs, result);
    }
    RequestOutput out;
    out.request_id = r.id();
    process_sample(live, result, out);
    const bool done = out.finished;
    outputs.push_back(std::move(out));
    if (done) requests_.erase(it);
  }
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

  ScheduledBatch batch = scheduler_->schedule();
  stats_.num_preemptions += static_cast<int64_t>(batch.preempted.size());
  // Launch this step before finishing the previous one: the device works on
  // it while the host reads the previous step's tokens.
  std::unique_ptr<InflightStep> previous = std::move(inflight_);
  if (!batch.empty()) inflight_ = std::make_unique<InflightStep>(launch(batch));
  if (previous) complete(*previous, outputs);
  // Synchronous loop, or nothing left that the step in flight could serve
  // (flush at the end of the pipeline): finish it now.
  if (inflight_ && (!pipelined_ || requests_.empty())) {
    std::unique_ptr<InflightStep> current = std::move(inflight_);
    complete(*current, outputs);
  }
  if (!inflight_) backend_->synchronize();  // surfaces device-side input errors while idle
  return outputs;
}

std::optional<RequestSummary> Engine::summary(uint64_t request_id) const {
  auto it = finished_summaries_.find(request_id);
  if (it == finished_summaries_.end()) return std::nullopt;
  return it->second;
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.kv_usage = pool_->usage();
  if (prefix_cache_) {
    s.prefix_query_tokens = prefix_cache_->stats().query_tokens;
    s.prefix_hit_tokens = prefix_cache_->stats().hit_tokens;
  }
  if (expert_load_ && expert_load_->balancing()) {
    s.eplb = true;
    s.moe_lb = expert_load_->moe_lb();
    s.moe_lb_contiguous = expert_load_->moe_lb_contiguous();
    s.eplb_replacements = expert_load_->replacements();
  }
  return s;
}

void Engine::check_integrity() const {
  pool_->check_integrity();
  if (prefix_cache_) prefix_cache_->check_integrity();
  if (requests_.empty()) {
    DI_CHECK(pool_->num_free() == pool_->num_blocks(), "KV leak: {} of {} blocks still held with no request in flight",
             pool_->num_blocks() - pool_->num_free(), pool_->num_blocks());
  }
}

double Engine::time_prefill_step(int32_t num_new_tokens, int32_t num_cached_tokens) {
  DI_CHECK(requests_.empty(), "time_prefill_step needs an idle engine");
  const int32_t total = num_new_tokens + num_cached_tokens;
  DI_CHECK(num_new_tokens > 0 && num_new_tokens <= config_.max_num_batched_tokens && total <= max_model_len_,
           "timing step of {} new + {} cached tokens is out of range", num_new_tokens, num_cached_tokens);
  Request r(0, std::vector<int32_t>(static_cast<size_t>(total), 0), SamplingParams{}, 0);
  auto blocks = pool_->allocate((total + config_.block_size - 1) / config_.block_size);
  DI_CHECK(blocks.has_value(), "KV cache too small for a timing step of {} tokens", total);
  r.block_ids = *blocks;
  ScheduledBatch batch;
  batch.seqs.push_back({&r, num_cached_tokens, num_new_tokens, true});
  batch.num_tokens = num_new_tokens;
  RowSampling greedy;
  greedy.params.temperature = 0.0f;
  const auto t0 = std::chrono::steady_clock::now();
  runner_->wait(runner_->launch(batch, std::span(&greedy, 1)));
  backend_->synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pool_->release(r.block_ids);
  return secs;
}

}  // namespace deepinfer
