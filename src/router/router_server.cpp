#include "router/router_server.h"

#include <algorithm>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "core/logging.h"
#include "router/proxied_call.h"
#include "router/request_plan.h"
#include "server/api_error.h"
#include "server/protocol.h"

namespace deepinfer::router {

namespace http = boost::beast::http;
using server::Api;
using server::ApiError;
using server::ResponseChannel;

namespace {

std::string_view path_of(const server::HttpRequest& r) {
  std::string_view t(r.target().data(), r.target().size());
  return t.substr(0, t.find('?'));
}

Api api_of(std::string_view path) { return path.rfind("/v1/messages", 0) == 0 ? Api::Messages : Api::Chat; }

void send_error(const std::shared_ptr<ResponseChannel>& ch, Api api, int status, const std::string& message,
                const std::string& type) {
  ch->send(status, "application/json", server::dump_json(server::error_body(api, status, message, type, "")));
}

bool is_proxied_path(std::string_view p) {
  return is_generation_path(p) || p == "/v1/messages/count_tokens" || p == "/tokenize" || p == "/detokenize";
}

}  // namespace

RouterServer::RouterServer(BackendPool& pool, RouterOptions options)
    : pool_(pool),
      options_(std::move(options)),
      prefill_router_(options_.policy, options_.balance_abs, options_.affinity_capacity),
      decode_router_(options_.policy, options_.balance_abs, options_.affinity_capacity),
      whole_router_(options_.policy, options_.balance_abs, options_.affinity_capacity) {
  pool_.on_recovered([this](size_t i) {
    for (Router* r : {&prefill_router_, &decode_router_, &whole_router_}) r->forget_backend(i);
  });
  render_metrics();
}

RouterServer::~RouterServer() { drain(std::chrono::milliseconds(0)); }

void RouterServer::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!done_.wait_for(lock, timeout, [&] { return in_flight_.load() == 0; })) {
    for (auto& weak : calls_) {
      if (auto c = weak.lock()) c->cancel();
    }
    done_.wait(lock, [&] { return in_flight_.load() == 0; });
  }
}

bool RouterServer::authorized(const server::HttpRequest& r) const {
  if (options_.api_key.empty()) return true;
  if (auto it = r.find(http::field::authorization); it != r.end() && it->value() == "Bearer " + options_.api_key) {
    return true;
  }
  auto it = r.find("x-api-key");
  return it != r.end() && it->value() == options_.api_key;
}

void RouterServer::handle(server::HttpRequest&& r, std::shared_ptr<ResponseChannel> ch) {
  const std::string path(path_of(r));
  const Api api = api_of(path);
  try {
    if (r.method() == http::verb::post && is_proxied_path(path)) {
      if (!authorized(r)) throw ApiError(401, "invalid or missing API key");
      if (in_flight_.fetch_add(1) >= options_.max_concurrency) {
        in_flight_.fetch_sub(1);
        throw ApiError(503, "the router is at --max-concurrency; retry later");
      }
      std::string body = std::move(r.body());
      server::HttpRequest::header_type headers = r.base();
      try {
        std::thread([this, path, body = std::move(body), headers = std::move(headers), ch]() mutable {
          proxy(path, std::move(body), std::move(headers), ch);
        }).detach();
      } catch (const std::system_error&) {
        in_flight_.fetch_sub(1);  // no thread: the request is refused, not lost track of
        throw ApiError(503, "the router cannot start another request now; retry later");
      }
      return;
    }
    answer_admin(r, path, ch);
  } catch (const ApiError& e) {
    send_error(ch, api, e.status(), e.what(), e.type());
  } catch (const std::exception& e) {
    log_error("router: {} {}: {}", std::string(r.method_string()), path, e.what());
    send_error(ch, api, 500, "internal router error", "api_error");
  }
}

void RouterServer::answer_admin(const server::HttpRequest& r, std::string_view path,
                                const std::shared_ptr<ResponseChannel>& ch) {
  const bool get = r.method() == http::verb::get;
  const auto snapshot = pool_.snapshot();
  // /ready as well: the probe a `serve` answers, for a router in its place.
  if (path == "/health" || path == "/ready") {
    const bool any = std::any_of(snapshot.begin(), snapshot.end(), [](const BackendState& b) { return b.usable(); });
    if (!any) throw ApiError(503, "no backend is up");
    ch->send(200, "application/json", "{}");
    return;
  }
  if (path == "/metrics" && get) {
    ch->send(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics());
    return;
  }
  if (!authorized(r)) throw ApiError(401, "invalid or missing API key");
  if (path == "/v1/models" && get) {
    std::set<std::string> models;
    nlohmann::ordered_json data = nlohmann::ordered_json::array();
    for (const BackendState& b : snapshot) {
      if (!b.usable() || !models.insert(b.model).second) continue;
      data.push_back({{"id", b.model}, {"object", "model"}, {"owned_by", "deepinfer"}, {"root", b.model}});
    }
    ch->send(200, "application/json", server::dump_json({{"object", "list"}, {"data", data}}));
    return;
  }
  if (path == "/server_info" && get) {
    // The pool as one engine, for a router in front of this one (a
    // data-parallel group registered in etcd): ready with any backend up, the
    // backends' model and the smallest max-model-len among them.
    std::optional<BackendState> first;
    int64_t max_len = 0;
    bool same_role = true;
    for (const BackendState& b : snapshot) {
      if (!b.usable()) continue;
      if (!first) first = b;
      same_role = same_role && b.role == first->role;
      max_len = max_len == 0 ? b.max_model_len : std::min(max_len, b.max_model_len);
    }
    nlohmann::ordered_json info = {
        {"role", server::serve_role_name(first && same_role ? first->role : server::ServeRole::Both)},
        {"model", first ? first->model : ""},
        {"ready", first.has_value()}};
    if (first) info["max_model_len"] = max_len;
    ch->send(200, "application/json", server::dump_json(info));
    return;
  }
  if (path == "/router/backends" && get) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const BackendState& b : snapshot) {
      list.push_back({{"url", b.url.str()}, {"role", server::serve_role_name(b.role)}, {"model", b.model},
                      {"max_model_len", b.max_model_len}, {"healthy", b.healthy}, {"draining", b.draining},
                      {"in_flight", b.load}});
    }
    ch->send(200, "application/json",
             server::dump_json({{"policy", routing_policy_name(options_.policy)}, {"backends", list}}));
    return;
  }
  if ((path == "/router/drain" || path == "/router/undrain") && r.method() == http::verb::post) {
    const auto body = server::parse_json_body(r.body(), 8);
    const auto url = body.is_object() && body.contains("url") && body["url"].is_string() ? body["url"].get<std::string>() : "";
    const auto index = pool_.find(url);
    if (!index) throw ApiError(404, "no backend '" + url + "'");
    pool_.set_draining(*index, path == "/router/drain");
    log_info("router: backend {} {}", url, path == "/router/drain" ? "draining (no new requests)" : "taking requests again");
    ch->send(200, "application/json", "{}");
    return;
  }
  throw ApiError(404, "no route " + std::string(r.method_string()) + " " + std::string(path));
}

std::string RouterServer::render_metrics() {
  std::string out = metrics_.render();
  // Per-backend gauges (the registry's gauges carry no labels).
  out += "# TYPE deepinfer_router:backend_up gauge\n# TYPE deepinfer_router:backend_in_flight gauge\n";
  for (const BackendState& b : pool_.snapshot()) {
    const std::string labels = fmt::format("backend=\"{}\",role=\"{}\"", server::escape_label_value(b.url.str()),
                                           server::serve_role_name(b.role));
    out += fmt::format("deepinfer_router:backend_up{{{}}} {}\n", labels, b.usable() ? 1 : 0);
    out += fmt::format("deepinfer_router:backend_in_flight{{{}}} {}\n", labels, b.load);
  }
  return out;
}

}  // namespace deepinfer::router
