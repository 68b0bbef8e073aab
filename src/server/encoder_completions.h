// OpenAI completions: a text_completion object, or text_completion chunks (one
// per step and sample, a finish chunk per sample, an optional usage chunk and
// [DONE]). The text is the raw generated text, after the prompt with echo.
#pragma once

#include "server/response_encoder.h"

namespace deepinfer::server {

class CompletionsEncoder : public ResponseEncoder {
 public:
  explicit CompletionsEncoder(EncoderContext context);

  bool wants_raw_text() const override { return true; }
  nlohmann::ordered_json body(std::span<const SampleOutput> samples) const override;
  void stream_start(EventStream& out, std::span<const SampleOutput> samples) override;
  void stream_delta(EventStream& out, size_t index, const SampleOutput& sample, const ParsedDelta& delta,
                    const std::vector<TokenOutput>& tokens) override;
  void stream_finish(EventStream& out, size_t index, const SampleOutput& sample) override;
  void stream_end(EventStream& out, std::span<const SampleOutput> samples) override;

 private:
  // text_offset: where the first token's text starts in the choice's text.
  nlohmann::ordered_json logprobs(const std::vector<TokenOutput>& tokens, size_t text_offset) const;
  // The prompt text echoed before the sample's text ("" without echo).
  const std::string& echoed_prompt(const SampleOutput& sample) const;
};

}  // namespace deepinfer::server
