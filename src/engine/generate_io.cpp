#include "engine/generate_io.h"

#include "core/error.h"

namespace deepinfer {

GenerateInput parse_generate_input(const nlohmann::ordered_json& j, const nlohmann::ordered_json& defaults,
                                   const std::string& where) {
  DI_CHECK(j.is_object(), "{}: not a JSON object", where);
  GenerateInput g;
  try {
    nlohmann::ordered_json fields = j;
    for (const char* k : {"prompt", "messages", "tools", "prompt_token_ids", "cache_salt"}) fields.erase(k);
    nlohmann::ordered_json merged = defaults.is_object() ? defaults : nlohmann::ordered_json::object();
    merged.update(fields);
    g.params = SamplingParams::from_json(merged);
  } catch (const ParamError& e) {
    // Keep the field's name (Python's ParamError.param) and put `where` in front of the reason.
    std::string reason = e.what();
    const std::string prefix = "invalid sampling parameter '" + e.param() + "': ";
    if (reason.rfind(prefix, 0) == 0) reason.erase(0, prefix.size());
    throw ParamError(e.param(), fmt::format("{}: {}", where, reason));
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  const int sources = int(j.contains("prompt")) + int(j.contains("messages")) + int(j.contains("prompt_token_ids"));
  DI_CHECK(sources == 1, "{}: needs exactly one of \"prompt\" (string), \"messages\" or \"prompt_token_ids\"", where);
  if (j.contains("messages")) {
    DI_CHECK(j["messages"].is_array(), "{}: messages must be a list", where);
    g.messages = j["messages"];
    if (j.contains("tools") && !j["tools"].is_null()) {
      DI_CHECK(j["tools"].is_array(), "{}: tools must be a list", where);
      g.tools = j["tools"];
      if (!g.params.cache_ttl) g.params.cache_ttl = SamplingParams::kAgentCacheTtl;
    }
  } else if (j.contains("prompt_token_ids")) {
    DI_CHECK(j["prompt_token_ids"].is_array() && !j["prompt_token_ids"].empty(),
             "{}: prompt_token_ids must be a non-empty list", where);
    for (const auto& t : j["prompt_token_ids"]) {
      DI_CHECK(t.is_number_integer(), "{}: prompt_token_ids must hold integers", where);
      const int64_t id = t.get<int64_t>();
      DI_CHECK(id >= 0 && id <= INT32_MAX, "{}: prompt token id {} is out of range", where, id);
      g.prompt_ids.push_back(static_cast<int32_t>(id));
    }
  } else {
    DI_CHECK(j["prompt"].is_string(), "{}: prompt must be a string", where);
    g.prompt = j["prompt"].get<std::string>();
  }
  if (j.contains("cache_salt") && !j["cache_salt"].is_null()) {
    DI_CHECK(j["cache_salt"].is_string(), "{}: cache_salt must be a string", where);
    g.cache_salt = j["cache_salt"].get<std::string>();
  }
  return g;
}

nlohmann::json choice_json(const CompletionChoice& c) {
  nlohmann::json j{{"text", c.text},
                   {"token_ids", c.token_ids},
                   {"finish_reason", std::string(to_string(c.finish_reason))}};
  if (!c.stop_reason.empty()) j["stop_reason"] = c.stop_reason;
  if (!c.error.empty()) j["error"] = c.error;
  if (!c.logprobs.empty()) {
    nlohmann::json lp = nlohmann::json::array();
    for (const TokenOutput& t : c.logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const TokenLogprob& a : t.top) top.push_back({{"token_id", a.token}, {"logprob", a.logprob}});
      lp.push_back({{"token_id", t.token}, {"logprob", t.logprob}, {"rank", t.rank}, {"top_logprobs", top}});
    }
    j["logprobs"] = lp;
  }
  return j;
}

nlohmann::json completion_json(const CompletionOutput& o, bool speculative, bool with_prompt_ids) {
  int64_t completion_tokens = 0;
  for (const auto& c : o.choices) completion_tokens += static_cast<int64_t>(c.token_ids.size());
  nlohmann::json j = o.choices.empty() ? nlohmann::json::object() : choice_json(o.choices[0]);
  j["prompt_tokens"] = o.prompt_ids.size();
  if (with_prompt_ids) j["prompt_token_ids"] = o.prompt_ids;
  j["completion_tokens"] = completion_tokens;
  j["cached_prompt_tokens"] = o.num_cached_prompt_tokens;
  if (speculative) {
    j["verifications"] = o.num_verifications;
    j["verified_draft_tokens"] = o.num_verified_drafts;
    j["accepted_draft_tokens"] = o.num_accepted_drafts;
  }
  j["time_to_first_token_s"] = o.time_to_first_token_s;
  j["latency_s"] = o.latency_s;
  j["queue_time_s"] = o.queue_time_s;
  if (o.choices.size() > 1) {
    j["choices"] = nlohmann::json::array();
    for (const auto& c : o.choices) j["choices"].push_back(choice_json(c));
  }
  return j;
}

}  // namespace deepinfer
