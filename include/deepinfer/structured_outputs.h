// Structured output: a request's constraint on what it may generate (vLLM's
// StructuredOutputsParams). The engine compiles it into a grammar and masks
// every sampled row to the tokens the grammar allows (src/structured/).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

struct StructuredOutputs {
  enum class Kind : uint8_t {
    Json,        // spec: a JSON Schema (JSON text)
    JsonObject,  // any JSON object (OpenAI response_format json_object)
    Regex,       // spec: a regular expression the whole output matches
    Choice,      // choices: the output is exactly one of them
    Grammar,     // spec: an EBNF grammar with a `root` rule, or a Lark grammar with a `start` rule
    // spec: {"format": "hermes" | "llama3_json" | "deepseek_v3", "mode": "required" | "auto",
    //        "tools": [{"name": ..., "parameters": <JSON schema>, "strict": bool}]}:
    // "required": the output is one call of one of the tools, in the chat
    // template's tool-call format, its arguments valid for the tool's schema
    // (tool_choice "required" or a named function). "auto": free text in
    // which every call the model opens must be one of the tools, the
    // arguments of strict tools valid for their schema (tool_choice "auto").
    ToolCall,
  };
  static constexpr size_t kMaxSpecBytes = size_t{1} << 20;
  static constexpr size_t kMaxChoices = 1024;

  Kind kind = Kind::JsonObject;
  std::string spec;
  std::vector<std::string> choices;
  // Json: whitespace between JSON tokens as the model likes (vLLM's default),
  // or none (vLLM's disable_any_whitespace): compact output, which keeps a
  // small model from spending its tokens on blank space.
  bool any_whitespace = true;

  // The request field it came from, for error messages (e.g. "response_format").
  std::string param = "structured_outputs";

  // Identity of the constraint: equal keys compile to the same grammar.
  std::string key() const;
  // Throws ParamError naming param when a limit is exceeded or a field is empty.
  void validate() const;

  // vLLM's `structured_outputs` object: exactly one of json (object or
  // string), regex, choice, grammar, json_object.
  static StructuredOutputs from_vllm(const nlohmann::ordered_json& object, const std::string& param);
  // OpenAI's `response_format`; false for {"type": "text"} (no constraint).
  static bool from_response_format(const nlohmann::ordered_json& object, StructuredOutputs& out);
};

std::string_view to_string(StructuredOutputs::Kind kind);

}  // namespace deepinfer
