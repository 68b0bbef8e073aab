// The one JSON parser behind every document the engine reads: model headers,
// config.json, tokenizer.json, tokenizer_config.json, requests, tool-call
// arguments. nlohmann's own parser is iterative, but copying, dumping and our
// own walkers recurse, so nesting is bounded while parsing, before anything can
// recurse on it. Objects are built in time linear in their size (nlohmann's
// ordered_json looks every key up linearly while parsing, which made a
// 100k-key request cost ~27 s of one I/O thread).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <istream>
#include <string>
#include <string_view>

namespace deepinfer {

enum class DuplicateKeys : uint8_t {
  Reject,    // model files: two tensors with one name is a broken file
  LastWins,  // requests: what Python's json and JavaScript do
};

struct JsonLimits {
  int32_t max_depth = 128;  // arrays and objects open at once
  DuplicateKeys duplicates = DuplicateKeys::Reject;
};

// Throws deepinfer::Error "<what>: ..." on invalid JSON, nesting deeper than
// the limit or (with Reject) a key that appears twice in one object.
nlohmann::json parse_json(std::string_view text, std::string_view what, const JsonLimits& limits = {});
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view what, const JsonLimits& limits = {});

// Reads a JSON Lines file: calls `fn(object, where)` for each non-blank line,
// `where` being "path:line" for error messages. Throws Error when the file
// cannot be read or a line is not a JSON object.
void for_each_jsonl_object(const std::string& path, const JsonLimits& limits,
                           const std::function<void(nlohmann::ordered_json&& object, const std::string& where)>& fn);
// The same over a stream, its lines named `name`:N in errors.
void for_each_jsonl_object(std::istream& in, const std::string& name, const JsonLimits& limits,
                           const std::function<void(nlohmann::ordered_json&& object, const std::string& where)>& fn);

// Text for an error message, cut to kExcerptBytes: values and keys come from
// files and clients and may be megabytes long.
constexpr size_t kExcerptBytes = 80;
std::string excerpt(std::string_view text);
std::string json_excerpt(const nlohmann::json& value);

}  // namespace deepinfer
