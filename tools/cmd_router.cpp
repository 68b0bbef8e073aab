// `deepinfer router`: an OpenAI- and Anthropic-compatible front door over
// several `deepinfer serve` backends (docs/router.md). It learns each
// backend's role and model from the backend, routes by prefix affinity and
// load, runs disaggregated requests (prefill backend, then decode backend)
// when both kinds are up, and passes answers through as they stream.
// SIGTERM/SIGINT: no new connections, requests in flight finish for up to
// --shutdown-timeout, the rest are cancelled.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <thread>

#include "command.h"
#include "core/logging.h"
#include "router/backend_pool.h"
#include "router/etcd.h"
#include "router/router_server.h"
#include "server/http_server.h"

namespace deepinfer::cli {
namespace {

int run_router(int argc, char** argv) {
  CLI::App app{"Route OpenAI/Anthropic API requests across deepinfer serve backends."};
  app.name("deepinfer router");
  server::HttpServerOptions http;
  router::RouterOptions opts;
  router::BackendPool::Options pool_opts;
  std::vector<std::string> backends;
  std::string policy = "cache_aware";
  double health_interval = 1.0, shutdown_timeout = 30;
  int io_threads = 2;
  app.add_option("--host", http.host, "address to listen on");
  app.add_option("--port", http.port, "port to listen on (0 = any free port)");
  app.add_option("--backend", backends, "a backend's URL, http://host:port (repeat for each)");
  std::string etcd;
  app.add_option("--etcd", etcd,
                 "find the backends in etcd (http://host:2379), where `serve --etcd` registers them; listed again "
                 "every --health-interval");
  app.add_option("--policy", policy, "cache_aware (prefix affinity within a load budget), least_load or round_robin")
      ->check(CLI::IsMember({"cache_aware", "least_load", "round_robin"}));
  app.add_option("--balance-abs", opts.balance_abs,
                 "cache_aware: requests in flight over the least loaded backend that affinity may cost")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-retries", opts.max_retries, "other backends tried for a request that never started")
      ->check(CLI::Range(0, 64));
  app.add_option("--max-concurrency", opts.max_concurrency, "requests proxied at once (503 beyond)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--health-interval", health_interval, "seconds between health checks of each backend")
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--api-key", opts.api_key, "require this key from clients (Authorization: Bearer, or x-api-key)");
  app.add_option("--backend-api-key", pool_opts.api_key,
                 "send this key to the backends (default: pass the client's own key through)");
  app.add_option("--shutdown-timeout", shutdown_timeout, "seconds to let requests finish on SIGTERM")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--io-threads", io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  http.io_threads = io_threads;
  http.body_limit = uint64_t{64} << 20;
  opts.policy = router::parse_routing_policy(policy);
  pool_opts.interval = std::chrono::milliseconds(static_cast<int64_t>(health_interval * 1000));
  if (backends.empty() && etcd.empty()) {
    log_error("router: give the backends (--backend URL ...) or where to find them (--etcd URL)");
    return 2;
  }
  std::vector<router::Url> urls;
  std::shared_ptr<router::EtcdClient> etcd_client;
  try {
    for (const std::string& b : backends) urls.push_back(router::parse_url(b));
    if (!etcd.empty()) {
      etcd_client = std::make_shared<router::EtcdClient>(router::parse_url(etcd), std::chrono::milliseconds(2000));
      // Static backends stay members whatever etcd lists.
      pool_opts.discover = [etcd_client, backends]() -> std::optional<std::vector<std::string>> {
        auto urls = router::list_etcd_backends(*etcd_client);
        if (urls) urls->insert(urls->end(), backends.begin(), backends.end());
        return urls;
      };
    }
  } catch (const Error& e) {
    log_error("router: {}", e.what());
    return 2;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  router::BackendPool pool(std::move(urls), pool_opts);
  router::RouterServer router_server(pool, opts);
  pool.start();
  server::HttpServer server(http, [&router_server](server::HttpRequest&& r, std::shared_ptr<server::ResponseChannel> ch) {
    router_server.handle(std::move(r), std::move(ch));
  });
  server.start();
  log_info("router: listening on http://{}:{} over {} backend(s){}, policy {}", http.host, server.port(), pool.size(),
           etcd.empty() ? "" : " found in etcd " + etcd, policy);
  for (;;) {
    const int sig = sigwaitinfo(&signals, nullptr);
    if (sig == SIGTERM || sig == SIGINT) break;
  }
  log_info("router: stopping; requests in flight get up to {} s", shutdown_timeout);
  server.stop_accepting();
  router_server.drain(std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout * 1000)));
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.active_responses() > 0 && std::chrono::steady_clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server.stop();
  pool.stop();
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("router", "route API requests across serve backends (cache-aware, prefill/decode disaggregation)",
                  run_router);

}  // namespace deepinfer::cli
