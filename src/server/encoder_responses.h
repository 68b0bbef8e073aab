// OpenAI Responses: a response object, or its event stream (response.created,
// the message item and its text deltas, one item per function call,
// response.completed). Events are numbered in order (sequence_number).
#pragma once

#include <string>

#include "server/response_encoder.h"

namespace deepinfer::server {

class ResponsesEncoder : public ResponseEncoder {
 public:
  explicit ResponsesEncoder(EncoderContext context);

  nlohmann::ordered_json body(std::span<const SampleOutput> samples) const override;
  void stream_start(EventStream& out, std::span<const SampleOutput> samples) override;
  void stream_delta(EventStream& out, size_t index, const SampleOutput& sample, const ParsedDelta& delta,
                    const std::vector<TokenOutput>& tokens) override;
  void stream_finish(EventStream& out, size_t index, const SampleOutput& sample) override;
  void stream_end(EventStream& out, std::span<const SampleOutput> samples) override;

 private:
  // An event {type, sequence_number, ...fields}.
  void emit(EventStream& out, const char* type, const nlohmann::ordered_json& fields);

  int64_t sequence_ = 0;
  std::string message_item_id_;  // set once the message item is open in the stream
  std::string streamed_text_;    // the message's text so far
};

}  // namespace deepinfer::server
