#include "deepinfer/structured_outputs.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "deepinfer/sampling_params.h"

namespace deepinfer {

namespace {

// Ordered: a JSON schema keeps its properties in the order the client wrote them.
using json = nlohmann::ordered_json;

[[noreturn]] void so_fail(const std::string& param, const std::string& message) { throw ParamError(param, message); }

std::string read_text(const json& v, const std::string& param, const char* what) {
  if (!v.is_string()) so_fail(param, fmt::format("{} must be a string, got {}", what, v.type_name()));
  return v.get<std::string>();
}

// A schema given as an object or as JSON text; kept as compact JSON text.
std::string read_schema(const json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    json parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) so_fail(param, "the JSON schema is not valid JSON");
    if (!parsed.is_object() && !parsed.is_boolean()) so_fail(param, "the JSON schema must be an object");
    return parsed.dump();
  }
  so_fail(param, fmt::format("the JSON schema must be an object, got {}", v.type_name()));
}

}  // namespace

std::string_view to_string(StructuredOutputs::Kind kind) {
  switch (kind) {
    case StructuredOutputs::Kind::Json: return "json";
    case StructuredOutputs::Kind::JsonObject: return "json_object";
    case StructuredOutputs::Kind::Regex: return "regex";
    case StructuredOutputs::Kind::Choice: return "choice";
    case StructuredOutputs::Kind::Grammar: return "grammar";
    case StructuredOutputs::Kind::ToolCall: return "tool call";
  }
  return "?";
}

std::string StructuredOutputs::key() const {
  std::string k(to_string(kind));
  k += '\0';
  if (kind == Kind::Choice) {
    // Length-prefixed, so no choice text can imitate a boundary.
    for (const std::string& c : choices) k += fmt::format("{}:{}", c.size(), c);
  } else {
    k += spec;
  }
  if (!any_whitespace) k += "\0compact";
  return k;
}

void StructuredOutputs::validate() const {
  if (spec.size() > kMaxSpecBytes) {
    so_fail(param, fmt::format("the {} is {} bytes; at most {} are accepted", to_string(kind), spec.size(), kMaxSpecBytes));
  }
  switch (kind) {
    case Kind::Json:
    case Kind::Regex:
    case Kind::Grammar:
    case Kind::ToolCall:
      if (spec.empty()) so_fail(param, fmt::format("the {} is empty", to_string(kind)));
      break;
    case Kind::JsonObject: break;
    case Kind::Choice: {
      if (choices.empty()) so_fail(param, "choice needs at least one string");
      if (choices.size() > kMaxChoices) {
        so_fail(param, fmt::format("choice has {} entries; at most {} are accepted", choices.size(), kMaxChoices));
      }
      size_t bytes = 0;
      for (const std::string& c : choices) {
        if (c.empty()) so_fail(param, "choice entries must not be empty");
        bytes += c.size();
      }
      if (bytes > kMaxSpecBytes) so_fail(param, fmt::format("choice entries total {} bytes; at most {}", bytes, kMaxSpecBytes));
      break;
    }
  }
}

StructuredOutputs StructuredOutputs::from_vllm(const json& object, const std::string& param) {
  if (!object.is_object()) so_fail(param, fmt::format("must be an object, got {}", object.type_name()));
  StructuredOutputs out;
  out.param = param;
  int set = 0;
  for (const auto& [key, v] : object.items()) {
    if (v.is_null()) continue;
    if (key == "json") {
      out.kind = Kind::Json;
      out.spec = read_schema(v, param);
    } else if (key == "regex") {
      out.kind = Kind::Regex;
      out.spec = read_text(v, param, "regex");
    } else if (key == "grammar") {
      out.kind = Kind::Grammar;
      out.spec = read_text(v, param, "grammar");
    } else if (key == "choice") {
      if (!v.is_array()) so_fail(param, fmt::format("choice must be a list of strings, got {}", v.type_name()));
      out.kind = Kind::Choice;
      for (const json& c : v) out.choices.push_back(read_text(c, param, "each choice"));
    } else if (key == "json_object") {
      if (!v.is_boolean()) so_fail(param, "json_object must be a boolean");
      if (!v.get<bool>()) continue;
      out.kind = Kind::JsonObject;
    } else if (key == "disable_any_whitespace") {
      if (!v.is_boolean()) so_fail(param, "disable_any_whitespace must be a boolean");
      out.any_whitespace = !v.get<bool>();
      continue;  // an option, not a constraint
    } else if (key == "disable_additional_properties" ||
               key == "disable_fallback" || key == "whitespace_pattern" || key == "structural_tag") {
      // Options that change the output: refused rather than ignored.
      so_fail(param, fmt::format("'{}' is not supported", key));
    } else if (key == "backend" || key == "_backend" || key == "_backend_was_auto") {
      continue;  // the engine has one grammar backend
    } else {
      so_fail(param, fmt::format("unknown field '{}'", key));
    }
    ++set;
  }
  if (set != 1) so_fail(param, "exactly one of json, regex, choice, grammar or json_object must be given");
  out.validate();
  return out;
}

bool StructuredOutputs::from_response_format(const json& object, StructuredOutputs& out) {
  const std::string param = "response_format";
  if (!object.is_object()) so_fail(param, fmt::format("must be an object, got {}", object.type_name()));
  auto type_it = object.find("type");
  if (type_it == object.end() || !type_it->is_string()) so_fail(param, "'type' must be 'text', 'json_object' or 'json_schema'");
  const std::string type = type_it->get<std::string>();
  out = StructuredOutputs{};
  out.param = param;
  if (type == "text") return false;
  if (type == "json_object") {
    out.kind = Kind::JsonObject;
    return true;
  }
  if (type != "json_schema") so_fail(param, fmt::format("unsupported type '{}'", type));
  auto js = object.find("json_schema");
  if (js == object.end() || !js->is_object()) so_fail(param, "json_schema must be an object with a 'schema'");
  // `strict` asks that the output match the schema exactly; the grammar makes
  // every output do so, so both values are served the same way.
  if (auto s = js->find("strict"); s != js->end() && !s->is_null() && !s->is_boolean()) {
    so_fail(param, "json_schema.strict must be a boolean");
  }
  auto schema = js->find("schema");
  out.kind = Kind::Json;
  // OpenAI allows a schema-less json_schema: then any JSON object.
  if (schema == js->end() || schema->is_null()) {
    out.kind = Kind::JsonObject;
  } else {
    out.spec = read_schema(*schema, param);
  }
  out.validate();
  return true;
}

}  // namespace deepinfer
