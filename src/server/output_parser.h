// OutputParser: splits generated text, as it streams in, into reasoning
// (<think>...</think>), plain content and structured tool calls. Which formats
// apply follows the model's chat template:
//   Hermes / Qwen:  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//   Llama 3.1 JSON: the whole reply is {"name": ..., "parameters": {...}}
//                   (several may be separated by ';'), optionally after <|python_tag|>.
//   DeepSeek-V3:    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//                   ```json ARGS ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
// Text that might still become a marker is held back until it is decided, so a
// streamed client never sees half a tag. Text that looked like a tool call but
// does not parse is returned as content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::server {

enum class ToolCallFormat : uint8_t { None, Hermes, Llama3Json, DeepSeekV3 };

// The tool-call format a chat template's model was trained on (Hermes when the
// template is silent: it is the most common one among ChatML models).
ToolCallFormat tool_call_format_for_template(const std::string& chat_template);
// Whether the template's model writes <think> reasoning.
bool template_has_reasoning(const std::string& chat_template);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  // tools: the format to parse (None when the request offered no tools).
  OutputParser(ToolCallFormat tools, bool reasoning);

  ParsedDelta push(std::string_view text);
  // End of generation: whatever was held back, decided.
  ParsedDelta finish();

 private:
  enum class Think : uint8_t { Undecided, Inside, Done };
  enum class Tool : uint8_t { Content, InCall, Undecided, Json };
  void push_content(std::string_view text, ParsedDelta& out, bool final);
  // Formats whose calls are tagged blocks between content (Hermes, DeepSeek-V3).
  void push_tagged(ParsedDelta& out, bool final);
  bool parse_block(std::string_view body, ParsedToolCall& call) const;

  ToolCallFormat format_;
  Think think_;
  bool after_think_ = false;  // strip whitespace between </think> and the reply
  Tool tool_;
  std::string think_buf_;
  std::string tool_buf_;
  // Inside a Hermes call: bytes of tool_buf_ already searched for the closing
  // tag, so a long call streamed in small pieces is scanned once, not once per piece.
  size_t call_scanned_ = 0;
};

// Parses one tool call object ({"name", "arguments"|"parameters"}); false if it is not one.
bool parse_tool_call_json(std::string_view text, ParsedToolCall& out);
// Parses the body of one DeepSeek-V3 call (between its begin and end markers).
bool parse_deepseek_tool_call(std::string_view body, ParsedToolCall& out);

}  // namespace deepinfer::server
