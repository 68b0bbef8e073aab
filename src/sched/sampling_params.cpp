#include "deepinfer/sampling_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace deepinfer {

namespace {

// Ordered: a JSON schema keeps its properties in the order the client wrote them.
using json = nlohmann::ordered_json;

[[noreturn]] void param_fail(const std::string& param, const std::string& message) {
  throw ParamError(param, message);
}

void check_finite(const char* name, float v) {
  if (!std::isfinite(v)) param_fail(name, fmt::format("must be a finite number, got {}", v));
}

void check_range(const char* name, float v, float lo, float hi) {
  check_finite(name, v);
  if (v < lo || v > hi) param_fail(name, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
}

void check_token_id(const char* name, int32_t id, int32_t vocab_size) {
  if (id < 0 || id >= vocab_size) {
    param_fail(name, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab_size));
  }
}

float read_float(const json& v, const char* name) {
  if (!v.is_number()) param_fail(name, fmt::format("must be a number, got {}", v.type_name()));
  return v.get<float>();
}

int64_t read_int64(const json& v, const char* name) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      param_fail(name, "integer out of range");
    }
    return v.get<int64_t>();
  }
  // Clients written in JavaScript send 4.0 for 4; accept integral floats.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  param_fail(name, fmt::format("must be an integer, got {}", v.is_number() ? v.dump() : v.type_name()));
}

int32_t read_int(const json& v, const char* name) {
  const int64_t x = read_int64(v, name);
  if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
    param_fail(name, fmt::format("integer {} out of range", x));
  }
  return static_cast<int32_t>(x);
}

bool read_bool(const json& v, const char* name) {
  if (!v.is_boolean()) param_fail(name, fmt::format("must be a boolean, got {}", v.type_name()));
  return v.get<bool>();
}

uint64_t read_seed(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  // Negative seeds are valid integers; keep their two's-complement bits.
  return static_cast<uint64_t>(read_int64(v, "seed"));
}

std::string read_string(const json& v, const char* name) {
  if (!v.is_string()) param_fail(name, fmt::format("must be a string, got {}", v.type_name()));
  return v.get<std::string>();
}

std::vector<std::string> read_stop(const json& v) {
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) param_fail("stop", fmt::format("must be a string or a list of strings, got {}", v.type_name()));
  if (v.size() > static_cast<size_t>(SamplingParams::kMaxStopStrings)) {
    param_fail("stop", fmt::format("at most {} stop strings, got {}", SamplingParams::kMaxStopStrings, v.size()));
  }
  std::vector<std::string> out;
  for (const json& s : v) out.push_back(read_string(s, "stop"));
  return out;
}

std::vector<int32_t> read_int_list(const json& v, const char* name, int32_t max_size) {
  if (!v.is_array()) param_fail(name, fmt::format("must be a list of integers, got {}", v.type_name()));
  if (v.size() > static_cast<size_t>(max_size)) {
    param_fail(name, fmt::format("at most {} entries, got {}", max_size, v.size()));
  }
  std::vector<int32_t> out;
  for (const json& x : v) out.push_back(read_int(x, name));
  return out;
}

std::map<int32_t, float> read_logit_bias(const json& v) {
  if (!v.is_object()) param_fail("logit_bias", fmt::format("must be an object, got {}", v.type_name()));
  if (v.size() > static_cast<size_t>(SamplingParams::kMaxLogitBiasEntries)) {
    param_fail("logit_bias",
               fmt::format("at most {} entries, got {}", SamplingParams::kMaxLogitBiasEntries, v.size()));
  }
  std::map<int32_t, float> out;
  for (const auto& [key, value] : v.items()) {
    int32_t id = 0;
    const char* end = key.data() + key.size();
    auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || ec != std::errc() || ptr != end) {
      param_fail("logit_bias", fmt::format("key '{}' is not a token id", key));
    }
    const float bias = read_float(value, "logit_bias");
    check_finite("logit_bias", bias);
    out[id] = std::clamp(bias, -SamplingParams::kMaxLogitBias, SamplingParams::kMaxLogitBias);
  }
  return out;
}

}  // namespace

void SamplingParams::validate(int32_t vocab_size) const {
  if (vocab_size <= 0) param_fail("vocab_size", fmt::format("must be positive, got {}", vocab_size));
  if (n < 1 || n > kMaxN) param_fail("n", fmt::format("must be in [1, {}], got {}", kMaxN, n));
  check_finite("temperature", temperature);
  if (temperature < 0.0f) param_fail("temperature", fmt::format("must be >= 0, got {}", temperature));
  check_finite("top_p", top_p);
  if (!(top_p > 0.0f && top_p <= 1.0f)) param_fail("top_p", fmt::format("must be in (0, 1], got {}", top_p));
  if (top_k < -1) param_fail("top_k", fmt::format("must be -1 or 0 (disabled) or at least 1, got {}", top_k));
  check_range("min_p", min_p, 0.0f, 1.0f);
  if (cache_ttl && (*cache_ttl < 1 || *cache_ttl > kMaxCacheTtl)) {
    param_fail("cache_ttl", fmt::format("must be in [1, {}] seconds, got {}", kMaxCacheTtl, *cache_ttl));
  }
  check_range("presence_penalty", presence_penalty, -kMaxPenalty, kMaxPenalty);
  check_range("frequency_penalty", frequency_penalty, -kMaxPenalty, kMaxPenalty);
  check_finite("repetition_penalty", repetition_penalty);
  if (repetition_penalty <= 0.0f) {
    param_fail("repetition_penalty", fmt::format("must be > 0, got {}", repetition_penalty));
  }
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    param_fail("logit_bias", fmt::format("at most {} entries, got {}", kMaxLogitBiasEntries, logit_bias.size()));
  }
  for (const auto& [id, bias] : logit_bias) {
    check_token_id("logit_bias", id, vocab_size);
    check_range("logit_bias", bias, -kMaxLogitBias, kMaxLogitBias);
  }
  if (stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    param_fail("stop", fmt::format("at most {} stop strings, got {}", kMaxStopStrings, stop.size()));
  }
  for (const std::string& s : stop) {
    if (s.empty()) param_fail("stop", "stop strings must not be empty");
    if (s.size() > static_cast<size_t>(kMaxStopStringBytes)) {
      param_fail("stop", fmt::format("a stop string is {} bytes, at most {} allowed", s.size(), kMaxStopStringBytes));
    }
  }
  if (stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    param_fail("stop_token_ids", fmt::format("at most {} entries, got {}", kMaxStopTokenIds, stop_token_ids.size()));
  }
  for (int32_t id : stop_token_ids) check_token_id("stop_token_ids", id, vocab_size);
  if (max_tokens && *max_tokens < 1) param_fail("max_tokens", fmt::format("must be at least 1, got {}", *max_tokens));
  if (min_tokens < 0) param_fail("min_tokens", fmt::format("must be >= 0, got {}", min_tokens));
  if (max_tokens && min_tokens > *max_tokens) {
    param_fail("min_tokens", fmt::format("must be <= max_tokens ({}), got {}", *max_tokens, min_tokens));
  }
  if (logprobs && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    param_fail("logprobs", fmt::format("must be in [0, {}], got {}", kMaxLogprobs, *logprobs));
  }
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs)) {
    param_fail("prompt_logprobs", fmt::format("must be in [0, {}], got {}", kMaxLogprobs, *prompt_logprobs));
  }
}

SamplingParams SamplingParams::from_json(const json& object, std::vector<std::string>* unknown_fields) {
  if (!object.is_object()) param_fail("request", fmt::format("sampling parameters must be a JSON object, got {}",
                                                             object.type_name()));
  SamplingParams p;
  bool chat_logprobs = false;
  // Where the structured-output constraint came from: one source per request.
  std::string structured_from;
  auto set_structured = [&](const std::string& field, StructuredOutputs so) {
    if (!structured_from.empty()) {
      param_fail(field, fmt::format("'{}' and '{}' both constrain the output; give one", structured_from, field));
    }
    structured_from = field;
    p.structured_outputs = std::move(so);
  };
  std::optional<int32_t> top_logprobs;
  for (const auto& [key, v] : object.items()) {
    if (v.is_null()) continue;
    const char* k = key.c_str();
    if (key == "n") {
      p.n = read_int(v, k);
    } else if (key == "temperature") {
      p.temperature = read_float(v, k);
    } else if (key == "top_p") {
      p.top_p = read_float(v, k);
    } else if (key == "top_k") {
      p.top_k = read_int(v, k);
    } else if (key == "min_p") {
      p.min_p = read_float(v, k);
    } else if (key == "presence_penalty") {
      p.presence_penalty = read_float(v, k);
    } else if (key == "frequency_penalty") {
      p.frequency_penalty = read_float(v, k);
    } else if (key == "repetition_penalty") {
      p.repetition_penalty = read_float(v, k);
    } else if (key == "logit_bias") {
      p.logit_bias = read_logit_bias(v);
    } else if (key == "seed") {
      p.seed = read_seed(v);
    } else if (key == "stop") {
      p.stop = read_stop(v);
    } else if (key == "stop_token_ids") {
      p.stop_token_ids = read_int_list(v, k, kMaxStopTokenIds);
    } else if (key == "cache_ttl") {
      p.cache_ttl = read_int64(v, k);
    } else if (key == "ignore_eos") {
      p.ignore_eos = read_bool(v, k);
    } else if (key == "min_tokens") {
      p.min_tokens = read_int(v, k);
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      p.max_tokens = read_int(v, k);
    } else if (key == "logprobs") {
      if (v.is_boolean()) {
        chat_logprobs = v.get<bool>();
      } else {
        p.logprobs = read_int(v, k);
      }
    } else if (key == "top_logprobs") {
      top_logprobs = read_int(v, k);
    } else if (key == "prompt_logprobs") {
      p.prompt_logprobs = read_int(v, k);
    } else if (key == "skip_special_tokens") {
      p.skip_special_tokens = read_bool(v, k);
    } else if (key == "include_stop_str_in_output") {
      p.include_stop_str_in_output = read_bool(v, k);
    } else if (key == "structured_outputs" || key == "guided_decoding") {
      set_structured(key, StructuredOutputs::from_vllm(v, key));
    } else if (key == "response_format") {
      StructuredOutputs so;
      if (StructuredOutputs::from_response_format(v, so)) set_structured(key, std::move(so));
    } else if (key == "guided_json" || key == "guided_regex" || key == "guided_choice" || key == "guided_grammar") {
      // vLLM's older spellings of structured_outputs' fields.
      set_structured(key, StructuredOutputs::from_vllm(json{{key.substr(7), v}}, key));
    } else if (key == "guided_decoding_backend" || key == "guided_whitespace_pattern") {
      param_fail(key, "not supported: the engine has one grammar backend (XGrammar) and its own whitespace rules");
    } else if (unknown_fields != nullptr) {
      unknown_fields->push_back(key);
    }
  }
  if (chat_logprobs) {
    p.logprobs = top_logprobs.value_or(0);
  } else if (top_logprobs && !p.logprobs) {
    param_fail("top_logprobs", "requires logprobs to be true");
  }
  return p;
}

}  // namespace deepinfer
