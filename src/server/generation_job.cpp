#include "server/generation_job.h"

#include <fmt/format.h>

#include <chrono>
#include <random>

#include "core/logging.h"
#include "engine/prompt_builder.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

struct GenerationJob::Choice {
  size_t prompt = 0;
  std::string text;  // raw generated text
  std::vector<int32_t> token_ids;
  std::vector<TokenOutput> logprobs;
  std::unique_ptr<OutputParser> parser;
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  std::vector<std::string> tool_call_ids;
  FinishReason finish = FinishReason::None;
  std::string stop_reason;
  bool finished = false;
  bool stop_string = false;  // stopped by a stop string (not EOS / stop token)
  int32_t num_cached = 0;
  Clock::time_point last_token{};
};

GenerationJob::GenerationJob(JobContext context, GenerationRequest request, std::vector<std::vector<int32_t>> prompts,
                             std::vector<std::string> prompt_texts, std::shared_ptr<ResponseChannel> channel)
    : ctx_(std::move(context)), request_(std::move(request)), prompts_(std::move(prompts)),
      prompt_texts_(std::move(prompt_texts)), channel_(std::move(channel)) {
  const char* prefix = request_.api == Api::Chat         ? "chatcmpl-"
                       : request_.api == Api::Completion ? "cmpl-"
                       : request_.api == Api::Responses  ? "resp_"
                                                         : "msg_";
  id_ = random_id(prefix);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const bool parse_tools = !request_.tools.is_null() && request_.tool_choice != ToolChoice::None &&
                           request_.api != Api::Completion;
  const bool reasoning = ctx_.reasoning && request_.api != Api::Completion;
  const size_t n = static_cast<size_t>(request_.params.n);
  choices_.resize(prompts_.size() * n);
  for (size_t i = 0; i < choices_.size(); ++i) {
    choices_[i].prompt = i / n;
    choices_[i].parser = std::make_unique<OutputParser>(parse_tools ? ctx_.tool_format : ToolCallFormat::None, reasoning);
  }
}

GenerationJob::~GenerationJob() = default;

void GenerationJob::start() {
  std::vector<EngineSubmission> group;
  const std::vector<SamplingParams> samples = fan_out(request_.params);
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  for (size_t i = 0; i < choices_.size(); ++i) {
    EngineSubmission s;
    s.prompt_ids = prompts_[choices_[i].prompt];
    s.params = samples[i % samples.size()];
    s.cache_salt = request_.cache_salt;
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
  remaining_ = choices_.size();
  channel_->on_disconnect([weak] {
    if (auto self = weak.lock()) self->abort_all();
  });
  if (request_.stream) emit_stream_start();
}

void GenerationJob::abort_all() {
  for (uint64_t id : engine_ids_) ctx_.engine->abort(id);
}

void GenerationJob::send_error(int status, const std::string& message, const std::string& type) {
  ojson body;
  if (request_.api == Api::Messages) {
    body = {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  } else {
    body = {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
  }
  channel_->send(status, "application/json", dump_json(body));
}

std::string GenerationJob::token_text(int32_t id) const {
  const int32_t ids[1] = {id};
  return ctx_.tokenizer->decode(ids, false);
}

void GenerationJob::sse(const std::string& event, const ojson& data) {
  std::string s;
  if (!event.empty()) s = "event: " + event + "\n";
  s += "data: " + dump_json(data) + "\n\n";
  channel_->write(std::move(s));
}

void GenerationJob::on_event(size_t index, EngineEvent ev) {
  Choice& c = choices_[index];
  if (c.finished) return;
  const JobMetrics& m = ctx_.metrics;
  RequestOutput& out = ev.output;
  if (!out.new_tokens.empty()) {
    if (c.last_token != Clock::time_point{} && m.inter_token) {
      const double gap = std::chrono::duration<double>(ev.time - c.last_token).count();
      for (size_t k = 0; k < out.new_tokens.size(); ++k) m.inter_token->observe(gap / out.new_tokens.size());
    }
    c.last_token = ev.time;
  }
  for (const TokenOutput& t : out.new_tokens) c.token_ids.push_back(t.token);
  if (request_.params.logprobs) c.logprobs.insert(c.logprobs.end(), out.new_tokens.begin(), out.new_tokens.end());
  c.text += out.new_text;
  ParsedDelta delta = c.parser->push(out.new_text);
  if (out.finished) {
    ParsedDelta rest = c.parser->finish();
    delta.reasoning += rest.reasoning;
    delta.content += rest.content;
    for (auto& t : rest.tool_calls) delta.tool_calls.push_back(std::move(t));
    c.finished = true;
    c.finish = out.finish_reason;
    c.stop_reason = out.stop_reason;
    c.stop_string = !out.stop_reason.empty() && out.finish_reason == FinishReason::Stop;
    if (!ev.error.empty()) {
      failed_ = true;
      log_error("request {}: {}", id_, ev.error);
    }
    if (ev.summary) {
      c.num_cached = ev.summary->num_cached_prompt_tokens;
      const RequestTimings& t = ev.summary->timings;
      auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
      if (m.ttft && t.first_token != Clock::time_point{}) m.ttft->observe(secs(t.arrival, t.first_token));
      if (m.queue_time && t.first_scheduled != Clock::time_point{}) m.queue_time->observe(secs(t.arrival, t.first_scheduled));
      if (m.e2e) m.e2e->observe(secs(t.arrival, t.finished));
    }
    Counter* done = c.finish == FinishReason::Stop ? m.success_stop : c.finish == FinishReason::Length ? m.success_length : m.success_abort;
    if (done) done->inc();
  }
  c.reasoning += delta.reasoning;
  c.content += delta.content;
  for (const auto& t : delta.tool_calls) {
    c.tool_calls.push_back(t);
    c.tool_call_ids.push_back(random_id(request_.api == Api::Messages ? "toolu_" : "call_"));
  }
  if (request_.stream && !failed_) {
    emit_stream_delta(index, delta, out.new_tokens);
    if (c.finished) emit_stream_finish(index);
  }
  if (c.finished && --remaining_ == 0) on_all_finished();
}

namespace {

std::string openai_finish(FinishReason r, bool tool_calls) {
  switch (r) {
    case FinishReason::Stop: return tool_calls ? "tool_calls" : "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    default: return "stop";
  }
}

}  // namespace

ojson GenerationJob::chat_logprobs(const std::vector<TokenOutput>& tokens) const {
  ojson content = ojson::array();
  for (const TokenOutput& t : tokens) {
    const std::string text = token_text(t.token);
    ojson top = ojson::array();
    for (const TokenLogprob& a : t.top) {
      const std::string at = token_text(a.token);
      top.push_back({{"token", at}, {"logprob", a.logprob}, {"bytes", std::vector<uint8_t>(at.begin(), at.end())}});
    }
    content.push_back({{"token", text},
                       {"logprob", t.logprob},
                       {"bytes", std::vector<uint8_t>(text.begin(), text.end())},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

ojson GenerationJob::completion_logprobs(const std::vector<TokenOutput>& tokens, size_t text_offset) const {
  ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const TokenOutput& t : tokens) {
    const std::string text = token_text(t.token);
    toks.push_back(text);
    lps.push_back(t.logprob);
    ojson top = ojson::object();
    for (const TokenLogprob& a : t.top) top[token_text(a.token)] = a.logprob;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

ojson GenerationJob::usage_json() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const auto& p : prompts_) prompt += static_cast<int64_t>(p.size());
  for (const Choice& c : choices_) completion += static_cast<int64_t>(c.token_ids.size());
  // Samples of one prompt share its prefix; report the first sample's hits per prompt.
  const size_t n = static_cast<size_t>(request_.params.n);
  for (size_t i = 0; i < choices_.size(); i += n) cached += choices_[i].num_cached;
  if (request_.api == Api::Messages) {
    return {{"input_tokens", prompt}, {"output_tokens", completion}, {"cache_read_input_tokens", cached},
            {"cache_creation_input_tokens", 0}};
  }
  if (request_.api == Api::Responses) {
    return {{"input_tokens", prompt}, {"input_tokens_details", {{"cached_tokens", cached}}},
            {"output_tokens", completion}, {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", prompt + completion}};
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

void GenerationJob::emit_stream_start() {
  switch (request_.api) {
    case Api::Chat: {
      channel_->start_stream(200, "text/event-stream");
      ojson choices = ojson::array();
      for (size_t i = 0; i < choices_.size(); ++i) {
        choices.push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      }
      sse("", {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", ctx_.model_name},
               {"choices", choices}});
      break;
    }
    case Api::Completion:
      channel_->start_stream(200, "text/event-stream");
      break;
    case Api::Responses: {
      channel_->start_stream(200, "text/event-stream");
      ojson resp = final_body();
      resp["status"] = "in_progress";
      resp["output"] = ojson::array();
      resp["usage"] = nullptr;
      sse("response.created", {{"type", "response.created"}, {"sequence_number", sequence_++}, {"response", resp}});
      sse("response.in_progress", {{"type", "response.in_progress"}, {"sequence_number", sequence_++}, {"response", resp}});
      break;
    }
    case Api::Messages: {
      channel_->start_stream(200, "text/event-stream");
      ojson usage = usage_json();
      usage["output_tokens"] = 0;
      sse("message_start", {{"type", "message_start"},
                            {"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", ctx_.model_name},
                                         {"content", ojson::array()}, {"stop_reason", nullptr},
                                         {"stop_sequence", nullptr}, {"usage", usage}}}});
      sse("ping", {{"type", "ping"}});
      break;
    }
  }
}

void GenerationJob::emit_stream_delta(size_t index, const ParsedDelta& delta, const std::vector<TokenOutput>& tokens) {
  Choice& c = choices_[index];
  const size_t first_new_call = c.tool_calls.size() - delta.tool_calls.size();
  switch (request_.api) {
    case Api::Chat: {
      const bool want_lp = request_.chat_logprobs && !tokens.empty();
      if (delta.empty() && !want_lp) return;
      ojson d = ojson::object();
      if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
      if (!delta.content.empty() || (want_lp && delta.tool_calls.empty())) d["content"] = delta.content;
      if (!delta.tool_calls.empty()) {
        ojson calls = ojson::array();
        for (size_t k = 0; k < delta.tool_calls.size(); ++k) {
          const size_t idx = first_new_call + k;
          calls.push_back({{"index", idx}, {"id", c.tool_call_ids[idx]}, {"type", "function"},
                           {"function", {{"name", delta.tool_calls[k].name}, {"arguments", delta.tool_calls[k].arguments}}}});
        }
        d["tool_calls"] = calls;
      }
      ojson choice = {{"index", index}, {"delta", d}, {"logprobs", want_lp ? chat_logprobs(tokens) : ojson()},
                      {"finish_reason", nullptr}};
      sse("", {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", ctx_.model_name},
               {"choices", ojson::array({choice})}});
      break;
    }
    case Api::Completion: {
      std::string text = delta.content;
      const bool first = c.token_ids.size() == tokens.size();
      if (first && request_.echo && c.prompt < prompt_texts_.size()) text = prompt_texts_[c.prompt] + text;
      const bool want_lp = request_.params.logprobs && !tokens.empty();
      if (text.empty() && !want_lp) return;
      ojson choice = {{"index", index}, {"text", text},
                      {"logprobs", want_lp ? completion_logprobs(tokens, c.text.size() - delta.content.size()) : ojson()},
                      {"finish_reason", nullptr}};
      sse("", {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", ctx_.model_name},
               {"choices", ojson::array({choice})}});
      break;
    }
    case Api::Responses: {
      if (!delta.content.empty()) {
        if (message_item_id_.empty()) {
          message_item_id_ = random_id("msg_");
          sse("response.output_item.added",
              {{"type", "response.output_item.added"}, {"sequence_number", sequence_++}, {"output_index", output_index_},
               {"item", {{"type", "message"}, {"id", message_item_id_}, {"status", "in_progress"}, {"role", "assistant"},
                         {"content", ojson::array()}}}});
          sse("response.content_part.added",
              {{"type", "response.content_part.added"}, {"sequence_number", sequence_++}, {"item_id", message_item_id_},
               {"output_index", output_index_}, {"content_index", 0},
               {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}});
        }
        streamed_text_ += delta.content;
        sse("response.output_text.delta",
            {{"type", "response.output_text.delta"}, {"sequence_number", sequence_++}, {"item_id", message_item_id_},
             {"output_index", output_index_}, {"content_index", 0}, {"delta", delta.content}, {"logprobs", ojson::array()}});
      }
      for (size_t k = 0; k < delta.tool_calls.size(); ++k) {
        const size_t idx = first_new_call + k;
        const int32_t out_index = output_index_ + (message_item_id_.empty() ? 0 : 1) + static_cast<int32_t>(idx);
        ojson item = {{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", c.tool_call_ids[idx]},
                      {"name", delta.tool_calls[k].name}, {"arguments", delta.tool_calls[k].arguments},
                      {"status", "completed"}};
        sse("response.output_item.added", {{"type", "response.output_item.added"}, {"sequence_number", sequence_++},
                                           {"output_index", out_index}, {"item", item}});
        sse("response.function_call_arguments.done",
            {{"type", "response.function_call_arguments.done"}, {"sequence_number", sequence_++},
             {"item_id", item["id"]}, {"output_index", out_index}, {"arguments", item["arguments"]}});
        sse("response.output_item.done", {{"type", "response.output_item.done"}, {"sequence_number", sequence_++},
                                          {"output_index", out_index}, {"item", item}});
      }
      break;
    }
    case Api::Messages: {
      auto open_block = [&](const std::string& type, const ojson& block) {
        if (block_type_ == type && type != "tool_use") return;
        if (block_index_ >= 0 && !block_type_.empty()) {
          sse("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
        }
        ++block_index_;
        block_type_ = type;
        sse("content_block_start", {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", block}});
      };
      if (!delta.reasoning.empty()) {
        open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
        sse("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                    {"delta", {{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}});
      }
      if (!delta.content.empty()) {
        open_block("text", {{"type", "text"}, {"text", ""}});
        sse("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                    {"delta", {{"type", "text_delta"}, {"text", delta.content}}}});
      }
      for (size_t k = 0; k < delta.tool_calls.size(); ++k) {
        const size_t idx = first_new_call + k;
        open_block("tool_use", {{"type", "tool_use"}, {"id", c.tool_call_ids[idx]}, {"name", delta.tool_calls[k].name},
                                {"input", ojson::object()}});
        sse("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_},
                                    {"delta", {{"type", "input_json_delta"}, {"partial_json", delta.tool_calls[k].arguments}}}});
      }
      break;
    }
  }
}

namespace {

std::string anthropic_stop(FinishReason r, bool stop_string, bool tool_calls) {
  if (tool_calls) return "tool_use";
  if (r == FinishReason::Length) return "max_tokens";
  if (stop_string) return "stop_sequence";
  return "end_turn";
}

}  // namespace

void GenerationJob::emit_stream_finish(size_t index) {
  const Choice& c = choices_[index];
  switch (request_.api) {
    case Api::Chat: {
      ojson choice = {{"index", index}, {"delta", ojson::object()}, {"logprobs", nullptr},
                      {"finish_reason", openai_finish(c.finish, !c.tool_calls.empty())},
                      {"stop_reason", c.stop_reason.empty() ? ojson() : ojson(c.stop_reason)}};
      sse("", {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", ctx_.model_name},
               {"choices", ojson::array({choice})}});
      break;
    }
    case Api::Completion: {
      ojson choice = {{"index", index}, {"text", ""}, {"logprobs", nullptr},
                      {"finish_reason", openai_finish(c.finish, false)},
                      {"stop_reason", c.stop_reason.empty() ? ojson() : ojson(c.stop_reason)}};
      sse("", {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", ctx_.model_name},
               {"choices", ojson::array({choice})}});
      break;
    }
    case Api::Responses: {
      if (!message_item_id_.empty()) {
        const ojson part = {{"type", "output_text"}, {"text", streamed_text_}, {"annotations", ojson::array()}};
        sse("response.output_text.done", {{"type", "response.output_text.done"}, {"sequence_number", sequence_++},
                                          {"item_id", message_item_id_}, {"output_index", output_index_},
                                          {"content_index", 0}, {"text", streamed_text_}, {"logprobs", ojson::array()}});
        sse("response.content_part.done", {{"type", "response.content_part.done"}, {"sequence_number", sequence_++},
                                           {"item_id", message_item_id_}, {"output_index", output_index_},
                                           {"content_index", 0}, {"part", part}});
        sse("response.output_item.done",
            {{"type", "response.output_item.done"}, {"sequence_number", sequence_++}, {"output_index", output_index_},
             {"item", {{"type", "message"}, {"id", message_item_id_}, {"status", "completed"}, {"role", "assistant"},
                       {"content", ojson::array({part})}}}});
      }
      break;
    }
    case Api::Messages:
      if (block_index_ >= 0) sse("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
      block_type_.clear();
      break;
  }
}

ojson GenerationJob::final_body() const {
  switch (request_.api) {
    case Api::Chat: {
      ojson choices = ojson::array();
      for (size_t i = 0; i < choices_.size(); ++i) {
        const Choice& c = choices_[i];
        ojson msg = {{"role", "assistant"}, {"content", c.content.empty() && !c.tool_calls.empty() ? ojson() : ojson(c.content)}};
        if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
        ojson calls = ojson::array();
        for (size_t k = 0; k < c.tool_calls.size(); ++k) {
          calls.push_back({{"id", c.tool_call_ids[k]}, {"type", "function"},
                           {"function", {{"name", c.tool_calls[k].name}, {"arguments", c.tool_calls[k].arguments}}}});
        }
        msg["tool_calls"] = calls;
        choices.push_back({{"index", i}, {"message", msg},
                           {"logprobs", request_.chat_logprobs ? chat_logprobs(c.logprobs) : ojson()},
                           {"finish_reason", openai_finish(c.finish, !c.tool_calls.empty())},
                           {"stop_reason", c.stop_reason.empty() ? ojson() : ojson(c.stop_reason)}});
      }
      return {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", ctx_.model_name},
              {"choices", choices}, {"usage", usage_json()}};
    }
    case Api::Completion: {
      ojson choices = ojson::array();
      for (size_t i = 0; i < choices_.size(); ++i) {
        const Choice& c = choices_[i];
        std::string text = c.text;
        size_t offset = 0;
        if (request_.echo && c.prompt < prompt_texts_.size()) {
          text = prompt_texts_[c.prompt] + text;
          offset = prompt_texts_[c.prompt].size();
        }
        choices.push_back({{"index", i}, {"text", text},
                           {"logprobs", request_.params.logprobs ? completion_logprobs(c.logprobs, offset) : ojson()},
                           {"finish_reason", openai_finish(c.finish, false)},
                           {"stop_reason", c.stop_reason.empty() ? ojson() : ojson(c.stop_reason)}});
      }
      return {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", ctx_.model_name},
              {"choices", choices}, {"usage", usage_json()}};
    }
    case Api::Responses: {
      const Choice& c = choices_[0];
      ojson output = ojson::array();
      if (!c.reasoning.empty()) {
        output.push_back({{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", ojson::array()},
                          {"content", ojson::array({{{"type", "reasoning_text"}, {"text", c.reasoning}}})}});
      }
      if (!c.content.empty() || c.tool_calls.empty()) {
        output.push_back({{"type", "message"}, {"id", message_item_id_.empty() ? random_id("msg_") : message_item_id_},
                          {"status", "completed"}, {"role", "assistant"},
                          {"content", ojson::array({{{"type", "output_text"}, {"text", c.content},
                                                     {"annotations", ojson::array()}}})}});
      }
      for (size_t k = 0; k < c.tool_calls.size(); ++k) {
        output.push_back({{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", c.tool_call_ids[k]},
                          {"name", c.tool_calls[k].name}, {"arguments", c.tool_calls[k].arguments},
                          {"status", "completed"}});
      }
      const bool incomplete = c.finish == FinishReason::Length;
      return {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"model", ctx_.model_name},
              {"status", incomplete ? "incomplete" : "completed"},
              {"incomplete_details", incomplete ? ojson({{"reason", "max_output_tokens"}}) : ojson()},
              {"error", nullptr}, {"instructions", nullptr}, {"metadata", ojson::object()},
              {"output", output}, {"parallel_tool_calls", true}, {"temperature", request_.params.temperature},
              {"top_p", request_.params.top_p}, {"tool_choice", "auto"}, {"tools", ojson::array()},
              {"usage", usage_json()}};
    }
    case Api::Messages: {
      const Choice& c = choices_[0];
      ojson content = ojson::array();
      if (!c.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
      if (!c.content.empty()) content.push_back({{"type", "text"}, {"text", c.content}});
      for (size_t k = 0; k < c.tool_calls.size(); ++k) {
        ojson input = ojson::parse(c.tool_calls[k].arguments, nullptr, false);
        if (input.is_discarded() || !input.is_object()) input = ojson::object();
        content.push_back({{"type", "tool_use"}, {"id", c.tool_call_ids[k]}, {"name", c.tool_calls[k].name}, {"input", input}});
      }
      return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", ctx_.model_name},
              {"content", content}, {"stop_reason", anthropic_stop(c.finish, c.stop_string, !c.tool_calls.empty())},
              {"stop_sequence", c.stop_string ? ojson(c.stop_reason) : ojson()}, {"usage", usage_json()}};
    }
  }
  return {};
}

void GenerationJob::on_all_finished() {
  if (failed_) {
    if (request_.stream) {
      // Headers are out; the error goes in the stream (as vLLM does) and it ends.
      sse(request_.api == Api::Messages ? "error" : "",
          request_.api == Api::Messages
              ? ojson{{"type", "error"}, {"error", {{"type", "api_error"}, {"message", "the request failed in the engine"}}}}
              : ojson{{"error", {{"message", "the request failed in the engine"}, {"type", "api_error"}, {"code", 500}}}});
      channel_->end();
    } else {
      send_error(500, "the request failed in the engine", "api_error");
    }
    return;
  }
  if (!request_.stream) {
    channel_->send(200, "application/json", dump_json(final_body()));
    return;
  }
  switch (request_.api) {
    case Api::Chat:
    case Api::Completion:
      if (request_.include_usage) {
        sse("", {{"id", id_}, {"object", request_.api == Api::Chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", created_}, {"model", ctx_.model_name}, {"choices", ojson::array()}, {"usage", usage_json()}});
      }
      channel_->write("data: [DONE]\n\n");
      break;
    case Api::Responses: {
      ojson resp = final_body();
      sse("response.completed", {{"type", "response.completed"}, {"sequence_number", sequence_++}, {"response", resp}});
      break;
    }
    case Api::Messages: {
      const Choice& c = choices_[0];
      sse("message_delta", {{"type", "message_delta"},
                            {"delta", {{"stop_reason", anthropic_stop(c.finish, c.stop_string, !c.tool_calls.empty())},
                                       {"stop_sequence", c.stop_string ? ojson(c.stop_reason) : ojson()}}},
                            {"usage", {{"output_tokens", c.token_ids.size()}}}});
      sse("message_stop", {{"type", "message_stop"}});
      break;
    }
  }
  channel_->end();
}

}  // namespace deepinfer::server
