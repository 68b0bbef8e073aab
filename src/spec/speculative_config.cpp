#include "spec/speculative_config.h"

#include "core/error.h"
#include "core/json_parse.h"

namespace deepinfer::spec {

std::string_view to_string(SpecMethod m) {
  switch (m) {
    case SpecMethod::None: return "none";
    case SpecMethod::Ngram: return "ngram";
    case SpecMethod::Suffix: return "suffix";
    case SpecMethod::DraftModel: return "draft_model";
    case SpecMethod::Mtp: return "mtp";
  }
  return "?";
}

namespace {

constexpr std::string_view kWhat = "--speculative-config";

template <typename T>
T number(const nlohmann::json& j, std::string_view key, T lo, T hi) {
  const bool integral = std::is_integral_v<T>;
  DI_CHECK(integral ? j.is_number_integer() : j.is_number(), "{}: \"{}\" must be {}, got {}", kWhat, key,
           integral ? "an integer" : "a number", json_excerpt(j));
  const double v = j.get<double>();
  DI_CHECK(v >= static_cast<double>(lo) && v <= static_cast<double>(hi), "{}: \"{}\" must be in [{}, {}], got {}",
           kWhat, key, lo, hi, json_excerpt(j));
  return static_cast<T>(v);
}

SpecMethod method_of(const nlohmann::json& j) {
  DI_CHECK(j.is_string(), "{}: \"method\" must be a string, got {}", kWhat, json_excerpt(j));
  const auto m = j.get<std::string>();
  if (m == "ngram" || m == "prompt_lookup") return SpecMethod::Ngram;
  if (m == "suffix") return SpecMethod::Suffix;
  if (m == "draft_model") return SpecMethod::DraftModel;
  if (m == "mtp" || m == "deepseek_mtp") return SpecMethod::Mtp;
  if (m == "eagle" || m == "eagle3" || m == "medusa") {
    fail("{}: method \"{}\" is not supported yet; available: \"ngram\", \"suffix\", \"draft_model\", \"mtp\"", kWhat,
         m);
  }
  fail("{}: unknown method {}; available: \"ngram\", \"suffix\", \"draft_model\", \"mtp\"", kWhat, excerpt(m));
}

}  // namespace

SpeculativeConfig SpeculativeConfig::parse(std::string_view json) {
  const nlohmann::json j = parse_json(json, kWhat, JsonLimits{.max_depth = 4});
  DI_CHECK(j.is_object(), "{}: expected a JSON object, got {}", kWhat, json_excerpt(j));
  DI_CHECK(j.contains("method"), "{}: \"method\" is required (\"ngram\" or \"suffix\")", kWhat);
  SpeculativeConfig c;
  for (const auto& [key, value] : j.items()) {
    if (key == "method") {
      c.method = method_of(value);
    } else if (key == "num_speculative_tokens") {
      c.num_speculative_tokens = number<int32_t>(value, key, 1, 32);
    } else if (key == "dynamic") {
      DI_CHECK(value.is_boolean(), "{}: \"dynamic\" must be true or false, got {}", kWhat, json_excerpt(value));
      c.dynamic = value.get<bool>();
    } else if (key == "speculation_switch_window") {
      c.switch_window_steps = number<int32_t>(value, key, 0, 100000);
    } else if (key == "speculation_switch_idle_share") {
      c.switch_idle_share = number<double>(value, key, 0.0, 1.0);
    } else if (key == "prompt_lookup_min") {
      c.prompt_lookup_min = number<int32_t>(value, key, 1, 64);
    } else if (key == "prompt_lookup_max") {
      c.prompt_lookup_max = number<int32_t>(value, key, 1, 64);
    } else if (key == "suffix_decoding_max_tree_depth") {
      c.suffix_max_depth = number<int32_t>(value, key, 2, 256);
    } else if (key == "suffix_decoding_min_token_prob") {
      c.suffix_min_token_prob = number<float>(value, key, 0.0f, 1.0f);
    } else if (key == "suffix_decoding_max_cached_tokens") {
      c.suffix_global_max_tokens = number<int64_t>(value, key, 0, int64_t{1} << 32);
    } else if (key == "drafting_threads") {
      c.drafting_threads = number<int32_t>(value, key, 0, 64);
    } else if (key == "model") {
      DI_CHECK(value.is_string() && !value.get<std::string>().empty(),
               "{}: \"model\" must be a non-empty path, got {}", kWhat, json_excerpt(value));
      c.draft_model = value.get<std::string>();
    } else {
      fail("{}: unknown field {}", kWhat, excerpt(key));
    }
  }
  // A draft model path only means something to the draft-model method.
  DI_CHECK((c.method == SpecMethod::DraftModel) == !c.draft_model.empty(),
           "{}: {}", kWhat,
           c.method == SpecMethod::DraftModel ? "the draft_model method needs \"model\" (the draft model's path)"
                                              : "\"model\" applies to the draft_model method only");
  DI_CHECK(c.prompt_lookup_min <= c.prompt_lookup_max,
           "{}: prompt_lookup_min ({}) must not exceed prompt_lookup_max ({})", kWhat, c.prompt_lookup_min,
           c.prompt_lookup_max);
  return c;
}

std::string SpeculativeConfig::to_json() const {
  nlohmann::json j = {{"method", to_string(method)},
                      {"num_speculative_tokens", num_speculative_tokens},
                      {"dynamic", dynamic},
                      {"speculation_switch_window", switch_window_steps},
                      {"speculation_switch_idle_share", switch_idle_share},
                      {"drafting_threads", drafting_threads}};
  if (method == SpecMethod::Ngram) {
    j["prompt_lookup_min"] = prompt_lookup_min;
    j["prompt_lookup_max"] = prompt_lookup_max;
  } else if (method == SpecMethod::DraftModel) {
    j["model"] = draft_model;
  } else if (method == SpecMethod::Suffix) {
    j["suffix_decoding_max_tree_depth"] = suffix_max_depth;
    j["suffix_decoding_min_token_prob"] = suffix_min_token_prob;
    j["suffix_decoding_max_cached_tokens"] = suffix_global_max_tokens;
  }
  return j.dump();
}

}  // namespace deepinfer::spec
