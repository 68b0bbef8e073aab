#include "server/protocol.h"

#include <fmt/format.h>

#include <set>

#include "core/json_parse.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

std::string dump_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson error_body(Api api, int status, const std::string& message, const std::string& type, const std::string& param) {
  if (api == Api::Messages) return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? ojson() : ojson(param)}, {"code", status}}}};
}

ojson parse_json_body(std::string_view body, int32_t max_depth) {
  JsonLimits limits;
  limits.max_depth = max_depth;
  limits.duplicates = DuplicateKeys::LastWins;
  ojson j;
  try {
    j = parse_ordered_json(body, "the request body", limits);
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", j.type_name()));
  return j;
}

std::optional<ojson> parse_embedded_json(std::string_view text) {
  JsonLimits limits;
  limits.max_depth = kEmbeddedJsonDepth;
  limits.duplicates = DuplicateKeys::LastWins;
  try {
    return parse_ordered_json(text, "embedded JSON", limits);
  } catch (const Error&) {
    return std::nullopt;
  }
}

namespace {

// Sampling parameters from the listed fields of `body` (renamed where the API
// uses another name); the ranges are checked later against the model.
SamplingParams sampling_from(const ojson& body, const std::vector<std::pair<const char*, const char*>>& names) {
  ojson s = ojson::object();
  for (const auto& [from, to] : names) {
    auto it = body.find(from);
    if (it != body.end()) s[to] = *it;
  }
  try {
    return SamplingParams::from_json(s);
  } catch (const ParamError& e) {
    std::string param = e.param();
    for (const auto& [from, to] : names) {
      if (param == to) param = from;
    }
    throw ApiError(400, e.what(), param);
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
}

const std::vector<std::pair<const char*, const char*>>& openai_sampling_fields() {
  static const std::vector<std::pair<const char*, const char*>> f = {
      {"n", "n"}, {"temperature", "temperature"}, {"top_p", "top_p"}, {"top_k", "top_k"}, {"min_p", "min_p"},
      {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"},
      {"repetition_penalty", "repetition_penalty"}, {"logit_bias", "logit_bias"}, {"seed", "seed"},
      {"stop", "stop"}, {"stop_token_ids", "stop_token_ids"}, {"ignore_eos", "ignore_eos"},
      {"min_tokens", "min_tokens"}, {"max_tokens", "max_tokens"}, {"max_completion_tokens", "max_completion_tokens"},
      {"logprobs", "logprobs"}, {"top_logprobs", "top_logprobs"}, {"prompt_logprobs", "prompt_logprobs"},
      {"skip_special_tokens", "skip_special_tokens"}, {"include_stop_str_in_output", "include_stop_str_in_output"},
      {"cache_ttl", "cache_ttl"},
      // Structured output (SamplingParams::structured_outputs and its spellings).
      {"response_format", "response_format"}, {"structured_outputs", "structured_outputs"},
      {"guided_json", "guided_json"}, {"guided_regex", "guided_regex"}, {"guided_choice", "guided_choice"},
      {"guided_grammar", "guided_grammar"}, {"guided_decoding", "guided_decoding"},
      {"guided_decoding_backend", "guided_decoding_backend"},
      {"guided_whitespace_pattern", "guided_whitespace_pattern"}};
  return f;
}

// Request fields of the OpenAI and vLLM APIs that change the output but are
// not implemented: a 400 naming the field, never a silent default. Other
// unknown fields (metadata, store, user, ...) are logged and ignored.
const std::set<std::string>& unsupported_output_fields() {
  static const std::set<std::string> f = {
      "functions", "function_call", "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
      "use_beam_search", "best_of", "length_penalty", "truncate_prompt_tokens", "allowed_token_ids", "bad_words",
      "structural_tag", "documents", "chat_template", "mm_processor_kwargs", "suffix",
      "return_tokens_as_token_ids", "logits_processors", "vllm_xargs", "thinking_token_budget"};
  return f;
}

void collect_ignored(const ojson& body, const std::set<std::string>& known, GenerationRequest& r) {
  for (const auto& [k, v] : body.items()) {
    if (known.count(k)) continue;
    if (!v.is_null() && unsupported_output_fields().count(k)) {
      bad_param(k, fmt::format("'{}' is not supported by this server", k));
    }
    r.ignored_fields.push_back(k);
  }
}

std::set<std::string> with_sampling(std::set<std::string> known) {
  for (const auto& [from, to] : openai_sampling_fields()) known.insert(from);
  return known;
}

void read_common(const ojson& body, GenerationRequest& r) {
  r.model = read_string(body, "model");
  r.stream = read_bool(body, "stream", false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_param("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad_param("stream_options", "'stream_options' is only allowed when 'stream' is true");
    r.include_usage = read_bool(*so, "include_usage", false);
  }
  r.cache_salt = read_string(body, "cache_salt");
  if (const ojson* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) bad_param("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (const char* reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}) {
      if (k->contains(reserved)) {
        bad_param("chat_template_kwargs",
                  fmt::format("'chat_template_kwargs' may not set '{}': it comes from the request itself", reserved));
      }
    }
    r.chat_template_kwargs = *k;
  }
}

// Text of a message's content: a string, or a list of text parts joined.
std::string content_text(const ojson& content, const std::string& param, bool allow_null) {
  if (content.is_null()) {
    if (!allow_null) bad_param(param, "content must not be null");
    return {};
  }
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_param(param, "content must be a string or a list of content parts");
  std::string text;
  for (const ojson& part : content) {
    if (!part.is_object()) bad_param(param, "each content part must be an object");
    const std::string type = read_string(part, "type", {}, param + ".type");
    if (type == "text" || type == "input_text" || type == "output_text") {
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) bad_param(param, "a text part needs a string 'text'");
      text += t->get<std::string>();
    } else {
      throw ApiError(400, fmt::format("content part type '{}' is not supported (text only)", type), param);
    }
  }
  return text;
}

ojson normalize_tool_calls(const ojson& calls, const std::string& param) {
  if (!calls.is_array()) bad_param(param, "'tool_calls' must be a list");
  ojson out = ojson::array();
  for (const ojson& c : calls) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
      bad_param(param, "each tool call needs a 'function' object");
    }
    ojson fn = c["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) bad_param(param, "a tool call function needs a 'name'");
    // Templates render arguments as a mapping; the API carries them as JSON text.
    if (fn.contains("arguments") && fn["arguments"].is_string()) {
      if (auto parsed = parse_embedded_json(fn["arguments"].get<std::string>())) fn["arguments"] = std::move(*parsed);
    }
    ojson call = {{"type", "function"}, {"function", fn}};
    if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

ojson parse_chat_messages(const ojson& list, const RequestLimits& limits) {
  if (!list.is_array() || list.empty()) bad_param("messages", "'messages' must be a non-empty list");
  if (list.size() > limits.max_messages) {
    bad_param("messages", fmt::format("at most {} messages are allowed, got {}", limits.max_messages, list.size()));
  }
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  ojson out = ojson::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const ojson& m = list[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_param(p, "each message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || !roles.count(role->get<std::string>())) {
      bad_param(p + ".role", "'role' must be one of system, developer, user, assistant, tool");
    }
    const std::string r = role->get<std::string>();
    ojson msg = {{"role", r == "developer" ? "system" : r}};
    const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    msg["content"] = content_text(m.value("content", ojson()), p + ".content", r == "assistant" && has_calls);
    if (r == "assistant" && has_calls) msg["tool_calls"] = normalize_tool_calls(m["tool_calls"], p + ".tool_calls");
    if (r == "tool") {
      if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) msg["tool_call_id"] = m["tool_call_id"];
    }
    if (m.contains("name") && m["name"].is_string()) msg["name"] = m["name"];
    out.push_back(std::move(msg));
  }
  return out;
}

ojson parse_chat_tools(const ojson& tools, const RequestLimits& limits) {
  if (!tools.is_array()) bad_param("tools", "'tools' must be a list");
  if (tools.size() > limits.max_tools) bad_param("tools", fmt::format("at most {} tools are allowed", limits.max_tools));
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad_param(p, "each tool must be an object");
    if (read_string(t, "type", "function", p + ".type") != "function") {
      bad_param(p + ".type", "only 'function' tools are supported");
    }
    // Chat form nests the function; Responses form is flat.
    const ojson& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
      bad_param(p + ".function.name", "a tool needs a non-empty string 'name'");
    }
    ojson f = {{"name", fn["name"]}};
    if (fn.contains("description") && fn["description"].is_string()) f["description"] = fn["description"];
    if (fn.contains("strict") && fn["strict"].is_boolean()) f["strict"] = fn["strict"];
    if (fn.contains("parameters") && !fn["parameters"].is_null()) {
      if (!fn["parameters"].is_object()) bad_param(p + ".function.parameters", "'parameters' must be a JSON schema object");
      f["parameters"] = fn["parameters"];
    }
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

namespace {

void parse_tool_choice(const ojson& body, GenerationRequest& r) {
  const ojson* tc = field(body, "tool_choice");
  if (!tc) {
    r.tool_choice = ToolChoice::Auto;
    return;
  }
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "auto") r.tool_choice = ToolChoice::Auto;
    else if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else bad_param("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a named function");
  } else if (tc->is_object()) {
    const ojson& fn = tc->contains("function") ? (*tc)["function"] : *tc;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) {
      bad_param("tool_choice", "a named tool_choice needs function.name");
    }
    r.tool_choice = ToolChoice::Named;
    r.tool_choice_name = fn["name"].get<std::string>();
  } else {
    bad_param("tool_choice", "'tool_choice' must be a string or an object");
  }
  if (r.tool_choice != ToolChoice::None && r.tool_choice != ToolChoice::Auto && r.tools.is_null()) {
    bad_param("tool_choice", "'tool_choice' requires 'tools'");
  }
  if (r.tool_choice == ToolChoice::Named) {
    bool found = false;
    for (const ojson& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
    if (!found) bad_param("tool_choice", fmt::format("tool '{}' is not among 'tools'", r.tool_choice_name));
  }
}

void check_n(GenerationRequest& r, const RequestLimits& limits) {
  if (r.params.n < 1 || r.params.n > limits.max_n) {
    bad_param("n", fmt::format("'n' must be in [1, {}], got {}", limits.max_n, r.params.n));
  }
  if (r.params.prompt_logprobs) bad_param("prompt_logprobs", "prompt_logprobs is not supported");
}

}  // namespace

GenerationRequest parse_chat_request(const ojson& body, const RequestLimits& limits) {
  GenerationRequest r;
  r.api = Api::Chat;
  read_common(body, r);
  const ojson* messages = field(body, "messages");
  if (!messages) bad_param("messages", "'messages' is required");
  r.messages = parse_chat_messages(*messages, limits);
  if (const ojson* tools = field(body, "tools")) r.tools = parse_chat_tools(*tools, limits);
  parse_tool_choice(body, r);
  r.params = sampling_from(body, openai_sampling_fields());
  if (!r.tools.is_null() && !r.params.cache_ttl) r.params.cache_ttl = SamplingParams::kAgentCacheTtl;
  r.chat_logprobs = r.params.logprobs.has_value();
  if (const ojson* lp = field(body, "logprobs"); lp && !lp->is_boolean()) {
    bad_param("logprobs", "'logprobs' must be a boolean for chat completions (use top_logprobs for alternatives)");
  }
  r.add_generation_prompt = read_bool(body, "add_generation_prompt", true);
  r.continue_final_message = read_bool(body, "continue_final_message", false);
  if (r.add_generation_prompt && r.continue_final_message) {
    bad_param("continue_final_message", "'add_generation_prompt' and 'continue_final_message' cannot both be true");
  }
  if (r.continue_final_message && (r.messages.empty() || r.messages.back().value("role", "") != "assistant")) {
    bad_param("continue_final_message", "'continue_final_message' needs a final assistant message");
  }
  if (read_bool(body, "echo", false)) {
    bad_param("echo", "'echo' is not supported for chat completions");
  }
  check_n(r, limits);
  collect_ignored(body,
                  with_sampling({"model", "messages", "stream", "stream_options", "tools", "tool_choice", "cache_salt",
                                 "chat_template_kwargs", "user", "parallel_tool_calls", "add_generation_prompt",
                                 "continue_final_message", "echo"}),
                  r);
  return r;
}

GenerationRequest parse_completion_request(const ojson& body, const RequestLimits& limits) {
  GenerationRequest r;
  r.api = Api::Completion;
  read_common(body, r);
  const ojson* prompt = field(body, "prompt");
  if (!prompt) bad_param("prompt", "'prompt' is required");
  auto read_ids = [&](const ojson& list) {
    if (list.size() > limits.max_prompt_ids) bad_param("prompt", "the token-id prompt is too long");
    std::vector<int32_t> ids;
    for (const ojson& t : list) {
      if (!t.is_number_integer()) bad_param("prompt", "token-id prompts must hold integers");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v > INT32_MAX) bad_param("prompt", fmt::format("token id {} is out of range", v));
      ids.push_back(static_cast<int32_t>(v));
    }
    if (ids.empty()) bad_param("prompt", "the prompt is empty");
    r.prompt_ids.push_back(std::move(ids));
  };
  if (prompt->is_string()) {
    r.prompts.push_back(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty()) {
    if ((*prompt)[0].is_number_integer()) {
      read_ids(*prompt);  // one prompt of token ids, as long as the context allows
    } else {
      if (prompt->size() > limits.max_prompts) {
        bad_param("prompt", fmt::format("at most {} prompts are allowed in one request", limits.max_prompts));
      }
      for (const ojson& p : *prompt) {
        if (p.is_string()) r.prompts.push_back(p.get<std::string>());
        else if (p.is_array()) read_ids(p);
        else bad_param("prompt", "'prompt' must be a string, a list of strings, or token ids");
      }
      if (!r.prompts.empty() && !r.prompt_ids.empty()) bad_param("prompt", "mix of text and token-id prompts");
    }
  } else {
    bad_param("prompt", "'prompt' must be a string, a list of strings, or token ids");
  }
  for (const std::string& p : r.prompts) {
    if (p.empty()) bad_param("prompt", "the prompt is empty");
  }
  r.echo = read_bool(body, "echo", false);
  r.params = sampling_from(body, openai_sampling_fields());
  if (r.echo && r.params.logprobs) {
    // The echoed prompt would need its tokens' logprobs (prompt_logprobs).
    bad_param("echo", "'echo' together with 'logprobs' is not supported: prompt logprobs are not available yet");
  }
  if (const ojson* lp = field(body, "logprobs"); lp && lp->is_boolean()) {
    bad_param("logprobs", "'logprobs' must be an integer for completions");
  }
  if (field(body, "suffix")) bad_param("suffix", "'suffix' is not supported");
  if (field(body, "best_of") && (*field(body, "best_of")) != ojson(1) && (*field(body, "best_of")) != body.value("n", ojson(1))) {
    bad_param("best_of", "'best_of' other than n is not supported");
  }
  if (r.params.max_tokens == std::nullopt) r.params.max_tokens = 16;  // the OpenAI completions default
  check_n(r, limits);
  const size_t count = std::max(r.prompts.size(), r.prompt_ids.size()) * static_cast<size_t>(r.params.n);
  if (count > limits.max_prompts) bad_param("n", fmt::format("prompts x n = {} exceeds {}", count, limits.max_prompts));
  collect_ignored(body, with_sampling({"model", "prompt", "stream", "stream_options", "echo", "cache_salt", "user",
                                       "best_of", "suffix", "chat_template_kwargs"}),
                  r);
  return r;
}

GenerationRequest parse_responses_request(const ojson& body, const RequestLimits& limits) {
  GenerationRequest r;
  r.api = Api::Responses;
  read_common(body, r);
  ojson messages = ojson::array();
  const std::string instructions = read_string(body, "instructions");
  if (!instructions.empty()) messages.push_back({{"role", "system"}, {"content", instructions}});
  const ojson* input = field(body, "input");
  if (!input) bad_param("input", "'input' is required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", input->get<std::string>()}});
  } else if (input->is_array()) {
    if (input->size() > limits.max_messages) bad_param("input", "too many input items");
    for (size_t i = 0; i < input->size(); ++i) {
      const ojson& item = (*input)[i];
      const std::string p = fmt::format("input[{}]", i);
      if (!item.is_object()) bad_param(p, "each input item must be an object");
      const std::string type = read_string(item, "type", "message", p + ".type");
      if (type == "message") {
        messages.push_back({{"role", item.value("role", ojson())}, {"content", item.value("content", ojson())}});
      } else if (type == "function_call") {
        messages.push_back({{"role", "assistant"},
                            {"content", nullptr},
                            {"tool_calls", {{{"id", item.value("call_id", ojson(""))},
                                             {"type", "function"},
                                             {"function", {{"name", item.value("name", ojson())},
                                                           {"arguments", item.value("arguments", ojson("{}"))}}}}}}});
      } else if (type == "function_call_output") {
        messages.push_back({{"role", "tool"},
                            {"tool_call_id", item.value("call_id", ojson(""))},
                            {"content", item.value("output", ojson())}});
      } else {
        bad_param(p + ".type", fmt::format("input item type '{}' is not supported", type));
      }
    }
  } else {
    bad_param("input", "'input' must be a string or a list of items");
  }
  r.messages = parse_chat_messages(messages, limits);
  if (const ojson* tools = field(body, "tools")) r.tools = parse_chat_tools(*tools, limits);
  parse_tool_choice(body, r);
  if (field(body, "previous_response_id")) {
    bad_param("previous_response_id", "stored responses are not supported; send the full input");
  }
  r.params = sampling_from(body, {{"temperature", "temperature"}, {"top_p", "top_p"},
                                  {"max_output_tokens", "max_tokens"}, {"top_logprobs", "logprobs"}});
  if (const ojson* text = field(body, "text")) {
    // The Responses API's text.format: chat's response_format with the
    // json_schema fields flattened into it.
    if (!text->is_object()) bad_param("text", "'text' must be an object");
    if (const ojson* format = field(*text, "format")) {
      if (!format->is_object()) bad_param("text.format", "'text.format' must be an object");
      ojson rf = ojson::object();
      rf["type"] = format->value("type", ojson());
      if (rf["type"] == "json_schema") {
        ojson js = ojson::object();
        for (const char* k : {"name", "schema", "strict", "description"}) {
          if (format->contains(k)) js[k] = (*format)[k];
        }
        rf["json_schema"] = js;
      }
      try {
        StructuredOutputs so;
        if (StructuredOutputs::from_response_format(rf, so)) r.params.structured_outputs = std::move(so);
      } catch (const ParamError& e) {
        throw ApiError(400, e.what(), "text.format");
      }
    }
  }
  collect_ignored(body, {"model", "input", "instructions", "stream", "tools", "tool_choice", "temperature", "top_p",
                         "max_output_tokens", "top_logprobs", "store", "metadata", "user", "parallel_tool_calls",
                         "cache_salt", "chat_template_kwargs", "text"},
                  r);
  return r;
}

void check_prompt_length(const SamplingParams& params, size_t prompt_len, int32_t max_model_len) {
  if (prompt_len >= static_cast<size_t>(max_model_len)) {
    throw ApiError(400, fmt::format("This model's maximum context length is {} tokens. However, your request has {} "
                                    "input tokens; at least one token must be left for the output.",
                                    max_model_len, prompt_len), "messages");
  }
  if (params.max_tokens && prompt_len + static_cast<size_t>(*params.max_tokens) > static_cast<size_t>(max_model_len)) {
    throw ApiError(400, fmt::format("'max_tokens' is too large: {}. This model's maximum context length is {} tokens "
                                    "and your request has {} input tokens ({} > {} - {}).",
                                    *params.max_tokens, max_model_len, prompt_len, *params.max_tokens, max_model_len,
                                    prompt_len), "max_tokens");
  }
}

void validate_for_model(GenerationRequest& r, int32_t vocab_size) {
  try {
    r.params.validate(vocab_size);
  } catch (const ParamError& e) {
    std::string param = e.param();
    if (r.api == Api::Responses && param == "max_tokens") param = "max_output_tokens";
    // Chat and Responses carry the number of alternatives in top_logprobs.
    if ((r.api == Api::Chat || r.api == Api::Responses) && param == "logprobs") param = "top_logprobs";
    if (r.api == Api::Messages && param == "stop") param = "stop_sequences";
    throw ApiError(400, e.what(), param);
  }
  if (r.api == Api::Messages || r.api == Api::Responses) return;
  for (const auto& ids : r.prompt_ids) {
    for (int32_t t : ids) {
      if (t >= vocab_size) bad_param("prompt", fmt::format("token id {} is outside the vocabulary (size {})", t, vocab_size));
    }
  }
}

}  // namespace deepinfer::server
