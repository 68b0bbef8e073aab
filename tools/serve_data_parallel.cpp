#include "serve_data_parallel.h"

#include <fmt/format.h>

#include <thread>

#include "core/error.h"
#include "core/logging.h"
#include "dist/gloo_communicator.h"
#include "engine/engine.h"
#include "router/backend_pool.h"
#include "router/router_server.h"

namespace deepinfer::cli {

DataParallelFront::DataParallelFront(server::HttpServerOptions public_http, std::string advertised_host,
                                     std::string api_key, std::chrono::milliseconds timeout)
    : public_http_(std::move(public_http)),
      advertised_host_(std::move(advertised_host)),
      api_key_(std::move(api_key)),
      timeout_(timeout),
      port_future_(port_.get_future().share()) {}

DataParallelFront::~DataParallelFront() {
  if (server_) server_->stop();
  if (pool_) pool_->stop();
}

void DataParallelFront::own_port_known(int port) { port_.set_value(port); }

void DataParallelFront::exchange(Engine& engine) {
  const std::optional<Engine::DataParallelRank> dp = engine.data_parallel();
  DI_CHECK(dp.has_value(), "serve: a data-parallel front without a data-parallel engine");
  DI_CHECK(port_future_.wait_for(timeout_) == std::future_status::ready,
           "serve: data-parallel rank {}: its API server did not start", dp->rank);
  const std::string mine = fmt::format("http://{}:{}", advertised_host_, port_future_.get());
  const auto all = dp->control->all_gather_bytes(std::vector<uint8_t>(mine.begin(), mine.end()));
  log_info("serve: data-parallel rank {} of {} serves at {}", dp->rank, dp->size, mine);
  if (dp->rank != 0) return;
  std::lock_guard lock(mutex_);
  urls_.emplace();
  for (const std::vector<uint8_t>& url : all) urls_->emplace_back(url.begin(), url.end());
}

bool DataParallelFront::start_router_when_ready() {
  if (server_) return true;
  std::vector<router::Url> urls;
  {
    std::lock_guard lock(mutex_);
    if (!urls_) return false;
    for (const std::string& u : *urls_) urls.push_back(router::parse_url(u));
  }
  router::BackendPool::Options pool_options;
  // The ranks turn ready moments after the exchange: look again soon.
  pool_options.interval = std::chrono::milliseconds(500);
  pool_options.api_key = api_key_;
  const size_t n = urls.size();
  pool_ = std::make_unique<router::BackendPool>(std::move(urls), pool_options);
  router::RouterOptions router_options;
  router_options.api_key = api_key_;
  router_ = std::make_unique<router::RouterServer>(*pool_, router_options);
  pool_->start();
  server::HttpServerOptions http = public_http_;
  http.body_limit = std::max<uint64_t>(http.body_limit, uint64_t{64} << 20);
  server_ = std::make_unique<server::HttpServer>(
      http, [this](server::HttpRequest&& r, std::shared_ptr<server::ResponseChannel> ch) {
        router_->handle(std::move(r), std::move(ch));
      });
  server_->start();
  log_info("serve: listening on http://{}:{}, routing over the {} data-parallel ranks", public_http_.host,
           server_->port(), n);
  return true;
}

int DataParallelFront::public_port() const { return server_ ? server_->port() : 0; }

void DataParallelFront::stop(std::chrono::milliseconds timeout) {
  if (!server_) return;
  server_->stop_accepting();
  router_->drain(timeout);
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server_->active_responses() > 0 && std::chrono::steady_clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server_->stop();
  pool_->stop();
}

}  // namespace deepinfer::cli
