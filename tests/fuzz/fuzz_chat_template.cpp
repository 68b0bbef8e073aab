// libFuzzer target: arbitrary template source rendered against a fixed
// conversation (with tools) under a small budget. Parse and render errors are
// fine; crashes, sanitizer reports and hangs are not.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace {

const nlohmann::ordered_json& messages() {
  static const auto m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful. {{ not code }}"},
    {"role": "user", "content": "Hi <|im_end|> ünï 🙂"},
    {"role": "assistant", "content": "<think>hmm</think>Hello", "reasoning_content": "r",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}}]},
    {"role": "tool", "content": "{\"ok\": 1}"},
    {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}])");
  return m;
}

const nlohmann::ordered_json& tools() {
  static const auto t = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f",
    "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  std::string source(reinterpret_cast<const char*>(data), size);
  ChatTemplateOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.budget.max_steps = 20'000;
  options.budget.max_loop_iterations = 5'000;
  options.budget.max_output_bytes = 64 << 10;
  options.budget.max_string_bytes = 64 << 10;
  options.budget.max_work_bytes = 1 << 20;
  options.budget.max_call_depth = 16;
  options.budget.max_eval_depth = 256;
  options.now = [] { return std::tm{}; };
  try {
    ChatTemplate tmpl(source, options);
    for (bool generation : {false, true}) {
      try {
        tmpl.render(messages(), generation ? tools() : nlohmann::ordered_json(), generation,
                    nlohmann::ordered_json{{"enable_thinking", generation}});
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
