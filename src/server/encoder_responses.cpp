#include "server/encoder_responses.h"

#include "server/encoder_common.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

namespace {

// Reasoning is not streamed, so the message is the first item of a streamed
// response; function calls follow it.
constexpr int32_t kMessageOutputIndex = 0;

ojson output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}};
}

ojson message_item(const std::string& id, const char* status, ojson content) {
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

ojson function_call_item(const std::string& call_id, const ParsedToolCall& call) {
  return {{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", call_id}, {"name", call.name},
          {"arguments", call.arguments}, {"status", "completed"}};
}

}  // namespace

ResponsesEncoder::ResponsesEncoder(EncoderContext context) : ResponseEncoder(std::move(context), "resp_") {}

void ResponsesEncoder::emit(EventStream& out, const char* type, const ojson& fields) {
  ojson event = {{"type", type}, {"sequence_number", sequence_++}};
  for (const auto& [key, value] : fields.items()) event[key] = value;
  out.named(type, event);
}

ojson ResponsesEncoder::body(std::span<const SampleOutput> samples) const {
  const SampleOutput& s = samples[0];
  ojson output = ojson::array();
  if (!s.reasoning.empty()) {
    output.push_back({{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", ojson::array()},
                      {"content", ojson::array({{{"type", "reasoning_text"}, {"text", s.reasoning}}})}});
  }
  if (!s.content.empty() || s.tool_calls.empty()) {
    output.push_back(message_item(message_item_id_.empty() ? random_id("msg_") : message_item_id_, "completed",
                                  ojson::array({output_text_part(s.content)})));
  }
  for (size_t k = 0; k < s.tool_calls.size(); ++k) output.push_back(function_call_item(s.tool_call_ids[k], s.tool_calls[k]));
  const TokenCounts counts = count_tokens(samples, ctx_);
  const ojson usage = {{"input_tokens", counts.prompt}, {"input_tokens_details", {{"cached_tokens", counts.cached}}},
                       {"output_tokens", counts.completion}, {"output_tokens_details", {{"reasoning_tokens", 0}}},
                       {"total_tokens", counts.prompt + counts.completion}};
  const bool incomplete = s.finish == FinishReason::Length;
  return {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"model", ctx_.model_name},
          {"status", incomplete ? "incomplete" : "completed"},
          {"incomplete_details", incomplete ? ojson({{"reason", "max_output_tokens"}}) : ojson()},
          {"error", nullptr}, {"instructions", nullptr}, {"metadata", ojson::object()},
          {"output", output}, {"parallel_tool_calls", true}, {"temperature", ctx_.request.params.temperature},
          {"top_p", ctx_.request.params.top_p}, {"tool_choice", "auto"}, {"tools", ojson::array()},
          {"usage", usage}};
}

void ResponsesEncoder::stream_start(EventStream& out, std::span<const SampleOutput> samples) {
  ojson response = body(samples);
  response["status"] = "in_progress";
  response["output"] = ojson::array();
  response["usage"] = nullptr;
  emit(out, "response.created", {{"response", response}});
  emit(out, "response.in_progress", {{"response", response}});
}

void ResponsesEncoder::stream_delta(EventStream& out, size_t, const SampleOutput& sample, const ParsedDelta& delta,
                                    const std::vector<TokenOutput>&) {
  if (!delta.content.empty()) {
    if (message_item_id_.empty()) {
      message_item_id_ = random_id("msg_");
      emit(out, "response.output_item.added",
           {{"output_index", kMessageOutputIndex},
            {"item", message_item(message_item_id_, "in_progress", ojson::array())}});
      emit(out, "response.content_part.added",
           {{"item_id", message_item_id_}, {"output_index", kMessageOutputIndex}, {"content_index", 0},
            {"part", output_text_part("")}});
    }
    streamed_text_ += delta.content;
    emit(out, "response.output_text.delta",
         {{"item_id", message_item_id_}, {"output_index", kMessageOutputIndex}, {"content_index", 0},
          {"delta", delta.content}, {"logprobs", ojson::array()}});
  }
  const size_t first_new_call = sample.tool_calls.size() - delta.tool_calls.size();
  for (size_t k = 0; k < delta.tool_calls.size(); ++k) {
    const size_t idx = first_new_call + k;
    const int32_t output_index = kMessageOutputIndex + (message_item_id_.empty() ? 0 : 1) + static_cast<int32_t>(idx);
    // A call arrives whole from the parser: it is added, its arguments done and
    // the item done at once.
    const ojson item = function_call_item(sample.tool_call_ids[idx], delta.tool_calls[k]);
    emit(out, "response.output_item.added", {{"output_index", output_index}, {"item", item}});
    emit(out, "response.function_call_arguments.done",
         {{"item_id", item["id"]}, {"output_index", output_index}, {"arguments", item["arguments"]}});
    emit(out, "response.output_item.done", {{"output_index", output_index}, {"item", item}});
  }
}

void ResponsesEncoder::stream_finish(EventStream& out, size_t, const SampleOutput&) {
  if (message_item_id_.empty()) return;
  const ojson part = output_text_part(streamed_text_);
  emit(out, "response.output_text.done",
       {{"item_id", message_item_id_}, {"output_index", kMessageOutputIndex}, {"content_index", 0},
        {"text", streamed_text_}, {"logprobs", ojson::array()}});
  emit(out, "response.content_part.done",
       {{"item_id", message_item_id_}, {"output_index", kMessageOutputIndex}, {"content_index", 0}, {"part", part}});
  emit(out, "response.output_item.done",
       {{"output_index", kMessageOutputIndex},
        {"item", message_item(message_item_id_, "completed", ojson::array({part}))}});
}

void ResponsesEncoder::stream_end(EventStream& out, std::span<const SampleOutput> samples) {
  emit(out, "response.completed", {{"response", body(samples)}});
}

}  // namespace deepinfer::server
