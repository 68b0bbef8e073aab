// GenerationJob: one API request in flight. It submits the request's samples to
// the AsyncEngine, receives their outputs on the connection's strand, parses
// them (reasoning, tool calls) and records metrics; the request's
// ResponseEncoder writes the answer in the API's own format (one JSON body, or
// server-sent events). A client that disconnects aborts all of the job's
// samples.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "server/http_server.h"
#include "server/output_parser.h"
#include "server/protocol.h"
#include "server/response_encoder.h"

namespace deepinfer {
class KvTiers;
class Tokenizer;
}

namespace deepinfer::server {

class Counter;
class Histogram;
class KvExportFence;

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
  // `serve --role prefill`: the answer waits until the request's KV is in the
  // shared directory (both set, or neither).
  KvExportFence* export_fence = nullptr;
  const KvTiers* export_tiers = nullptr;
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
  // Per sample, what only the job reads: its parser and when its last token came.
  struct SampleProgress {
    OutputParser parser;
    Clock::time_point last_token{};
  };
  void on_event(size_t index, EngineEvent ev);
  void record_token_gap(SampleProgress& progress, const EngineEvent& ev);
  void record_finish(const SampleOutput& sample, const EngineEvent& ev);
  void on_all_finished();
  // The success answer; kv_exported: the export fence's verdict (prefill role).
  void send_result(std::optional<bool> kv_exported);
  void abort_all();
  void send_error(int status, const std::string& message, const std::string& type);

  JobContext ctx_;
  GenerationRequest request_;
  std::vector<std::vector<int32_t>> prompts_;
  std::shared_ptr<ResponseChannel> channel_;
  EventStream events_;
  std::unique_ptr<ResponseEncoder> encoder_;
  std::vector<SampleOutput> samples_;
  std::vector<SampleProgress> progress_;
  std::vector<uint64_t> engine_ids_;
  size_t remaining_ = 0;
  bool failed_ = false;
  std::string failure_;  // the first sample's engine error
};

}  // namespace deepinfer::server
