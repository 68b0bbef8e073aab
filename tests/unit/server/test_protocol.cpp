// Request parsing and validation of the four generation APIs: every client
// mistake is an ApiError with HTTP 400 (or the right status) naming the field.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace deepinfer::server {
namespace {

using ojson = nlohmann::ordered_json;

const RequestLimits kLimits;

template <typename F>
ApiError api_error(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "");
}

ojson chat(ojson extra = ojson::object()) {
  ojson body = {{"model", "m"}, {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})}};
  body.update(extra);
  return body;
}

TEST(ParseJsonBody, RejectsBadJsonDeepNestingAndNonObjects) {
  EXPECT_EQ(api_error([] { parse_json_body("{not json", 64); }).status(), 400);
  EXPECT_EQ(api_error([] { parse_json_body(std::string(100000, '['), 64); }).status(), 400);
  EXPECT_EQ(api_error([] { parse_json_body("[1,2]", 64); }).status(), 400);
  EXPECT_EQ(api_error([] { parse_json_body("{\"a\":\"\\xff\"}", 64); }).status(), 400);
  // Brackets inside strings do not count as nesting.
  EXPECT_EQ(parse_json_body("{\"a\": \"" + std::string(1000, '[') + "\"}", 4)["a"].get<std::string>().size(), 1000u);
}

TEST(ParseChat, ReadsMessagesToolsAndSampling) {
  ojson body = chat({{"max_completion_tokens", 7}, {"temperature", 0.5}, {"n", 2}, {"seed", 3}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}, {"logprobs", true}, {"top_logprobs", 3},
                     {"stop", "END"}, {"frobnicate", 1}});
  body["messages"] = ojson::array({{{"role", "developer"}, {"content", "be brief"}},
                                   {{"role", "user"}, {"content", ojson::array({{{"type", "text"}, {"text", "a"}},
                                                                                {{"type", "text"}, {"text", "b"}}})}},
                                   {{"role", "assistant"},
                                    {"content", nullptr},
                                    {"tool_calls", ojson::array({{{"id", "c1"}, {"type", "function"},
                                                                  {"function", {{"name", "f"}, {"arguments", "{\"x\":1}"}}}}})}},
                                   {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}});
  body["tools"] = ojson::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", ojson::object()}}}}});
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "f"}}}};
  GenerationRequest r = parse_chat_request(body, kLimits);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(r.tool_choice, ToolChoice::Named);
  EXPECT_EQ(*r.params.max_tokens, 7);
  EXPECT_EQ(r.params.n, 2);
  EXPECT_EQ(*r.params.seed, 3u);
  EXPECT_EQ(*r.params.logprobs, 3);
  EXPECT_TRUE(r.chat_logprobs && r.stream && r.include_usage);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.ignored_fields, std::vector<std::string>{"frobnicate"});
}

TEST(ParseChat, ClientMistakesNameTheField) {
  struct Case {
    ojson body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"model", "m"}}, "messages"},
      {chat({{"messages", ojson::array()}}), "messages"},
      {chat({{"messages", "hi"}}), "messages"},
      {chat({{"messages", ojson::array({{{"role", "wizard"}, {"content", "x"}}})}}), "messages[0].role"},
      {chat({{"messages", ojson::array({{{"role", "user"}, {"content", ojson::array({{{"type", "image_url"}}})}}})}}),
       "messages[0].content"},
      {chat({{"n", 0}}), "n"},
      {chat({{"n", 1000000}}), "n"},
      {chat({{"n", "two"}}), "n"},
      {chat({{"temperature", "hot"}}), "temperature"},
      {chat({{"max_tokens", 1e300}}), "max_tokens"},
      {chat({{"max_tokens", 99999999999}}), "max_tokens"},
      {chat({{"logprobs", 3}}), "logprobs"},
      {chat({{"top_logprobs", 2}}), "top_logprobs"},
      {chat({{"stream", "yes"}}), "stream"},
      {chat({{"stream_options", {{"include_usage", true}}}}), "stream_options"},
      {chat({{"tool_choice", "required"}}), "tool_choice"},
      {chat({{"tools", ojson::array({{{"type", "function"}, {"function", {{"name", 3}}}}})}}), "tools[0].function.name"},
      {chat({{"tools", ojson::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}),
       "tool_choice"},
      {chat({{"prompt_logprobs", 1}}), "prompt_logprobs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.dump());
    ApiError e = api_error([&] { parse_chat_request(c.body, kLimits); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), c.param);
    EXPECT_EQ(e.type(), "invalid_request_error");
  }
}

TEST(ParseChat, RangesAreCheckedAgainstTheModel) {
  auto validated = [](ojson extra) {
    GenerationRequest r = parse_chat_request(chat(extra), kLimits);
    validate_for_model(r, 1000);
    return r;
  };
  EXPECT_EQ(api_error([&] { validated({{"temperature", -1}}); }).param(), "temperature");
  EXPECT_EQ(api_error([&] { validated({{"top_p", 5}}); }).param(), "top_p");
  EXPECT_EQ(api_error([&] { validated({{"max_tokens", 0}}); }).param(), "max_tokens");
  EXPECT_EQ(api_error([&] { validated({{"logit_bias", {{"5000", 1}}}}); }).param(), "logit_bias");
  EXPECT_EQ(api_error([&] { validated({{"stop", std::vector<std::string>(1000, "x")}}); }).param(), "stop");
  EXPECT_NO_THROW(validated({{"temperature", 0}, {"max_tokens", 5}}));
  SamplingParams p;
  p.max_tokens = 100;
  EXPECT_EQ(api_error([&] { check_prompt_length(p, 50, 120); }).param(), "max_tokens");
  EXPECT_EQ(api_error([&] { check_prompt_length(p, 120, 120); }).status(), 400);
  EXPECT_NO_THROW(check_prompt_length(p, 20, 120));
}

TEST(ParseCompletion, PromptsAndDefaults) {
  GenerationRequest r = parse_completion_request({{"prompt", "hello"}, {"echo", true}}, kLimits);
  EXPECT_EQ(r.prompts, std::vector<std::string>{"hello"});
  EXPECT_EQ(*r.params.max_tokens, 16);
  EXPECT_TRUE(r.echo);
  r = parse_completion_request({{"prompt", "hello"}, {"logprobs", 2}}, kLimits);
  EXPECT_EQ(*r.params.logprobs, 2);
  // Echo with logprobs would need the prompt's logprobs: refused by name.
  EXPECT_EQ(api_error([&] { parse_completion_request({{"prompt", "hi"}, {"echo", true}, {"logprobs", 2}}, kLimits); })
                .param(),
            "echo");
  r = parse_completion_request({{"prompt", {1, 2, 3}}}, kLimits);
  EXPECT_EQ(r.prompt_ids, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  r = parse_completion_request({{"prompt", {"a", "b"}}, {"n", 2}}, kLimits);
  EXPECT_EQ(r.prompts.size(), 2u);
  for (const ojson& bad : {ojson{{"prompt", 5}}, ojson{{"prompt", {-1}}}, ojson{{"prompt", ""}},
                           ojson{{"prompt", ojson::array()}}, ojson{{"prompt", {1.5}}}, ojson::object(),
                           ojson{{"prompt", "x"}, {"logprobs", true}}}) {
    SCOPED_TRACE(bad.dump());
    EXPECT_EQ(api_error([&] { parse_completion_request(bad, kLimits); }).status(), 400);
  }
  GenerationRequest ids = parse_completion_request({{"prompt", {1, 999999}}}, kLimits);
  EXPECT_EQ(api_error([&] { validate_for_model(ids, 1000); }).param(), "prompt");
}

TEST(ParseResponses, InputItemsBecomeChatMessages) {
  ojson body = {{"instructions", "sys"},
                {"input", ojson::array({{{"type", "message"}, {"role", "user"},
                                         {"content", ojson::array({{{"type", "input_text"}, {"text", "hi"}}})}},
                                        {{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", "{}"}},
                                        {{"type", "function_call_output"}, {"call_id", "c"}, {"output", "done"}}})},
                {"max_output_tokens", 9},
                {"tools", ojson::array({{{"type", "function"}, {"name", "f"}, {"parameters", ojson::object()}}})}};
  GenerationRequest r = parse_responses_request(body, kLimits);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "hi");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r.messages[3]["role"], "tool");
  EXPECT_EQ(*r.params.max_tokens, 9);
  EXPECT_EQ(r.tools[0]["function"]["name"], "f");
  EXPECT_EQ(api_error([] { parse_responses_request({{"input", 3}}, kLimits); }).param(), "input");
  EXPECT_EQ(api_error([] { parse_responses_request({{"input", "x"}, {"max_output_tokens", "many"}}, kLimits); }).param(),
            "max_output_tokens");
}

TEST(ParseMessages, AnthropicBlocksBecomeChatMessages) {
  ojson body = {{"model", "m"},
                {"max_tokens", 5},
                {"system", ojson::array({{{"type", "text"}, {"text", "sys"}}})},
                {"stop_sequences", {"X"}},
                {"top_k", 3},
                {"messages", ojson::array({{{"role", "user"}, {"content", "q"}},
                                           {{"role", "assistant"},
                                            {"content", ojson::array({{{"type", "text"}, {"text", "let me"}},
                                                                      {{"type", "tool_use"}, {"id", "t"}, {"name", "f"},
                                                                       {"input", {{"a", 1}}}}})}},
                                           {{"role", "user"},
                                            {"content", ojson::array({{{"type", "tool_result"}, {"tool_use_id", "t"},
                                                                       {"content", "r"}}})}}})},
                {"tools", ojson::array({{{"name", "f"}, {"input_schema", {{"type", "object"}}}}})},
                {"tool_choice", {{"type", "any"}}}};
  GenerationRequest r = parse_messages_request(body, kLimits);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["content"], "sys");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["a"], 1);
  EXPECT_EQ(r.messages[3]["role"], "tool");
  EXPECT_EQ(r.tool_choice, ToolChoice::Required);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"X"});
  EXPECT_EQ(r.params.top_k, 3);
  body.erase("max_tokens");
  EXPECT_EQ(api_error([&] { parse_messages_request(body, kLimits); }).param(), "max_tokens");
  EXPECT_EQ(api_error([] {
              parse_messages_request({{"max_tokens", 1}, {"messages", ojson::array({{{"role", "system"}, {"content", "x"}}})}},
                                     kLimits);
            }).param(),
            "messages[0].role");
  // Fields of the wrong JSON type are 400s naming the field, not a JSON library error.
  EXPECT_EQ(api_error([] {
              parse_messages_request(
                  {{"max_tokens", 1}, {"messages", ojson::array({{{"role", ojson::array()}, {"content", "x"}}})}}, kLimits);
            }).param(),
            "messages[0].role");
  EXPECT_EQ(api_error([] {
              parse_messages_request({{"max_tokens", 1},
                                      {"messages", ojson::array({{{"role", "user"}, {"content", "x"}}})},
                                      {"tool_choice", {{"type", 3}}}},
                                     kLimits);
            }).param(),
            "tool_choice.type");
}

TEST(Metrics, PrometheusTextExposition) {
  MetricsRegistry m(std::vector<std::pair<std::string, std::string>>{{"model_name", "a\"b"}});
  m.counter("x_total", "help x", {{"reason", "stop"}}).inc(2);
  m.gauge("g", "help g").set(0.5);
  Histogram& h = m.histogram("h_seconds", "help h", {0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5);
  const std::string text = m.render();
  EXPECT_NE(text.find("# TYPE x_total counter\nx_total{model_name=\"a\\\"b\",reason=\"stop\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{model_name=\"a\\\"b\"} 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_bucket{model_name=\"a\\\"b\",le=\"0.1\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_bucket{model_name=\"a\\\"b\",le=\"1\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_bucket{model_name=\"a\\\"b\",le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_count{model_name=\"a\\\"b\"} 3\n"), std::string::npos);
  EXPECT_EQ(&m.counter("x_total", "", {{"reason", "stop"}}), &m.counter("x_total", "", {{"reason", "stop"}}));
}

}  // namespace
}  // namespace deepinfer::server
