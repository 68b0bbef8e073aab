// ResponseEncoder: how one generation API writes its answer. GenerationJob runs
// the samples and keeps what they produced (SampleOutput); the encoder turns
// that into the API's wire form: one JSON body, or server-sent events while the
// samples run. One implementation per API (encoder_chat, encoder_completions,
// encoder_responses, encoder_anthropic), picked once per request by
// make_response_encoder(). Encoders never touch the engine.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/output_parser.h"
#include "server/protocol.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::server {

class ResponseChannel;

// What one sample (a "choice") has produced so far.
struct SampleOutput {
  size_t prompt = 0;  // which of the request's prompts it continues
  std::string text;   // raw generated text, before reasoning and tool calls are split out
  std::vector<int32_t> token_ids;
  std::vector<TokenOutput> logprobs;  // kept only when the request asked for logprobs
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  std::vector<std::string> tool_call_ids;  // one per tool call: the stream and the body name a call alike
  FinishReason finish = FinishReason::None;
  std::string stop_reason;  // the matched stop string, if any
  bool finished = false;
  bool stop_string = false;  // stopped by a stop string (not EOS / stop token)
  int32_t num_cached = 0;    // prompt tokens found in the prefix cache
};

// Server-sent events on a started chunked response. Each event is one write,
// hence one HTTP chunk, so the client sees it as soon as it is made.
class EventStream {
 public:
  explicit EventStream(ResponseChannel& channel) : channel_(channel) {}
  // An "event:" line, then the data (Responses and Anthropic name their events).
  void named(const std::string& event, const nlohmann::ordered_json& data);
  // The data line alone (OpenAI chat and completions chunks).
  void data(const nlohmann::ordered_json& data);
  // OpenAI's end-of-stream sentinel.
  void done();

 private:
  ResponseChannel& channel_;
};

// What an encoder needs besides the samples. The request and the tokenizer must
// outlive the encoder (GenerationJob owns all three).
struct EncoderContext {
  const GenerationRequest& request;
  const Tokenizer& tokenizer;  // token texts for logprobs
  std::string model_name;
  int64_t prompt_tokens = 0;              // over all prompts, for usage
  std::vector<std::string> prompt_texts;  // completions with echo: the prompts as text
};

class ResponseEncoder {
 public:
  virtual ~ResponseEncoder() = default;

  // The response's id; log lines about the request name it too.
  const std::string& id() const { return id_; }
  // An id for a tool call the model just made.
  virtual std::string new_tool_call_id() const;
  // Completions answer with the raw text; the other APIs want reasoning and
  // tool calls split out of it.
  virtual bool wants_raw_text() const { return false; }

  // The whole answer of a request that is not streamed.
  virtual nlohmann::ordered_json body(std::span<const SampleOutput> samples) const = 0;

  // Streaming, once the headers are out: before any token,
  virtual void stream_start(EventStream& out, std::span<const SampleOutput> samples) = 0;
  // for each step of sample `index` (`delta`, parsed from `tokens`, is already
  // part of `sample`),
  virtual void stream_delta(EventStream& out, size_t index, const SampleOutput& sample, const ParsedDelta& delta,
                            const std::vector<TokenOutput>& tokens) = 0;
  // when sample `index` has finished,
  virtual void stream_finish(EventStream& out, size_t index, const SampleOutput& sample) = 0;
  // and when all have.
  virtual void stream_end(EventStream& out, std::span<const SampleOutput> samples) = 0;
  // The engine failed the request after the headers went out: the error goes
  // in the stream (as vLLM does); the job ends the stream after it.
  virtual void stream_error(EventStream& out, const std::string& message) const;

 protected:
  ResponseEncoder(EncoderContext context, const char* id_prefix);
  // OpenAI chat and completions: the frame of their objects and stream chunks,
  nlohmann::ordered_json openai_frame(const char* object, nlohmann::ordered_json choices) const;
  // and the end of their streams (a usage chunk if the client asked for one, then [DONE]).
  void end_openai_stream(EventStream& out, const char* chunk_object, std::span<const SampleOutput> samples) const;

  EncoderContext ctx_;
  std::string id_;
  int64_t created_ = 0;  // Unix seconds
};

std::unique_ptr<ResponseEncoder> make_response_encoder(EncoderContext context);

}  // namespace deepinfer::server
