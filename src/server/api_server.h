// ApiServer: the request handler behind HttpServer. Routes the OpenAI- and
// Anthropic-compatible endpoints, checks the API key, and turns each generation
// into a GenerationJob. Requests with a body are parsed, validated and
// tokenised on a few request workers (never on an I/O thread, whose time must
// stay in milliseconds, nor on the engine thread); bodiless ones (/health,
// /ready, /metrics, /v1/models) are answered on the I/O thread. Every failure
// of a single request is caught here: client mistakes become 4xx with an
// error body, bugs a logged 500; the server stays up either way.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "engine/async_engine.h"
#include "server/http_server.h"
#include "server/kv_export_fence.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/request_workers.h"
#include "server/serve_role.h"

namespace deepinfer {
class PromptBuilder;
}

namespace deepinfer::server {

struct ApiServerOptions {
  std::string served_model_name;  // the name clients send and /v1/models lists
  std::string api_key;            // empty = no authentication
  RequestLimits limits;
  int request_workers = 2;      // threads that parse and tokenise requests
  size_t max_queued_requests = 64;  // waiting for a worker; beyond this, 503
  ServeRole role = ServeRole::Both;
  std::chrono::milliseconds kv_export_timeout{10000};  // Prefill: longest wait for the KV to be on disk
};

class ApiServer {
 public:
  ApiServer(AsyncEngine& engine, ApiServerOptions options);
  ~ApiServer();

  void handle(HttpRequest&& request, std::shared_ptr<ResponseChannel> channel);
  MetricsRegistry& metrics() { return metrics_; }
  std::string render_metrics();

 private:
  struct Route;
  // Routes one request and answers every failure with an error body.
  void handle_now(const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  void dispatch(const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel, Api& api_for_errors);
  void generate(Api api, const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  void tokenize(const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  void detokenize(const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  void count_tokens(const HttpRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  bool authorized(const HttpRequest& request) const;
  // The engine's prompt builder once the model is loaded; throws ApiError 503 before.
  const PromptBuilder& prompts();
  std::vector<int32_t> chat_prompt(const GenerationRequest& r);

  AsyncEngine& engine_;
  ApiServerOptions options_;
  MetricsRegistry metrics_;
  std::once_flag prompts_once_;
  std::unique_ptr<PromptBuilder> prompts_;
  int64_t started_at_ = 0;
  std::unique_ptr<KvExportFence> export_fence_;  // Prefill role only
  // Last: joined first on destruction, while what its tasks use still exists.
  RequestWorkers workers_;
};

}  // namespace deepinfer::server
