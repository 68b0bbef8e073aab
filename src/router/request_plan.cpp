#include "router/request_plan.h"

#include "server/api_error.h"

namespace deepinfer::router {

namespace {

constexpr int32_t kMaxJsonDepth = 64;

void append_field(const nlohmann::ordered_json& body, const char* name, std::string& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return;
  out += it->is_string() ? it->get<std::string>() : it->dump();
  out += '\n';
}

}  // namespace

bool is_generation_path(std::string_view p) {
  return p == "/v1/chat/completions" || p == "/v1/completions" || p == "/v1/responses" || p == "/v1/messages";
}

RoutedRequest read_routed_request(std::string_view path, std::string_view body) {
  RoutedRequest r;
  r.api = path == "/v1/completions" ? server::Api::Completion
          : path == "/v1/responses" ? server::Api::Responses
          : path.rfind("/v1/messages", 0) == 0 ? server::Api::Messages
                                               : server::Api::Chat;
  r.body = server::parse_json_body(body, kMaxJsonDepth);
  if (!r.body.is_object()) throw server::ApiError(400, "the request body must be a JSON object");
  if (auto m = r.body.find("model"); m != r.body.end() && m->is_string()) r.model = m->get<std::string>();
  if (auto s = r.body.find("stream"); s != r.body.end() && s->is_boolean()) r.stream = s->get<bool>();
  // The fields that make the prompt, in the order the template renders them.
  for (const char* name : {"system", "instructions", "tools", "messages", "input", "prompt"}) {
    append_field(r.body, name, r.routing_text);
  }
  return r;
}

std::string prefill_body(const RoutedRequest& r) {
  nlohmann::ordered_json b = r.body;
  b["stream"] = false;
  b.erase("stream_options");
  return server::dump_json(b);
}

int64_t estimated_prompt_tokens(const RoutedRequest& r) { return static_cast<int64_t>(r.routing_text.size() / 4); }

}  // namespace deepinfer::router
