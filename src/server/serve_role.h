// What an engine does in a disaggregated deployment (docs/router.md), shared
// by `serve --role` and the router that learns it from /server_info:
// Prefill computes prompts' KV into the shared --kv-cache-dir and answers
// one token; Decode continues requests whose prompt KV it finds there; Both
// serves whole requests.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace deepinfer::server {

enum class ServeRole : uint8_t { Both, Prefill, Decode };

inline const char* serve_role_name(ServeRole role) {
  switch (role) {
    case ServeRole::Prefill: return "prefill";
    case ServeRole::Decode: return "decode";
    case ServeRole::Both: break;
  }
  return "both";
}

inline std::optional<ServeRole> parse_serve_role(std::string_view name) {
  for (ServeRole r : {ServeRole::Both, ServeRole::Prefill, ServeRole::Decode}) {
    if (name == serve_role_name(r)) return r;
  }
  return std::nullopt;
}

}  // namespace deepinfer::server
