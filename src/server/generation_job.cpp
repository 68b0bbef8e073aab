#include "server/generation_job.h"

#include <chrono>
#include <numeric>

#include "core/logging.h"
#include "engine/prompt_builder.h"
#include "server/kv_export_fence.h"
#include "server/metrics.h"

namespace deepinfer::server {

namespace {

int64_t count_prompt_tokens(const std::vector<std::vector<int32_t>>& prompts) {
  return std::accumulate(prompts.begin(), prompts.end(), int64_t{0},
                         [](int64_t sum, const std::vector<int32_t>& p) { return sum + static_cast<int64_t>(p.size()); });
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

GenerationJob::GenerationJob(JobContext context, GenerationRequest request, std::vector<std::vector<int32_t>> prompts,
                             std::vector<std::string> prompt_texts, std::shared_ptr<ResponseChannel> channel)
    : ctx_(std::move(context)), request_(std::move(request)), prompts_(std::move(prompts)), channel_(std::move(channel)),
      events_(*channel_),
      encoder_(make_response_encoder({request_, *ctx_.tokenizer, ctx_.model_name, count_prompt_tokens(prompts_),
                                      std::move(prompt_texts)})) {
  const bool parse = !encoder_->wants_raw_text();
  const bool parse_tools = parse && !request_.tools.is_null() && request_.tool_choice != ToolChoice::None;
  const ToolCallFormat tool_format = parse_tools ? ctx_.tool_format : ToolCallFormat::None;
  const size_t n = static_cast<size_t>(request_.params.n);
  samples_.resize(prompts_.size() * n);
  progress_.reserve(samples_.size());
  for (size_t i = 0; i < samples_.size(); ++i) {
    samples_[i].prompt = i / n;
    progress_.push_back({OutputParser(tool_format, parse && ctx_.reasoning)});
  }
}

GenerationJob::~GenerationJob() = default;

void GenerationJob::start() {
  std::vector<EngineSubmission> group;
  const std::vector<SamplingParams> params = fan_out(request_.params);
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  for (size_t i = 0; i < samples_.size(); ++i) {
    EngineSubmission s;
    s.prompt_ids = prompts_[samples_[i].prompt];
    s.params = params[i % params.size()];
    s.cache_salt = request_.cache_salt;
    s.kv_source = request_.kv_source;
    // The engine thread only hands the event to this connection's strand.
    s.sink = [self = shared_from_this(), i](EngineEvent&& ev) {
      self->channel_->post([self, i, ev = std::move(ev)]() mutable { self->on_event(i, std::move(ev)); });
    };
    group.push_back(std::move(s));
  }
  SubmitResult result = ctx_.engine->submit(std::move(group));
  switch (result.status) {
    case SubmitStatus::Accepted:
      break;
    case SubmitStatus::QueueFull:
      if (ctx_.metrics.rejected) ctx_.metrics.rejected->inc();
      send_error(429, "the server is at capacity (--max-waiting); retry later", "rate_limit_error");
      return;
    case SubmitStatus::ShuttingDown:
      send_error(503, "the server is shutting down", "overloaded_error");
      return;
    case SubmitStatus::NotReady:
      send_error(503, ctx_.engine->dead() ? "the engine is not running" : "the model is still loading",
                 "overloaded_error");
      return;
  }
  engine_ids_ = std::move(result.ids);
  remaining_ = samples_.size();
  channel_->on_disconnect([weak] {
    if (auto self = weak.lock()) self->abort_all();
  });
  if (request_.stream) {
    channel_->start_stream(200, "text/event-stream");
    encoder_->stream_start(events_, samples_);
  }
}

void GenerationJob::abort_all() {
  for (uint64_t id : engine_ids_) ctx_.engine->abort(id);
}

void GenerationJob::send_error(int status, const std::string& message, const std::string& type) {
  channel_->send(status, "application/json", dump_json(error_body(request_.api, status, message, type)));
}

void GenerationJob::record_token_gap(SampleProgress& progress, const EngineEvent& ev) {
  const size_t n_new = ev.output.new_tokens.size();
  if (n_new == 0) return;
  if (progress.last_token != Clock::time_point{} && ctx_.metrics.inter_token) {
    // Tokens that one step brought (speculative decoding) share its gap.
    const double gap = seconds_between(progress.last_token, ev.time);
    for (size_t k = 0; k < n_new; ++k) ctx_.metrics.inter_token->observe(gap / n_new);
  }
  progress.last_token = ev.time;
}

void GenerationJob::record_finish(const SampleOutput& sample, const EngineEvent& ev) {
  const JobMetrics& m = ctx_.metrics;
  if (ev.summary) {
    const RequestTimings& t = ev.summary->timings;
    if (m.ttft && t.first_token != Clock::time_point{}) m.ttft->observe(seconds_between(t.arrival, t.first_token));
    if (m.queue_time && t.first_scheduled != Clock::time_point{}) {
      m.queue_time->observe(seconds_between(t.arrival, t.first_scheduled));
    }
    if (m.e2e) m.e2e->observe(seconds_between(t.arrival, t.finished));
  }
  Counter* done = sample.finish == FinishReason::Stop     ? m.success_stop
                  : sample.finish == FinishReason::Length ? m.success_length
                                                          : m.success_abort;
  if (done) done->inc();
}

void GenerationJob::on_event(size_t index, EngineEvent ev) {
  SampleOutput& s = samples_[index];
  if (s.finished) return;
  SampleProgress& progress = progress_[index];
  const RequestOutput& out = ev.output;
  record_token_gap(progress, ev);
  for (const TokenOutput& t : out.new_tokens) s.token_ids.push_back(t.token);
  if (request_.params.logprobs) s.logprobs.insert(s.logprobs.end(), out.new_tokens.begin(), out.new_tokens.end());
  s.text += out.new_text;
  ParsedDelta delta = progress.parser.push(out.new_text);
  if (out.finished) {
    ParsedDelta rest = progress.parser.finish();
    delta.reasoning += rest.reasoning;
    delta.content += rest.content;
    for (auto& t : rest.tool_calls) delta.tool_calls.push_back(std::move(t));
    s.finished = true;
    s.finish = out.finish_reason;
    s.stop_reason = out.stop_reason;
    s.stop_string = !out.stop_reason.empty() && out.finish_reason == FinishReason::Stop;
    if (ev.summary) s.num_cached = ev.summary->num_cached_prompt_tokens;
    if (!ev.error.empty()) {
      if (!failed_) failure_ = ev.error;
      failed_ = true;
      log_error("request {}: {}", encoder_->id(), ev.error);
    }
    record_finish(s, ev);
  }
  s.reasoning += delta.reasoning;
  s.content += delta.content;
  for (const auto& t : delta.tool_calls) {
    s.tool_calls.push_back(t);
    s.tool_call_ids.push_back(encoder_->new_tool_call_id());
  }
  if (request_.stream && !failed_) {
    encoder_->stream_delta(events_, index, s, delta, out.new_tokens);
    if (s.finished) encoder_->stream_finish(events_, index, s);
  }
  if (s.finished && --remaining_ == 0) on_all_finished();
}

void GenerationJob::on_all_finished() {
  if (failed_) {
    const std::string message = "the request failed in the engine: " + failure_;
    if (request_.stream) {
      // The headers are out: the error goes in the stream, which then ends.
      encoder_->stream_error(events_, message);
      channel_->end();
    } else {
      send_error(500, message, "api_error");
    }
    return;
  }
  if (ctx_.export_fence && ctx_.export_tiers) {
    auto self = shared_from_this();
    ctx_.export_fence->after_persisted(*ctx_.export_tiers, [self](bool persisted) {
      self->channel_->post([self, persisted] { self->send_result(persisted); });
    });
    return;
  }
  send_result(std::nullopt);
}

void GenerationJob::send_result(std::optional<bool> kv_exported) {
  if (!request_.stream) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (kv_exported) {
      headers.emplace_back("x-deepinfer-kv-exported", *kv_exported ? "true" : "false");
      // Where a decode engine finds the KV when it is not in a shared directory.
      if (std::string source = ctx_.export_tiers->export_source(); !source.empty()) {
        headers.emplace_back("x-deepinfer-kv-source", std::move(source));
      }
    }
    channel_->send(200, "application/json", dump_json(encoder_->body(samples_)), std::move(headers));
    return;
  }
  encoder_->stream_end(events_, samples_);
  channel_->end();
}

}  // namespace deepinfer::server
