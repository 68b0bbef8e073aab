// Anthropic Messages requests, converted to the chat form the templates take.
#include <fmt/format.h>

#include <set>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/protocol.h"

namespace deepinfer::server {

using ojson = nlohmann::ordered_json;

namespace {

std::string block_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_param(param, "content must be a string or a list of blocks");
  std::string text;
  for (const ojson& b : content) {
    if (!b.is_object() || read_string(b, "type", {}, param) != "text" || !b.contains("text") ||
        !b["text"].is_string()) {
      bad_param(param, "expected text blocks");
    }
    text += b["text"].get<std::string>();
  }
  return text;
}

// One Anthropic message becomes one or more chat messages: tool_result blocks
// turn into tool messages, tool_use blocks into assistant tool_calls.
void convert_message(const ojson& m, size_t i, ojson& out) {
  const std::string p = fmt::format("messages[{}]", i);
  if (!m.is_object()) bad_param(p, "each message must be an object");
  const std::string role = read_string(m, "role", {}, p + ".role");
  if (role != "user" && role != "assistant") bad_param(p + ".role", "'role' must be 'user' or 'assistant'");
  auto c = m.find("content");
  if (c == m.end()) bad_param(p + ".content", "'content' is required");
  if (c->is_string()) {
    out.push_back({{"role", role}, {"content", *c}});
    return;
  }
  if (!c->is_array()) bad_param(p + ".content", "content must be a string or a list of blocks");
  std::string text;
  ojson calls = ojson::array();
  for (size_t k = 0; k < c->size(); ++k) {
    const ojson& b = (*c)[k];
    const std::string bp = fmt::format("{}.content[{}]", p, k);
    if (!b.is_object()) bad_param(bp, "each content block must be an object");
    const std::string type = read_string(b, "type", {}, bp + ".type");
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad_param(bp + ".text", "a text block needs 'text'");
      text += b["text"].get<std::string>();
    } else if (type == "tool_use") {
      if (role != "assistant") bad_param(bp, "tool_use blocks belong to assistant messages");
      if (!b.contains("name") || !b["name"].is_string()) bad_param(bp + ".name", "tool_use needs a 'name'");
      const ojson input = b.value("input", ojson::object());
      calls.push_back({{"id", b.value("id", ojson(""))},
                       {"type", "function"},
                       {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
    } else if (type == "tool_result") {
      const ojson& rc = b.value("content", ojson(""));
      out.push_back({{"role", "tool"},
                     {"tool_call_id", b.value("tool_use_id", ojson(""))},
                     {"content", block_text(rc, bp + ".content")}});
    } else if (type == "thinking" || type == "redacted_thinking") {
      continue;  // earlier reasoning is not replayed to the model
    } else {
      throw ApiError(400, fmt::format("content block type '{}' is not supported", type), bp + ".type");
    }
  }
  if (!text.empty() || !calls.empty()) {
    ojson msg = {{"role", role}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = calls;
    out.push_back(std::move(msg));
  }
}

}  // namespace

GenerationRequest parse_messages_request(const ojson& body, const RequestLimits& limits) {
  GenerationRequest r;
  r.api = Api::Messages;
  auto str = [&](const char* k) -> std::string {
    auto it = body.find(k);
    if (it == body.end() || it->is_null()) return {};
    if (!it->is_string()) bad_param(k, fmt::format("'{}' must be a string", k));
    return it->get<std::string>();
  };
  r.model = str("model");
  if (auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) bad_param("stream", "'stream' must be a boolean");
    r.stream = it->get<bool>();
  }
  ojson messages = ojson::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
    const std::string system = block_text(*it, "system");
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  }
  auto list = body.find("messages");
  if (list == body.end() || !list->is_array() || list->empty()) bad_param("messages", "'messages' must be a non-empty list");
  if (list->size() > limits.max_messages) bad_param("messages", "too many messages");
  for (size_t i = 0; i < list->size(); ++i) convert_message((*list)[i], i, messages);
  r.messages = parse_chat_messages(messages, limits);
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) bad_param("tools", "'tools' must be a list");
    ojson tools = ojson::array();
    for (const ojson& t : *it) {
      if (!t.is_object()) bad_param("tools", "each tool must be an object");
      ojson fn = {{"name", t.value("name", ojson())}};
      if (t.contains("description")) fn["description"] = t["description"];
      if (t.contains("input_schema")) fn["parameters"] = t["input_schema"];
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    r.tools = parse_chat_tools(tools, limits);
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad_param("tool_choice", "'tool_choice' must be an object");
    const std::string type = read_string(*it, "type", {}, "tool_choice.type");
    if (type == "auto") r.tool_choice = ToolChoice::Auto;
    else if (type == "any") r.tool_choice = ToolChoice::Required;
    else if (type == "none") r.tool_choice = ToolChoice::None;
    else if (type == "tool") {
      r.tool_choice = ToolChoice::Named;
      r.tool_choice_name = read_string(*it, "name", {}, "tool_choice.name");
    } else {
      bad_param("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none");
    }
    if (r.tool_choice != ToolChoice::None && r.tool_choice != ToolChoice::Auto && r.tools.is_null()) {
      bad_param("tool_choice", "'tool_choice' requires 'tools'");
    }
  }
  auto max_tokens = body.find("max_tokens");
  if (max_tokens == body.end() || max_tokens->is_null()) bad_param("max_tokens", "'max_tokens' is required");
  nlohmann::json s = nlohmann::json::object();
  s["max_tokens"] = *max_tokens;
  for (const char* k : {"temperature", "top_p", "top_k"}) {
    if (body.contains(k)) s[k] = body[k];
  }
  if (body.contains("stop_sequences")) s["stop"] = body["stop_sequences"];
  try {
    r.params = SamplingParams::from_json(s);
  } catch (const ParamError& e) {
    throw ApiError(400, e.what(), e.param() == "stop" ? "stop_sequences" : e.param());
  }
  if (!r.tools.is_null()) r.params.cache_ttl = SamplingParams::kAgentCacheTtl;
  static const std::set<std::string> known = {"model", "messages", "system", "max_tokens", "stream", "temperature",
                                              "top_p", "top_k", "stop_sequences", "tools", "tool_choice", "metadata",
                                              "thinking", "service_tier"};
  for (const auto& [k, v] : body.items()) {
    if (!known.count(k)) r.ignored_fields.push_back(k);
  }
  return r;
}

}  // namespace deepinfer::server
