// Anthropic messages: a message object, or its event stream (message_start,
// content blocks for thinking, text and tool_use with their deltas,
// message_delta with the stop reason, message_stop).
#pragma once

#include <string>

#include "server/response_encoder.h"

namespace deepinfer::server {

class AnthropicEncoder : public ResponseEncoder {
 public:
  explicit AnthropicEncoder(EncoderContext context);

  std::string new_tool_call_id() const override;
  nlohmann::ordered_json body(std::span<const SampleOutput> samples) const override;
  void stream_start(EventStream& out, std::span<const SampleOutput> samples) override;
  void stream_delta(EventStream& out, size_t index, const SampleOutput& sample, const ParsedDelta& delta,
                    const std::vector<TokenOutput>& tokens) override;
  void stream_finish(EventStream& out, size_t index, const SampleOutput& sample) override;
  void stream_end(EventStream& out, std::span<const SampleOutput> samples) override;
  void stream_error(EventStream& out, const std::string& message) const override;

 private:
  // Closes the open content block and opens one of `type`, unless a block of
  // that type is open already (text and thinking continue; each tool call is
  // a block of its own).
  void open_block(EventStream& out, const std::string& type, const nlohmann::ordered_json& block);
  nlohmann::ordered_json usage(std::span<const SampleOutput> samples) const;

  int32_t block_index_ = -1;  // of the open (or last) content block
  std::string block_type_;    // of the open content block, "" when none is open
};

}  // namespace deepinfer::server
