// GenerationJob: one API request in flight. It submits the request's samples to
// the AsyncEngine, receives their outputs on the connection's strand, parses
// them (reasoning, tool calls) and answers in the API's own format: one JSON
// body, or server-sent events (OpenAI chunks / Responses events / Anthropic
// events). A client that disconnects aborts all of the job's samples.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "server/http_server.h"
#include "server/output_parser.h"
#include "server/protocol.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::server {

class Counter;
class Histogram;

// What jobs record into /metrics.
struct JobMetrics {
  Histogram* ttft = nullptr;
  Histogram* inter_token = nullptr;
  Histogram* e2e = nullptr;
  Histogram* queue_time = nullptr;
  Counter* success_stop = nullptr;
  Counter* success_length = nullptr;
  Counter* success_abort = nullptr;
  Counter* rejected = nullptr;
};

struct JobContext {
  AsyncEngine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::string model_name;
  ToolCallFormat tool_format = ToolCallFormat::None;
  bool reasoning = false;
  JobMetrics metrics;
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  // prompts: the token ids of each prompt (one for chat-style APIs); texts: the
  // prompt texts for echo (completions), may be empty.
  GenerationJob(JobContext context, GenerationRequest request, std::vector<std::vector<int32_t>> prompts,
                std::vector<std::string> prompt_texts, std::shared_ptr<ResponseChannel> channel);
  ~GenerationJob();

  // Submits the samples; answers 429 / 503 at once when the engine refuses them.
  void start();

 private:
  struct Choice;
  void on_event(size_t index, EngineEvent ev);
  void on_all_finished();
  void abort_all();
  void emit_stream_start();
  void emit_stream_delta(size_t index, const ParsedDelta& delta, const std::vector<TokenOutput>& tokens);
  void emit_stream_finish(size_t index);
  void send_error(int status, const std::string& message, const std::string& type);
  void sse(const std::string& event, const nlohmann::ordered_json& data);
  nlohmann::ordered_json usage_json() const;
  nlohmann::ordered_json final_body() const;
  nlohmann::ordered_json chat_logprobs(const std::vector<TokenOutput>& tokens) const;
  nlohmann::ordered_json completion_logprobs(const std::vector<TokenOutput>& tokens, size_t text_offset) const;
  std::string token_text(int32_t id) const;

  JobContext ctx_;
  GenerationRequest request_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::string> prompt_texts_;
  std::shared_ptr<ResponseChannel> channel_;
  std::vector<Choice> choices_;
  std::vector<uint64_t> engine_ids_;
  std::string id_;
  int64_t created_ = 0;
  size_t remaining_ = 0;
  bool failed_ = false;
  int32_t cached_tokens_ = 0;
  int64_t sequence_ = 0;  // Responses event numbering
  // Anthropic / Responses streaming: the open content block.
  int32_t block_index_ = -1;
  std::string block_type_;
  std::string message_item_id_;
  std::string streamed_text_;
  int32_t output_index_ = 0;
};

std::string random_id(const std::string& prefix);

}  // namespace deepinfer::server
