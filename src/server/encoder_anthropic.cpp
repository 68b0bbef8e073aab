#include "server/encoder_anthropic.h"

#include "server/encoder_common.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

namespace {

// An event {type, ...fields} named by its type.
void emit(EventStream& out, const char* type, const ojson& fields = ojson::object()) {
  ojson event = {{"type", type}};
  for (const auto& [key, value] : fields.items()) event[key] = value;
  out.named(type, event);
}

std::string stop_reason(const SampleOutput& s) {
  if (!s.tool_calls.empty()) return "tool_use";
  if (s.finish == FinishReason::Length) return "max_tokens";
  if (s.stop_string) return "stop_sequence";
  return "end_turn";
}

ojson stop_sequence(const SampleOutput& s) { return s.stop_string ? ojson(s.stop_reason) : ojson(); }

}  // namespace

AnthropicEncoder::AnthropicEncoder(EncoderContext context) : ResponseEncoder(std::move(context), "msg_") {}

std::string AnthropicEncoder::new_tool_call_id() const { return random_id("toolu_"); }

ojson AnthropicEncoder::usage(std::span<const SampleOutput> samples) const {
  const TokenCounts counts = count_tokens(samples, ctx_);
  return {{"input_tokens", counts.prompt}, {"output_tokens", counts.completion},
          {"cache_read_input_tokens", counts.cached}, {"cache_creation_input_tokens", 0}};
}

ojson AnthropicEncoder::body(std::span<const SampleOutput> samples) const {
  const SampleOutput& s = samples[0];
  ojson content = ojson::array();
  if (!s.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", s.reasoning}, {"signature", ""}});
  if (!s.content.empty()) content.push_back({{"type", "text"}, {"text", s.content}});
  for (size_t k = 0; k < s.tool_calls.size(); ++k) {
    // The model's arguments are text; a tool_use block's input is an object.
    std::optional<ojson> parsed = parse_embedded_json(s.tool_calls[k].arguments);
    ojson input = parsed && parsed->is_object() ? std::move(*parsed) : ojson::object();
    content.push_back({{"type", "tool_use"}, {"id", s.tool_call_ids[k]}, {"name", s.tool_calls[k].name}, {"input", input}});
  }
  return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", ctx_.model_name},
          {"content", content}, {"stop_reason", stop_reason(s)}, {"stop_sequence", stop_sequence(s)},
          {"usage", usage(samples)}};
}

void AnthropicEncoder::stream_start(EventStream& out, std::span<const SampleOutput> samples) {
  ojson start_usage = usage(samples);
  start_usage["output_tokens"] = 0;
  emit(out, "message_start",
       {{"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", ctx_.model_name},
                     {"content", ojson::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                     {"usage", start_usage}}}});
  emit(out, "ping");
}

void AnthropicEncoder::open_block(EventStream& out, const std::string& type, const ojson& block) {
  if (block_type_ == type && type != "tool_use") return;
  if (block_index_ >= 0 && !block_type_.empty()) emit(out, "content_block_stop", {{"index", block_index_}});
  ++block_index_;
  block_type_ = type;
  emit(out, "content_block_start", {{"index", block_index_}, {"content_block", block}});
}

void AnthropicEncoder::stream_delta(EventStream& out, size_t, const SampleOutput& sample, const ParsedDelta& delta,
                                    const std::vector<TokenOutput>&) {
  if (!delta.reasoning.empty()) {
    open_block(out, "thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    emit(out, "content_block_delta",
         {{"index", block_index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}});
  }
  if (!delta.content.empty()) {
    open_block(out, "text", {{"type", "text"}, {"text", ""}});
    emit(out, "content_block_delta", {{"index", block_index_}, {"delta", {{"type", "text_delta"}, {"text", delta.content}}}});
  }
  const size_t first_new_call = sample.tool_calls.size() - delta.tool_calls.size();
  for (size_t k = 0; k < delta.tool_calls.size(); ++k) {
    const size_t idx = first_new_call + k;
    open_block(out, "tool_use", {{"type", "tool_use"}, {"id", sample.tool_call_ids[idx]},
                                 {"name", delta.tool_calls[k].name}, {"input", ojson::object()}});
    emit(out, "content_block_delta",
         {{"index", block_index_},
          {"delta", {{"type", "input_json_delta"}, {"partial_json", delta.tool_calls[k].arguments}}}});
  }
}

void AnthropicEncoder::stream_finish(EventStream& out, size_t, const SampleOutput&) {
  if (block_index_ >= 0) emit(out, "content_block_stop", {{"index", block_index_}});
  block_type_.clear();
}

void AnthropicEncoder::stream_end(EventStream& out, std::span<const SampleOutput> samples) {
  const SampleOutput& s = samples[0];
  emit(out, "message_delta", {{"delta", {{"stop_reason", stop_reason(s)}, {"stop_sequence", stop_sequence(s)}}},
                              {"usage", {{"output_tokens", s.token_ids.size()}}}});
  emit(out, "message_stop");
}

void AnthropicEncoder::stream_error(EventStream& out, const std::string& message) const {
  out.named("error", error_body(Api::Messages, 500, message, "api_error"));
}

}  // namespace deepinfer::server
