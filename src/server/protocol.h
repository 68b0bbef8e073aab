// Requests of the four generation APIs (OpenAI chat completions, completions,
// responses; Anthropic messages), parsed and validated into one form before
// anything reaches the engine. Parsing never depends on the engine thread: it
// runs on a request worker (ApiServer) and throws ApiError (HTTP 400 with the
// offending field) for every client mistake.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer::server {

enum class Api : uint8_t { Chat, Completion, Responses, Messages };

// Bounds on every list a request may carry (numeric fields are bounded by
// SamplingParams::validate and the context length).
struct RequestLimits {
  size_t max_messages = 4096;
  size_t max_tools = 256;
  size_t max_prompts = 256;        // a completions batch
  size_t max_prompt_ids = 1 << 20;  // token ids in one prompt given as ids
  int32_t max_n = 16;              // samples per prompt
  int32_t max_json_depth = 64;
};

enum class ToolChoice : uint8_t { Auto, None, Required, Named };

struct GenerationRequest {
  Api api = Api::Chat;
  std::string model;
  nlohmann::ordered_json messages;  // chat form for Chat, Responses and Messages
  nlohmann::ordered_json tools;     // OpenAI chat form [{type, function{name, description, parameters}}], or null
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;
  std::vector<std::string> prompts;                // Completion: text prompts, or
  std::vector<std::vector<int32_t>> prompt_ids;    // Completion: token-id prompts
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // Completion
  bool add_generation_prompt = true;    // Chat (vLLM)
  bool continue_final_message = false;  // Chat (vLLM)
  bool chat_logprobs = false;  // Chat/Responses: logprobs requested
  nlohmann::ordered_json chat_template_kwargs;  // extra template variables, or null
  std::string cache_salt;
  // The prefill engine on another node holding the prompt's KV
  // (x-deepinfer-kv-source: ucx://host:port, set by the router; decode role).
  std::string kv_source;
  std::vector<std::string> ignored_fields;  // unknown fields, for a log line
};

// Parses the body text as JSON, nesting bounded while parsing (deeper input
// would make later recursive walks exhaust the stack) and a repeated key
// taking its last value. Throws ApiError 400.
nlohmann::ordered_json parse_json_body(std::string_view body, int32_t max_depth);

// JSON carried inside a string (tool-call arguments a client or the model
// wrote), or nullopt when the text is not JSON or nests deeper than
// kEmbeddedJsonDepth levels.
constexpr int32_t kEmbeddedJsonDepth = 64;
std::optional<nlohmann::ordered_json> parse_embedded_json(std::string_view text);

GenerationRequest parse_chat_request(const nlohmann::ordered_json& body, const RequestLimits& limits);
GenerationRequest parse_completion_request(const nlohmann::ordered_json& body, const RequestLimits& limits);
GenerationRequest parse_responses_request(const nlohmann::ordered_json& body, const RequestLimits& limits);
GenerationRequest parse_messages_request(const nlohmann::ordered_json& body, const RequestLimits& limits);

// Chat messages / tools in the form chat templates take (content parts joined to
// text, tool-call arguments as objects, Responses-style flat tools nested).
nlohmann::ordered_json parse_chat_messages(const nlohmann::ordered_json& list, const RequestLimits& limits);
nlohmann::ordered_json parse_chat_tools(const nlohmann::ordered_json& tools, const RequestLimits& limits);

// Range checks that need the model: sampling parameters against the vocabulary,
// prompt length + max_tokens against the context length (as vLLM words them).
void validate_for_model(GenerationRequest& request, int32_t vocab_size);
void check_prompt_length(const SamplingParams& params, size_t prompt_len, int32_t max_model_len);

// JSON text that never throws on invalid UTF-8 (it is replaced).
std::string dump_json(const nlohmann::ordered_json& j);

// An error as the API answers it: Anthropic's {"type": "error", "error": {...}}
// for messages, OpenAI's {"error": {message, type, param, code}} otherwise.
nlohmann::ordered_json error_body(Api api, int status, const std::string& message, const std::string& type,
                                  const std::string& param = {});

}  // namespace deepinfer::server
