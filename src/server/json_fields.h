// Typed optional fields of a JSON request object. A missing or null field
// gives the fallback; a field of another type is a 400 naming `param`
// (nlohmann's value(key, default) would throw its own type_error instead,
// which is no answer to a client).
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"

namespace deepinfer::server {

inline const nlohmann::ordered_json* field(const nlohmann::ordered_json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

inline bool read_bool(const nlohmann::ordered_json& object, const char* name, bool fallback,
                      const std::string& param = {}) {
  const nlohmann::ordered_json* v = field(object, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_param(param.empty() ? name : param, fmt::format("'{}' must be a boolean", name));
  return v->get<bool>();
}

inline std::string read_string(const nlohmann::ordered_json& object, const char* name, const std::string& fallback = {},
                               const std::string& param = {}) {
  const nlohmann::ordered_json* v = field(object, name);
  if (!v) return fallback;
  if (!v->is_string()) bad_param(param.empty() ? name : param, fmt::format("'{}' must be a string", name));
  return v->get<std::string>();
}

}  // namespace deepinfer::server
