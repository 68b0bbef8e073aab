// The four response encoders on hand-made samples: the body and the streamed
// events of each API, including the branches a small real model rarely takes
// (reasoning, several tool calls, echo with logprobs, n > 1, engine errors).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/encoder_common.h"
#include "server/http_server.h"
#include "server/response_encoder.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {
namespace {

using ojson = nlohmann::ordered_json;

// Token i decodes to kPieces[i] (no decoder: token texts are joined as they are).
const std::vector<std::string> kPieces = {"Hel", "lo", " wor", "ld", "!"};

const Tokenizer& toy_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    nlohmann::json vocab = nlohmann::json::object();
    for (size_t i = 0; i < kPieces.size(); ++i) vocab[kPieces[i]] = i;
    const nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    return Tokenizer::from_json(j.dump());
  }();
  return *tokenizer;
}

// Keeps what was written, one entry per write.
class RecordingChannel : public ResponseChannel {
 public:
  void send(int, std::string, std::string, std::vector<std::pair<std::string, std::string>>) override {}
  void start_stream(int, std::string) override {}
  void write(std::string data) override { writes.push_back(std::move(data)); }
  void end() override {}
  void post(std::function<void()> fn) override { fn(); }
  void on_disconnect(std::function<void()>) override {}

  std::vector<std::string> writes;
};

struct Event {
  std::string name;  // "" for a data-only event
  ojson data;
};

// Splits each write into its event name and JSON data; "[DONE]" becomes a null.
std::vector<Event> events_of(const RecordingChannel& channel) {
  std::vector<Event> events;
  for (const std::string& w : channel.writes) {
    Event e;
    size_t data_at = 0;
    if (w.rfind("event: ", 0) == 0) {
      const size_t eol = w.find('\n');
      e.name = w.substr(7, eol - 7);
      data_at = eol + 1;
    }
    EXPECT_EQ(w.substr(data_at, 6), "data: ");
    EXPECT_EQ(w.substr(w.size() - 2), "\n\n");
    const std::string data = w.substr(data_at + 6, w.size() - data_at - 8);
    e.data = data == "[DONE]" ? ojson() : ojson::parse(data);
    events.push_back(std::move(e));
  }
  return events;
}

std::vector<std::string> names_of(const std::vector<Event>& events) {
  std::vector<std::string> names;
  for (const Event& e : events) names.push_back(e.name);
  return names;
}

TokenOutput token(int32_t id, float logprob) {
  TokenOutput t;
  t.token = id;
  t.logprob = logprob;
  t.top = {{id, logprob}, {(id + 1) % 5, logprob - 1.0f}};
  return t;
}

// A job's state, step by step, without an engine: what GenerationJob keeps and
// what it hands the encoder.
class EncoderTest : public ::testing::Test {
 protected:
  void make(Api api, size_t n_samples = 1, std::vector<std::string> prompt_texts = {}) {
    request_.api = api;
    samples_.assign(n_samples, SampleOutput{});
    encoder_ = make_response_encoder({request_, toy_tokenizer(), "toy", 7, std::move(prompt_texts)});
  }
  // Adds a step to sample `index` as GenerationJob does, then streams it.
  void step(size_t index, const ParsedDelta& delta, std::vector<TokenOutput> tokens = {}) {
    SampleOutput& s = samples_[index];
    for (const TokenOutput& t : tokens) {
      s.token_ids.push_back(t.token);
      s.text += kPieces[static_cast<size_t>(t.token)];
    }
    if (request_.params.logprobs) s.logprobs.insert(s.logprobs.end(), tokens.begin(), tokens.end());
    s.reasoning += delta.reasoning;
    s.content += delta.content;
    for (const ParsedToolCall& call : delta.tool_calls) {
      s.tool_calls.push_back(call);
      s.tool_call_ids.push_back(encoder_->new_tool_call_id());
    }
    encoder_->stream_delta(out_, index, s, delta, tokens);
  }
  void finish(size_t index, FinishReason reason, std::string stop_reason = {}) {
    SampleOutput& s = samples_[index];
    s.finished = true;
    s.finish = reason;
    s.stop_string = !stop_reason.empty() && reason == FinishReason::Stop;
    s.stop_reason = std::move(stop_reason);
    encoder_->stream_finish(out_, index, s);
  }

  GenerationRequest request_;
  std::vector<SampleOutput> samples_;
  std::unique_ptr<ResponseEncoder> encoder_;
  RecordingChannel channel_;
  EventStream out_{channel_};
};

ParsedDelta text(std::string content) { return {"", std::move(content), {}}; }
ParsedDelta calls(std::vector<ParsedToolCall> tool_calls) { return {"", "", std::move(tool_calls)}; }

TEST_F(EncoderTest, ChatStreamNumbersToolCallsAcrossStepsAndEndsWithUsage) {
  request_.include_usage = true;
  make(Api::Chat, 2);
  encoder_->stream_start(out_, samples_);
  step(0, {"hmm", "Hi", {}});
  step(0, calls({{"f", "{\"a\":1}"}}));
  step(0, calls({{"g", "{}"}}));
  finish(0, FinishReason::Stop);
  step(1, text("Yo"), {token(0, -0.5f)});
  finish(1, FinishReason::Length);
  encoder_->stream_end(out_, samples_);

  const std::vector<Event> ev = events_of(channel_);
  ASSERT_EQ(ev.size(), 9u);
  const std::string frame = "data: {\"id\":\"" + encoder_->id() + "\",\"object\":\"chat.completion.chunk\",\"created\":";
  EXPECT_EQ(channel_.writes[0].substr(0, frame.size()), frame);
  EXPECT_EQ(ev[0].data["choices"].size(), 2u);
  EXPECT_EQ(ev[0].data["choices"][1]["delta"], ojson({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(ev[1].data["choices"][0]["delta"], ojson({{"reasoning_content", "hmm"}, {"content", "Hi"}}));
  // Tool calls are numbered over the whole sample, not per chunk.
  const ojson& second = ev[3].data["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(second["index"], 1);
  EXPECT_EQ(second["id"], samples_[0].tool_call_ids[1]);
  EXPECT_EQ(second["function"], ojson({{"name", "g"}, {"arguments", "{}"}}));
  EXPECT_EQ(ev[4].data["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(ev[6].data["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(ev[6].data["choices"][0]["stop_reason"].is_null());
  EXPECT_EQ(ev[7].data["choices"], ojson::array());
  EXPECT_EQ(ev[7].data["usage"]["completion_tokens"], 1);
  EXPECT_EQ(channel_.writes.back(), "data: [DONE]\n\n");
}

TEST_F(EncoderTest, ChatBodyWithLogprobsToolCallsAndReasoning) {
  request_.chat_logprobs = true;
  request_.params.logprobs = 1;
  make(Api::Chat);
  step(0, {"why", "", {{"f", "{\"x\":2}"}}}, {token(2, -0.25f), token(3, -1.0f)});
  samples_[0].finish = FinishReason::Stop;
  const ojson body = encoder_->body(samples_);
  const ojson& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());  // only tool calls: no content
  EXPECT_EQ(message["reasoning_content"], "why");
  EXPECT_EQ(message["tool_calls"][0]["id"], samples_[0].tool_call_ids[0]);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  const ojson& lp = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_EQ(lp[0]["token"], " wor");
  EXPECT_EQ(lp[0]["bytes"], ojson({32, 119, 111, 114}));
  EXPECT_EQ(lp[1]["top_logprobs"][1]["token"], "!");
  EXPECT_EQ(body["usage"], ojson({{"prompt_tokens", 7}, {"completion_tokens", 2}, {"total_tokens", 9},
                                   {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
}

TEST_F(EncoderTest, CompletionsEchoWithLogprobsInTheBodyAndTheStream) {
  request_.echo = true;
  request_.params.logprobs = 1;
  make(Api::Completion, 1, {"Say: "});
  EXPECT_TRUE(encoder_->wants_raw_text());
  encoder_->stream_start(out_, samples_);  // no role chunk for completions
  EXPECT_TRUE(channel_.writes.empty());
  step(0, text("Hello"), {token(0, -0.1f), token(1, -0.2f)});
  step(0, text("!"), {token(4, -0.3f)});
  finish(0, FinishReason::Stop, "?");
  encoder_->stream_end(out_, samples_);

  const std::vector<Event> ev = events_of(channel_);
  ASSERT_EQ(ev.size(), 4u);
  // The prompt comes before the first chunk's text only; streamed offsets leave it out.
  EXPECT_EQ(ev[0].data["choices"][0]["text"], "Say: Hello");
  EXPECT_EQ(ev[0].data["choices"][0]["logprobs"]["text_offset"], ojson({0, 3}));
  EXPECT_EQ(ev[1].data["choices"][0]["text"], "!");
  EXPECT_EQ(ev[1].data["choices"][0]["logprobs"]["text_offset"], ojson({5}));
  EXPECT_EQ(ev[1].data["choices"][0]["logprobs"]["top_logprobs"][0], ojson({{"!", -0.3f}, {"Hel", -1.3f}}));
  EXPECT_EQ(ev[2].data["choices"][0]["stop_reason"], "?");
  EXPECT_TRUE(ev[3].data.is_null());  // [DONE], no usage chunk unless asked for

  // In the body the offsets count from the start of the echoed text.
  const ojson body = encoder_->body(samples_);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "Say: Hello!");
  EXPECT_EQ(body["choices"][0]["logprobs"]["tokens"], ojson({"Hel", "lo", "!"}));
  EXPECT_EQ(body["choices"][0]["logprobs"]["text_offset"], ojson({5, 8, 10}));
}

TEST_F(EncoderTest, CompletionsUsageCountsCachedPromptTokensOncePerPrompt) {
  request_.params.n = 2;
  make(Api::Completion, 4);
  for (size_t i = 0; i < samples_.size(); ++i) {
    samples_[i].prompt = i / 2;
    samples_[i].num_cached = 10 * static_cast<int32_t>(i + 1);
    samples_[i].token_ids = {0};
  }
  const TokenCounts counts = count_tokens(samples_, {request_, toy_tokenizer(), "toy", 7, {}});
  EXPECT_EQ(counts.cached, 10 + 30);
  EXPECT_EQ(counts.completion, 4);
  EXPECT_EQ(encoder_->body(samples_)["usage"]["prompt_tokens_details"]["cached_tokens"], 40);
}

TEST_F(EncoderTest, ResponsesStreamWithTextThenToolCalls) {
  make(Api::Responses);
  encoder_->stream_start(out_, samples_);
  step(0, text("Let me check."));
  step(0, calls({{"f", "{\"a\":1}"}, {"g", "{}"}}));
  finish(0, FinishReason::Stop);
  encoder_->stream_end(out_, samples_);

  const std::vector<Event> ev = events_of(channel_);
  EXPECT_EQ(names_of(ev), (std::vector<std::string>{
                              "response.created", "response.in_progress", "response.output_item.added",
                              "response.content_part.added", "response.output_text.delta",
                              "response.output_item.added", "response.function_call_arguments.done",
                              "response.output_item.done", "response.output_item.added",
                              "response.function_call_arguments.done", "response.output_item.done",
                              "response.output_text.done", "response.content_part.done", "response.output_item.done",
                              "response.completed"}));
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].data["type"], ev[i].name);
    EXPECT_EQ(ev[i].data["sequence_number"], i);
  }
  EXPECT_EQ(ev[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(ev[0].data["response"]["output"], ojson::array());
  const std::string message_id = ev[2].data["item"]["id"];
  // Function calls come after the open message item.
  EXPECT_EQ(ev[5].data["output_index"], 1);
  EXPECT_EQ(ev[8].data["output_index"], 2);
  EXPECT_EQ(ev[8].data["item"]["call_id"], samples_[0].tool_call_ids[1]);
  EXPECT_EQ(ev[9].data["item_id"], ev[8].data["item"]["id"]);
  EXPECT_EQ(ev[9].data["arguments"], "{}");
  EXPECT_EQ(ev[11].data["text"], "Let me check.");
  EXPECT_EQ(ev[13].data["item"]["status"], "completed");

  const ojson& done = ev.back().data["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["id"], message_id);
  EXPECT_EQ(done["output"][2]["call_id"], samples_[0].tool_call_ids[1]);
}

TEST_F(EncoderTest, ResponsesBodyWithReasoningAndToolCallsOnly) {
  request_.params.temperature = 0.5f;
  make(Api::Responses);
  step(0, {"think", "", {{"f", "{}"}}});
  samples_[0].finish = FinishReason::Length;
  const ojson body = encoder_->body(samples_);
  EXPECT_EQ(body["status"], "incomplete");
  EXPECT_EQ(body["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(body["temperature"], 0.5f);
  ASSERT_EQ(body["output"].size(), 2u);  // no empty message beside a tool call
  EXPECT_EQ(body["output"][0]["type"], "reasoning");
  EXPECT_EQ(body["output"][0]["content"][0]["text"], "think");
  EXPECT_EQ(body["output"][1]["type"], "function_call");
}

TEST_F(EncoderTest, AnthropicStreamOpensABlockPerKindAndPerToolCall) {
  make(Api::Messages);
  EXPECT_EQ(encoder_->new_tool_call_id().substr(0, 6), "toolu_");
  encoder_->stream_start(out_, samples_);
  step(0, {"a", "", {}}, {token(0, 0)});
  step(0, {"b", "Hi", {}}, {token(1, 0)});
  step(0, text(" there"), {token(2, 0)});
  step(0, calls({{"f", "{\"a\":1}"}, {"g", "{}"}}), {token(3, 0)});
  finish(0, FinishReason::Stop);
  encoder_->stream_end(out_, samples_);

  const std::vector<Event> ev = events_of(channel_);
  EXPECT_EQ(names_of(ev), (std::vector<std::string>{
                              "message_start", "ping", "content_block_start", "content_block_delta",
                              "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                              "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                              "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
                              "message_delta", "message_stop"}));
  EXPECT_EQ(channel_.writes[1], "event: ping\ndata: {\"type\":\"ping\"}\n\n");
  EXPECT_EQ(ev[0].data["message"]["usage"], ojson({{"input_tokens", 7}, {"output_tokens", 0},
                                                    {"cache_read_input_tokens", 0}, {"cache_creation_input_tokens", 0}}));
  EXPECT_EQ(ev[2].data["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[6].data["index"], 1);
  EXPECT_EQ(ev[8].data["delta"], ojson({{"type", "text_delta"}, {"text", " there"}}));
  EXPECT_EQ(ev[13].data["index"], 3);
  EXPECT_EQ(ev[13].data["content_block"]["id"], samples_[0].tool_call_ids[1]);
  EXPECT_EQ(ev[14].data["delta"], ojson({{"type", "input_json_delta"}, {"partial_json", "{}"}}));
  EXPECT_EQ(ev[16].data["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[16].data["usage"]["output_tokens"], 4);
}

TEST_F(EncoderTest, AnthropicBodyStopSequenceAndToolInput) {
  make(Api::Messages);
  step(0, {"", "It is", {{"f", "{\"city\":\"Oslo\"}"}, {"g", "not json"}}});
  ojson body = encoder_->body(samples_);
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_EQ(body["content"][1]["input"], ojson({{"city", "Oslo"}}));
  EXPECT_EQ(body["content"][2]["input"], ojson::object());  // arguments that are no object

  samples_[0].tool_calls.clear();
  samples_[0].stop_string = true;
  samples_[0].stop_reason = "END";
  body = encoder_->body(samples_);
  EXPECT_EQ(body["stop_reason"], "stop_sequence");
  EXPECT_EQ(body["stop_sequence"], "END");
}

TEST_F(EncoderTest, EngineErrorsInTheStreamFollowTheApi) {
  make(Api::Messages);
  encoder_->stream_error(out_, "boom");
  make(Api::Responses);
  encoder_->stream_error(out_, "boom");
  EXPECT_EQ(channel_.writes[0],
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n");
  EXPECT_EQ(channel_.writes[1], "data: {\"error\":{\"message\":\"boom\",\"type\":\"api_error\",\"code\":500}}\n\n");
}

TEST(ErrorBody, AnthropicAndOpenAiForms) {
  EXPECT_EQ(dump_json(error_body(Api::Messages, 429, "busy", "rate_limit_error")),
            R"({"type":"error","error":{"type":"rate_limit_error","message":"busy"}})");
  EXPECT_EQ(dump_json(error_body(Api::Completion, 400, "bad", "invalid_request_error", "n")),
            R"({"error":{"message":"bad","type":"invalid_request_error","param":"n","code":400}})");
  EXPECT_EQ(dump_json(error_body(Api::Chat, 503, "x", "overloaded_error")),
            R"({"error":{"message":"x","type":"overloaded_error","param":null,"code":503}})");
}

}  // namespace
}  // namespace deepinfer::server
