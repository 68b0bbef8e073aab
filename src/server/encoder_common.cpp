#include "server/encoder_common.h"

#include <fmt/format.h>

#include <random>

#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const int32_t ids[1] = {id};
  return tokenizer.decode(ids, false);
}

TokenCounts count_tokens(std::span<const SampleOutput> samples, const EncoderContext& context) {
  TokenCounts counts;
  counts.prompt = context.prompt_tokens;
  for (const SampleOutput& s : samples) counts.completion += static_cast<int64_t>(s.token_ids.size());
  // Samples of one prompt share its prefix; report the first sample's hits per prompt.
  const size_t n = static_cast<size_t>(context.request.params.n);
  for (size_t i = 0; i < samples.size(); i += n) counts.cached += samples[i].num_cached;
  return counts;
}

std::string openai_finish_reason(FinishReason reason, bool tool_calls) {
  switch (reason) {
    case FinishReason::Stop: return tool_calls ? "tool_calls" : "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    default: return "stop";
  }
}

ojson openai_stop_reason(const SampleOutput& sample) {
  return sample.stop_reason.empty() ? ojson() : ojson(sample.stop_reason);
}

ojson openai_usage(const TokenCounts& counts) {
  return {{"prompt_tokens", counts.prompt}, {"completion_tokens", counts.completion},
          {"total_tokens", counts.prompt + counts.completion}, {"prompt_tokens_details", {{"cached_tokens", counts.cached}}}};
}

}  // namespace deepinfer::server
