// OpenAI chat completions: a chat.completion object, or chat.completion.chunk
// events (a role chunk, then one chunk per step and sample, a finish chunk per
// sample, an optional usage chunk and [DONE]).
#pragma once

#include "server/response_encoder.h"

namespace deepinfer::server {

class ChatEncoder : public ResponseEncoder {
 public:
  explicit ChatEncoder(EncoderContext context);

  nlohmann::ordered_json body(std::span<const SampleOutput> samples) const override;
  void stream_start(EventStream& out, std::span<const SampleOutput> samples) override;
  void stream_delta(EventStream& out, size_t index, const SampleOutput& sample, const ParsedDelta& delta,
                    const std::vector<TokenOutput>& tokens) override;
  void stream_finish(EventStream& out, size_t index, const SampleOutput& sample) override;
  void stream_end(EventStream& out, std::span<const SampleOutput> samples) override;

 private:
  nlohmann::ordered_json logprobs(const std::vector<TokenOutput>& tokens) const;
};

}  // namespace deepinfer::server
