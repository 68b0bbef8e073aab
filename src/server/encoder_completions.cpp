#include "server/encoder_completions.h"

#include "server/encoder_common.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

namespace {
constexpr const char* kObject = "text_completion";  // the body and the chunks alike
}

CompletionsEncoder::CompletionsEncoder(EncoderContext context) : ResponseEncoder(std::move(context), "cmpl-") {}

const std::string& CompletionsEncoder::echoed_prompt(const SampleOutput& sample) const {
  static const std::string kNone;
  const bool echo = ctx_.request.echo && sample.prompt < ctx_.prompt_texts.size();
  return echo ? ctx_.prompt_texts[sample.prompt] : kNone;
}

ojson CompletionsEncoder::logprobs(const std::vector<TokenOutput>& tokens, size_t text_offset) const {
  ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const TokenOutput& t : tokens) {
    const std::string text = token_text(ctx_.tokenizer, t.token);
    toks.push_back(text);
    lps.push_back(t.logprob);
    ojson top = ojson::object();
    for (const TokenLogprob& a : t.top) top[token_text(ctx_.tokenizer, a.token)] = a.logprob;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

ojson CompletionsEncoder::body(std::span<const SampleOutput> samples) const {
  ojson choices = ojson::array();
  for (size_t i = 0; i < samples.size(); ++i) {
    const SampleOutput& s = samples[i];
    const std::string& prompt = echoed_prompt(s);
    choices.push_back({{"index", i}, {"text", prompt + s.text},
                       {"logprobs", ctx_.request.params.logprobs ? logprobs(s.logprobs, prompt.size()) : ojson()},
                       {"finish_reason", openai_finish_reason(s.finish, false)},
                       {"stop_reason", openai_stop_reason(s)}});
  }
  ojson body = openai_frame(kObject, choices);
  body["usage"] = openai_usage(count_tokens(samples, ctx_));
  return body;
}

// Completions have no role chunk: the first chunk already carries text.
void CompletionsEncoder::stream_start(EventStream&, std::span<const SampleOutput>) {}

void CompletionsEncoder::stream_delta(EventStream& out, size_t index, const SampleOutput& sample,
                                      const ParsedDelta& delta, const std::vector<TokenOutput>& tokens) {
  const bool first = sample.token_ids.size() == tokens.size();
  const std::string text = first ? echoed_prompt(sample) + delta.content : delta.content;
  const bool want_logprobs = ctx_.request.params.logprobs && !tokens.empty();
  if (text.empty() && !want_logprobs) return;
  // Streamed offsets count from the start of the generated text, without the echoed prompt.
  const size_t text_offset = sample.text.size() - delta.content.size();
  ojson choice = {{"index", index}, {"text", text},
                  {"logprobs", want_logprobs ? logprobs(tokens, text_offset) : ojson()},
                  {"finish_reason", nullptr}};
  out.data(openai_frame(kObject, ojson::array({choice})));
}

void CompletionsEncoder::stream_finish(EventStream& out, size_t index, const SampleOutput& sample) {
  ojson choice = {{"index", index}, {"text", ""}, {"logprobs", nullptr},
                  {"finish_reason", openai_finish_reason(sample.finish, false)},
                  {"stop_reason", openai_stop_reason(sample)}};
  out.data(openai_frame(kObject, ojson::array({choice})));
}

void CompletionsEncoder::stream_end(EventStream& out, std::span<const SampleOutput> samples) {
  end_openai_stream(out, kObject, samples);
}

}  // namespace deepinfer::server
