// What the router reads from a generation request before it routes it: the
// API, the model asked for, whether the answer streams, and the routing text
// (the conversation or prompt as JSON text, whose prefix the backends' caches
// share). Parsing failures are the client's: they become 400s.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "server/protocol.h"

namespace deepinfer::router {

struct RoutedRequest {
  server::Api api = server::Api::Chat;
  std::string model;
  bool stream = false;
  std::string routing_text;
  nlohmann::ordered_json body;
};

// Whether `path` is one of the generation endpoints the router plans for.
bool is_generation_path(std::string_view path);

// path: the request's path (/v1/chat/completions, /v1/completions,
// /v1/responses, /v1/messages). Throws server::ApiError(400) on a body that
// is not a JSON object.
RoutedRequest read_routed_request(std::string_view path, std::string_view body);

// The body a prefill engine gets: the same request, answered whole (not
// streamed); the engine itself stops after one token.
std::string prefill_body(const RoutedRequest& r);

// A rough token count for picking a prefill pool by length (about four bytes
// per token of JSON-quoted text); the backend's own check is the real one.
int64_t estimated_prompt_tokens(const RoutedRequest& r);

}  // namespace deepinfer::router
