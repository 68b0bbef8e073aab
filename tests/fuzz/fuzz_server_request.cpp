// libFuzzer target: an HTTP request body as the server sees it. The first byte
// picks the API (chat, completions, responses, Anthropic messages); the rest is
// parsed, validated against a model's limits and, for chat-style APIs, rendered
// through a ChatML template with tools, as the server does on its request
// workers. (The tool-call / reasoning output parser has its own target,
// fuzz_output_parser: here it took three quarters of the time.)
// ApiError and deepinfer::Error are the expected outcomes for bad input;
// anything else (another exception, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "server/api_error.h"
#include "server/protocol.h"
#include "tokenizer/chat_template.h"

namespace {

const deepinfer::ChatTemplate& chat_template() {
  static const deepinfer::ChatTemplate t(
      "{%- if tools %}<|im_start|>system\n{%- for t in tools %}{{ t | tojson }}\n{%- endfor %}<|im_end|>\n{%- endif %}"
      "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
      "{%- if m.tool_calls %}{%- for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>"
      "{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}"
      "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
      {});
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::server;
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const RequestLimits limits;
  try {
    const nlohmann::ordered_json j = parse_json_body(body, limits.max_json_depth);
    GenerationRequest r;
    switch (selector % 4) {
      case 0: r = parse_chat_request(j, limits); break;
      case 1: r = parse_completion_request(j, limits); break;
      case 2: r = parse_responses_request(j, limits); break;
      default: r = parse_messages_request(j, limits); break;
    }
    validate_for_model(r, 49152);
    check_prompt_length(r.params, r.prompt_ids.empty() ? 10 : r.prompt_ids[0].size(), 8192);
    if (!r.messages.is_null()) {
      const std::string prompt = chat_template().render(r.messages, r.tools, true);
      dump_json(nlohmann::ordered_json(prompt));
    }
  } catch (const ApiError& e) {
    if (e.status() < 400 || e.status() >= 500) __builtin_trap();
  } catch (const deepinfer::Error&) {
    // Template or parameter errors: the server answers 400.
  }
  return 0;
}
