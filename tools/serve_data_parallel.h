// `serve --data-parallel-size N`: every rank's engine serves the API on a
// port of its own (any free one), and rank 0 also runs the router
// (src/router, cache-aware: prefix affinity within a load budget) on the
// public --host/--port in front of all of them. The ranks' URLs travel over
// the group's control channel once the engines are built, before their
// first step.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/http_server.h"

namespace deepinfer {
class Engine;
namespace router {
class BackendPool;
class RouterServer;
}  // namespace router
}  // namespace deepinfer

namespace deepinfer::cli {

class DataParallelFront {
 public:
  // public_http: where clients connect (rank 0's router); advertised_host:
  // the host part of this rank's own URL, as rank 0 reaches it; api_key:
  // serve's --api-key, which the router then requires too (its admin
  // endpoints included) and sends to the ranks.
  // The exchange waits up to `timeout` for this rank's server to listen.
  DataParallelFront(server::HttpServerOptions public_http, std::string advertised_host, std::string api_key,
                    std::chrono::milliseconds timeout);
  ~DataParallelFront();

  // For AsyncEngineOptions::on_loaded: waits for own_port_known(), then
  // gathers every rank's URL on every rank.
  void exchange(Engine& engine);
  // This rank's API server listens: its port.
  void own_port_known(int port);
  // Rank 0, from the main thread: starts the router once the URLs are in.
  // True while it runs.
  bool start_router_when_ready();
  // Rank 0, once the router runs: the port it listens on (the public one).
  int public_port() const;
  // Rank 0: no new connections, then up to `timeout` for the proxied requests.
  void stop(std::chrono::milliseconds timeout);

 private:
  server::HttpServerOptions public_http_;
  std::string advertised_host_;
  std::string api_key_;
  std::chrono::milliseconds timeout_;
  std::promise<int> port_;
  std::shared_future<int> port_future_;
  std::mutex mutex_;
  std::optional<std::vector<std::string>> urls_;  // on rank 0, once exchanged
  std::unique_ptr<router::BackendPool> pool_;
  std::unique_ptr<router::RouterServer> router_;
  std::unique_ptr<server::HttpServer> server_;
};

}  // namespace deepinfer::cli
