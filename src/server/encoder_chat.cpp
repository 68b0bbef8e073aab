#include "server/encoder_chat.h"

#include "server/encoder_common.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

namespace {
constexpr const char* kChunk = "chat.completion.chunk";
}

ChatEncoder::ChatEncoder(EncoderContext context) : ResponseEncoder(std::move(context), "chatcmpl-") {}

ojson ChatEncoder::logprobs(const std::vector<TokenOutput>& tokens) const {
  ojson content = ojson::array();
  for (const TokenOutput& t : tokens) {
    const std::string text = token_text(ctx_.tokenizer, t.token);
    ojson top = ojson::array();
    for (const TokenLogprob& a : t.top) {
      const std::string at = token_text(ctx_.tokenizer, a.token);
      top.push_back({{"token", at}, {"logprob", a.logprob}, {"bytes", std::vector<uint8_t>(at.begin(), at.end())}});
    }
    content.push_back({{"token", text},
                       {"logprob", t.logprob},
                       {"bytes", std::vector<uint8_t>(text.begin(), text.end())},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

ojson ChatEncoder::body(std::span<const SampleOutput> samples) const {
  ojson choices = ojson::array();
  for (size_t i = 0; i < samples.size(); ++i) {
    const SampleOutput& s = samples[i];
    ojson msg = {{"role", "assistant"}, {"content", s.content.empty() && !s.tool_calls.empty() ? ojson() : ojson(s.content)}};
    if (!s.reasoning.empty()) msg["reasoning_content"] = s.reasoning;
    ojson calls = ojson::array();
    for (size_t k = 0; k < s.tool_calls.size(); ++k) {
      calls.push_back({{"id", s.tool_call_ids[k]}, {"type", "function"},
                       {"function", {{"name", s.tool_calls[k].name}, {"arguments", s.tool_calls[k].arguments}}}});
    }
    msg["tool_calls"] = calls;
    choices.push_back({{"index", i}, {"message", msg},
                       {"logprobs", ctx_.request.chat_logprobs ? logprobs(s.logprobs) : ojson()},
                       {"finish_reason", openai_finish_reason(s.finish, !s.tool_calls.empty())},
                       {"stop_reason", openai_stop_reason(s)}});
  }
  ojson body = openai_frame("chat.completion", choices);
  body["usage"] = openai_usage(count_tokens(samples, ctx_));
  return body;
}

void ChatEncoder::stream_start(EventStream& out, std::span<const SampleOutput> samples) {
  ojson choices = ojson::array();
  for (size_t i = 0; i < samples.size(); ++i) {
    choices.push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                       {"finish_reason", nullptr}});
  }
  out.data(openai_frame(kChunk, choices));
}

void ChatEncoder::stream_delta(EventStream& out, size_t index, const SampleOutput& sample, const ParsedDelta& delta,
                               const std::vector<TokenOutput>& tokens) {
  const bool want_logprobs = ctx_.request.chat_logprobs && !tokens.empty();
  if (delta.empty() && !want_logprobs) return;
  ojson d = ojson::object();
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty() || (want_logprobs && delta.tool_calls.empty())) d["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    const size_t first_new_call = sample.tool_calls.size() - delta.tool_calls.size();
    ojson calls = ojson::array();
    for (size_t k = 0; k < delta.tool_calls.size(); ++k) {
      const size_t idx = first_new_call + k;
      calls.push_back({{"index", idx}, {"id", sample.tool_call_ids[idx]}, {"type", "function"},
                       {"function", {{"name", delta.tool_calls[k].name}, {"arguments", delta.tool_calls[k].arguments}}}});
    }
    d["tool_calls"] = calls;
  }
  ojson choice = {{"index", index}, {"delta", d}, {"logprobs", want_logprobs ? logprobs(tokens) : ojson()},
                  {"finish_reason", nullptr}};
  out.data(openai_frame(kChunk, ojson::array({choice})));
}

void ChatEncoder::stream_finish(EventStream& out, size_t index, const SampleOutput& sample) {
  ojson choice = {{"index", index}, {"delta", ojson::object()}, {"logprobs", nullptr},
                  {"finish_reason", openai_finish_reason(sample.finish, !sample.tool_calls.empty())},
                  {"stop_reason", openai_stop_reason(sample)}};
  out.data(openai_frame(kChunk, ojson::array({choice})));
}

void ChatEncoder::stream_end(EventStream& out, std::span<const SampleOutput> samples) {
  end_openai_stream(out, kChunk, samples);
}

}  // namespace deepinfer::server
