// Checked accessors for tokenizer.json fields: a missing field or one of the
// wrong type throws deepinfer::Error naming the field, never a JSON exception.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"

namespace deepinfer::tok {

// tokenizer.json and tokenizer_config.json: real files nest fewer than 16
// levels; a later key wins, as in the Python libraries that write them.
inline JsonLimits tokenizer_json_limits() {
  JsonLimits limits;
  limits.max_depth = 64;
  limits.duplicates = DuplicateKeys::LastWins;
  return limits;
}

inline const nlohmann::json& json_field(const nlohmann::json& obj, const char* key, std::string_view where) {
  DI_CHECK(obj.is_object(), "tokenizer: {} is not a JSON object", where);
  auto it = obj.find(key);
  DI_CHECK(it != obj.end(), "tokenizer: {} has no field '{}'", where, key);
  return *it;
}

inline std::string json_string(const nlohmann::json& obj, const char* key, std::string_view where) {
  const auto& v = json_field(obj, key, where);
  DI_CHECK(v.is_string(), "tokenizer: {}: field '{}' is not a string", where, key);
  return v.get<std::string>();
}

// Optional fields: default when absent or null.
inline bool json_bool(const nlohmann::json& obj, const char* key, bool def) {
  if (!obj.is_object()) return def;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  DI_CHECK(it->is_boolean(), "tokenizer: field '{}' is not a boolean", key);
  return it->get<bool>();
}

inline std::string json_opt_string(const nlohmann::json& obj, const char* key, std::string def) {
  if (!obj.is_object()) return def;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  DI_CHECK(it->is_string(), "tokenizer: field '{}' is not a string", key);
  return it->get<std::string>();
}

inline const nlohmann::json& json_array(const nlohmann::json& obj, const char* key, std::string_view where) {
  const auto& v = json_field(obj, key, where);
  DI_CHECK(v.is_array(), "tokenizer: {}: field '{}' is not an array", where, key);
  return v;
}

// A {"pattern": {"String": s}} or {"pattern": {"Regex": r}} field: (text, is_literal).
inline std::pair<std::string, bool> json_pattern(const nlohmann::json& obj, std::string_view where) {
  const auto& p = json_field(obj, "pattern", where);
  DI_CHECK(p.is_object(), "tokenizer: {}: pattern is not an object", where);
  if (p.contains("String")) return {json_string(p, "String", where), true};
  if (p.contains("Regex")) return {json_string(p, "Regex", where), false};
  fail("tokenizer: {}: pattern has neither 'String' nor 'Regex'", where);
}

}  // namespace deepinfer::tok
