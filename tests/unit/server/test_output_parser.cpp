// Tool-call and reasoning parsing, checked on text rendered by real chat
// templates (the assistant turn a model was trained to write) and on every way
// of splitting a stream.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/output_parser.h"
#include "tokenizer/chat_template.h"

namespace deepinfer::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/chat_template/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ParsedDelta parse_in_chunks(ToolCallFormat f, bool reasoning, const std::string& text, size_t chunk) {
  OutputParser p(f, reasoning);
  ParsedDelta all;
  auto add = [&](ParsedDelta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += chunk) add(p.push(std::string_view(text).substr(i, chunk)));
  add(p.finish());
  return all;
}

// The assistant turn a template renders for a conversation ending in a tool call.
std::string rendered_tool_call_turn(const std::string& tmpl, const std::string& open, const std::string& close) {
  ChatTemplate t(tmpl, {});
  ojson messages = ojson::array();
  messages.push_back({{"role", "user"}, {"content", "Weather in Paris for 2 days?"}});
  ojson call = {{"type", "function"},
                {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}, {"days", 2}}}}}};
  messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
  ojson params = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}};
  ojson tool = {{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", params}}}};
  ojson tools = ojson::array({tool});
  const std::string out = t.render(messages, tools, false);
  const size_t start = out.rfind(open);
  EXPECT_NE(start, std::string::npos) << out;
  const size_t end = out.find(close, start + open.size());
  EXPECT_NE(end, std::string::npos) << out;
  return out.substr(start + open.size(), end - start - open.size());
}

void expect_weather_call(const ParsedDelta& d) {
  ASSERT_EQ(d.tool_calls.size(), 1u) << "content: " << d.content;
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(d.tool_calls[0].arguments), nlohmann::json({{"city", "Paris"}, {"days", 2}}));
  EXPECT_EQ(d.content.find("tool_call"), std::string::npos);
}

TEST(OutputParser, FormatFollowsTheTemplate) {
  EXPECT_EQ(tool_call_format_for_template(read_template("qwen3.jinja")), ToolCallFormat::Hermes);
  EXPECT_EQ(tool_call_format_for_template(read_template("llama3_tools.jinja")), ToolCallFormat::Llama3Json);
  EXPECT_EQ(tool_call_format_for_template(read_template("deepseek_v3.jinja")), ToolCallFormat::DeepSeekV3);
  EXPECT_TRUE(template_has_reasoning(read_template("qwen3.jinja")));
  EXPECT_FALSE(template_has_reasoning(read_template("smollm2.jinja")));
  EXPECT_FALSE(template_has_reasoning(read_template("llama3_tools.jinja")));
}

TEST(OutputParser, Qwen3ToolCallRoundTripsThroughItsTemplate) {
  const std::string turn = rendered_tool_call_turn(read_template("qwen3.jinja"), "<|im_start|>assistant\n", "<|im_end|>");
  ASSERT_NE(turn.find("<tool_call>"), std::string::npos) << turn;
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, turn.size()}) {
    SCOPED_TRACE(chunk);
    expect_weather_call(parse_in_chunks(ToolCallFormat::Hermes, true, turn, chunk));
  }
}

TEST(OutputParser, Llama31ToolCallRoundTripsThroughItsTemplate) {
  const std::string turn = rendered_tool_call_turn(read_template("llama3_tools.jinja"),
                                                   "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>");
  for (size_t chunk : {size_t{1}, size_t{4}, turn.size()}) {
    SCOPED_TRACE(chunk);
    expect_weather_call(parse_in_chunks(ToolCallFormat::Llama3Json, false, turn, chunk));
  }
}

// DeepSeek-V3's format, as its template writes an assistant turn with calls
// (arguments fenced as JSON after the function's name), split anywhere.
TEST(OutputParser, DeepSeekV3CallsSplitAnywhere) {
  const std::string call1 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                            "{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>";
  const std::string call2 = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>";
  const std::string text = "Checking.<｜tool▁calls▁begin｜>" + call1 + "\n" + call2 + "<｜tool▁calls▁end｜>";
  EXPECT_EQ(tool_call_format_for_template("{{'<｜tool▁call▁begin｜>' + tool['type']}}"), ToolCallFormat::DeepSeekV3);
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{5}, text.size()}) {
    SCOPED_TRACE(chunk);
    const ParsedDelta d = parse_in_chunks(ToolCallFormat::DeepSeekV3, false, text, chunk);
    ASSERT_EQ(d.tool_calls.size(), 2u) << d.content;
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(nlohmann::json::parse(d.tool_calls[0].arguments), nlohmann::json({{"city", "Paris"}, {"days", 2}}));
    EXPECT_EQ(d.tool_calls[1].name, "get_time");
    EXPECT_EQ(d.tool_calls[1].arguments, "{}");
    EXPECT_EQ(d.content, "Checking.\n");
  }
  // A block that is not a call stays content.
  const std::string bad = "<｜tool▁call▁begin｜>no separator here<｜tool▁call▁end｜>";
  EXPECT_EQ(parse_in_chunks(ToolCallFormat::DeepSeekV3, false, bad, 3).content, bad);
}

TEST(OutputParser, HermesMixedContentSplitAnywhere) {
  const std::string text =
      "Let me check. <tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{}\"}</tool_call> done < not a tag";
  const ParsedDelta whole = parse_in_chunks(ToolCallFormat::Hermes, false, text, text.size());
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0].name, "a");
  EXPECT_EQ(whole.tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(whole.tool_calls[1].arguments, "{}");
  EXPECT_EQ(whole.content, "Let me check. \n done < not a tag");
  for (size_t chunk = 1; chunk < 12; ++chunk) {
    const ParsedDelta d = parse_in_chunks(ToolCallFormat::Hermes, false, text, chunk);
    EXPECT_EQ(d.content, whole.content) << chunk;
    ASSERT_EQ(d.tool_calls.size(), 2u) << chunk;
    EXPECT_EQ(d.tool_calls[1].name, "b");
  }
}

TEST(OutputParser, MalformedCallsStayContent) {
  const std::string text = "<tool_call>{\"name\": oops}</tool_call>";
  const ParsedDelta d = parse_in_chunks(ToolCallFormat::Hermes, false, text, 3);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, text);
  const ParsedDelta j = parse_in_chunks(ToolCallFormat::Llama3Json, false, "{\"not\": \"a call\"}", 2);
  EXPECT_TRUE(j.tool_calls.empty());
  EXPECT_EQ(j.content, "{\"not\": \"a call\"}");
  const ParsedDelta plain = parse_in_chunks(ToolCallFormat::Llama3Json, false, "Hello {there}", 1);
  EXPECT_EQ(plain.content, "Hello {there}");
}

TEST(OutputParser, UnclosedHermesCallAtEndOfGeneration) {
  const ParsedDelta d =
      parse_in_chunks(ToolCallFormat::Hermes, false, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", 5);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
}

TEST(OutputParser, Llama3SeveralCallsAndPythonTag) {
  const std::string text =
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; {\"name\": \"b\", \"parameters\": {}}";
  // ';' inside a string breaks naive splitting: then the whole reply stays content.
  const ParsedDelta d = parse_in_chunks(ToolCallFormat::Llama3Json, false, text, 4);
  EXPECT_TRUE(d.tool_calls.empty() || d.tool_calls.size() == 2u);
  const ParsedDelta e = parse_in_chunks(
      ToolCallFormat::Llama3Json, false, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": 1}}", 4);
  ASSERT_EQ(e.tool_calls.size(), 2u);
  EXPECT_EQ(e.tool_calls[1].arguments, "{\"k\":1}");
  EXPECT_TRUE(e.content.empty());
}

TEST(OutputParser, ReasoningIsSeparated) {
  const std::string text = "<think>\nLet me think.\n</think>\n\nThe answer is 4.";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    const ParsedDelta d = parse_in_chunks(ToolCallFormat::None, true, text, chunk);
    EXPECT_EQ(d.reasoning, "\nLet me think.\n") << chunk;
    EXPECT_EQ(d.content, "The answer is 4.") << chunk;
  }
  const ParsedDelta none = parse_in_chunks(ToolCallFormat::None, true, "No thinking here.", 2);
  EXPECT_EQ(none.reasoning, "");
  EXPECT_EQ(none.content, "No thinking here.");
  const ParsedDelta cut = parse_in_chunks(ToolCallFormat::None, true, "<think>still going", 3);
  EXPECT_EQ(cut.reasoning, "still going");
  EXPECT_EQ(cut.content, "");
  const ParsedDelta both = parse_in_chunks(ToolCallFormat::Hermes, true,
                                           "<think>call f</think><tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", 2);
  EXPECT_EQ(both.reasoning, "call f");
  ASSERT_EQ(both.tool_calls.size(), 1u);
}

}  // namespace
}  // namespace deepinfer::server
