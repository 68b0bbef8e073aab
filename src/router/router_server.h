// RouterServer: the front door of `deepinfer router`. It answers the OpenAI-
// and Anthropic-compatible endpoints by passing each request to a backend
// and the backend's answer (one body, or a stream of server-sent events)
// back, piece by piece as it comes.
//
//   whole requests    to a `both` backend (or a decode one when no `both`
//                     exists), chosen by the routing policy;
//   disaggregated     when prefill and decode backends are up: the prompt
//                     to a prefill backend of the smallest pool (backends of
//                     equal --max-model-len) that fits its length, which
//                     answers once the prompt's KV is in the shared
//                     directory; then the request to a decode backend, which
//                     finds that KV there and generates.
//
// A call that never started on its backend (connection refused, the backend
// answered 503 because it is loading or draining) is tried again on another
// one, up to --max-retries times; a call that had reached its backend is
// never repeated: when that backend fails, the client gets a clean error (an
// error body, or an error event ending the stream). A client that goes away
// cancels the backend call, and so the generation.
//
// Each proxied request runs on a thread of its own (blocking calls with
// deadlines, see http_client.h), at most --max-concurrency at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "router/backend_pool.h"
#include "router/routing_policy.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace deepinfer::router {

struct ProxiedCall;
struct RoutedRequest;
struct StartedCall;

struct RouterOptions {
  RoutingPolicy policy = RoutingPolicy::CacheAware;
  int64_t balance_abs = 16;      // cache_aware: requests over the least loaded backend that affinity may cost
  size_t chunk_bytes = 64;       // routing-text chunk for prefix affinity
  size_t affinity_capacity = size_t{1} << 18;  // chunks remembered per backend
  int max_retries = 3;           // other backends tried for a call that never started
  size_t max_concurrency = 4096; // proxied requests at once; beyond, 503
  size_t max_answer_bytes = size_t{64} << 20;  // a non-streamed answer
  std::string api_key;           // the router's own (empty: none)
  HttpCall::Timeouts timeouts;
};

class RouterServer {
 public:
  RouterServer(BackendPool& pool, RouterOptions options);
  ~RouterServer();

  void handle(server::HttpRequest&& request, std::shared_ptr<server::ResponseChannel> channel);
  // Requests being proxied now.
  size_t in_flight() const { return in_flight_.load(); }
  // Waits up to `timeout` for the proxied requests to end, then cancels the rest.
  void drain(std::chrono::milliseconds timeout);

 private:
  void proxy(std::string path, std::string body, server::HttpRequest::header_type headers,
             std::shared_ptr<server::ResponseChannel> channel);
  void proxy_generation(const RoutedRequest& r, const std::string& path, const Headers& headers, ProxiedCall& call);
  // Passes a started call's answer to the client (count_first_byte: into the
  // time-to-first-byte histogram). Throws CallError when the backend fails.
  void forward_answer(StartedCall& s, ProxiedCall& call, bool count_first_byte);
  // The client's error: an error body, or an error event ending its stream.
  void fail_call(ProxiedCall& call, int status, const std::string& message);
  void answer_admin(const server::HttpRequest& r, std::string_view path, const std::shared_ptr<server::ResponseChannel>& ch);
  std::string render_metrics();
  bool authorized(const server::HttpRequest& r) const;

  BackendPool& pool_;
  RouterOptions options_;
  // One per role (prefill, decode, whole requests): each pool rotates and
  // remembers prefixes on its own.
  Router prefill_router_, decode_router_, whole_router_;
  server::MetricsRegistry metrics_;
  std::atomic<size_t> in_flight_{0};
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::weak_ptr<ProxiedCall>> calls_;  // for drain(): cancelled at its timeout
};

}  // namespace deepinfer::router
