// Pieces that more than one response encoder writes: ids, token texts for
// logprobs, token counts for usage, and what OpenAI chat and completions share.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>

#include "server/response_encoder.h"

namespace deepinfer::server {

// prefix + 24 random hex digits.
std::string random_id(const std::string& prefix);

// The text of one token, as logprobs show it.
std::string token_text(const Tokenizer& tokenizer, int32_t id);

struct TokenCounts {
  int64_t prompt = 0;
  int64_t completion = 0;
  int64_t cached = 0;  // prompt tokens found in the prefix cache
};
TokenCounts count_tokens(std::span<const SampleOutput> samples, const EncoderContext& context);

// OpenAI chat and completions.
std::string openai_finish_reason(FinishReason reason, bool tool_calls);
// vLLM's extension: the stop string that ended the sample, or null.
nlohmann::ordered_json openai_stop_reason(const SampleOutput& sample);
nlohmann::ordered_json openai_usage(const TokenCounts& counts);

}  // namespace deepinfer::server
