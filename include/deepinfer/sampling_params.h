// Per-request sampling parameters with vLLM's names, defaults and ranges.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "deepinfer/structured_outputs.h"

namespace deepinfer {

// A request parameter is out of range or has the wrong type. param() names the
// field (the server reports it as the OpenAI error's `param`).
class ParamError : public Error {
 public:
  ParamError(std::string param, const std::string& message)
      : Error("invalid sampling parameter '" + param + "': " + message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

struct SamplingParams {
  static constexpr int32_t kMaxN = 128;
  static constexpr int32_t kMaxLogprobs = 20;
  static constexpr int32_t kMaxStopStrings = 64;
  static constexpr int32_t kMaxStopStringBytes = 1024;
  static constexpr int32_t kMaxStopTokenIds = 1024;
  static constexpr int32_t kMaxLogitBiasEntries = 1024;
  static constexpr float kMaxLogitBias = 100.0f;  // bias values are clamped to +-this
  static constexpr float kMaxPenalty = 2.0f;      // presence / frequency
  // Below this temperature sampling is greedy (vLLM's epsilon).
  static constexpr float kGreedyTemperature = 1e-5f;

  int32_t n = 1;
  float temperature = 1.0f;          // >= 0; ~0 = greedy
  float top_p = 1.0f;                // (0, 1]
  int32_t top_k = 0;                 // 0 or -1 = off, else >= 1
  float min_p = 0.0f;                // [0, 1]
  float presence_penalty = 0.0f;     // [-2, 2]
  float frequency_penalty = 0.0f;    // [-2, 2]
  float repetition_penalty = 1.0f;   // > 0, finite; 1 = off
  std::map<int32_t, float> logit_bias;  // token id -> additive bias
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t min_tokens = 0;             // EOS and stop_token_ids are masked until this many tokens
  std::optional<int32_t> max_tokens;  // >= 1; unset = up to the model's context length
  std::optional<int32_t> logprobs;         // top alternatives per generated token, 0..kMaxLogprobs
  std::optional<int32_t> prompt_logprobs;  // same for prompt tokens
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  // Constrains the output to a JSON schema, regex, grammar or choice list.
  std::optional<StructuredOutputs> structured_outputs;
  // Not sampling, but per request like the rest: how long the KV tiers below
  // the device keep the blocks this request computes (seconds, up to
  // kMaxCacheTtl); unset = the engine's default for its traffic class.
  std::optional<int64_t> cache_ttl;

  static constexpr int64_t kMaxCacheTtl = int64_t{366} * 86400;
  // The default for agent traffic (requests with tools): 3 days, as the
  // reference operator keeps it; chat traffic takes the engine's default.
  static constexpr int64_t kAgentCacheTtl = int64_t{3} * 86400;

  bool greedy() const { return temperature < kGreedyTemperature; }
  bool top_k_enabled() const { return top_k > 0; }

  // Throws ParamError naming the first parameter out of range. Token ids
  // (logit_bias, stop_token_ids) must lie in [0, vocab_size).
  void validate(int32_t vocab_size) const;

  // Reads the known fields from a JSON object, checking types only (call
  // validate() for ranges). null means "use the default". Accepts `stop` as a
  // string or a list, `logit_bias` keys as decimal strings, `logprobs` as an
  // integer or, chat-style, as a boolean with `top_logprobs`, and
  // `max_completion_tokens` for max_tokens. Names of unrecognised fields are
  // appended to *unknown_fields when given, so callers can log them.
  static SamplingParams from_json(const nlohmann::ordered_json& object, std::vector<std::string>* unknown_fields = nullptr);
};

}  // namespace deepinfer
