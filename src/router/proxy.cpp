// RouterServer's proxying: a request to one backend (or to a prefill and
// then a decode backend), its answer passed back as it comes.
#include <algorithm>
#include <functional>
#include <set>

#include "core/logging.h"
#include "router/proxied_call.h"
#include "router/request_plan.h"
#include "router/router_server.h"
#include "server/api_error.h"
#include "server/protocol.h"

namespace deepinfer::router {

namespace http = boost::beast::http;
using server::Api;
using server::ApiError;

namespace {

const std::vector<double> kSecondsBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

// The headers a backend needs from the client's request.
Headers forward_headers(const server::HttpRequest::header_type& in, const std::string& backend_key) {
  Headers out{{"Content-Type", "application/json"}};
  if (!backend_key.empty()) {
    out.emplace_back("Authorization", "Bearer " + backend_key);
  } else {
    for (const char* name : {"authorization", "x-api-key"}) {
      if (auto it = in.find(name); it != in.end()) out.emplace_back(name, std::string(it->value()));
    }
  }
  for (const char* name : {"anthropic-version", "anthropic-beta"}) {
    if (auto it = in.find(name); it != in.end()) out.emplace_back(name, std::string(it->value()));
  }
  return out;
}

std::string stream_error_event(Api api, const std::string& message) {
  const std::string body = server::dump_json(server::error_body(api, 502, message, "api_error", ""));
  return api == Api::Messages ? "event: error\ndata: " + body + "\n\n" : "data: " + body + "\n\n";
}

}  // namespace

using Picker = std::function<std::optional<size_t>(const std::set<size_t>& tried)>;

namespace {

// Starts the call on the backend `pick` names, and on others while calls
// never start (refused connections, 503s). Throws ApiError 503 when no
// backend took it, 502 when one failed after taking it, CallError(Cancelled)
// when the client went away.
StartedCall start_somewhere(BackendPool& pool, const Picker& pick, const std::string& path, const std::string& body,
                        const Headers& headers, ProxiedCall& call, int max_retries, const HttpCall::Timeouts& timeouts,
                        server::Counter& retries) {
  std::set<size_t> tried;
  std::string last_problem = "no backend is up";
  for (int attempt = 0; attempt <= max_retries; ++attempt) {
    const std::optional<size_t> b = pick(tried);
    if (!b) break;
    tried.insert(*b);
    if (attempt > 0) retries.inc();
    const Url url = pool.url_of(*b);
    auto http_call = std::make_shared<HttpCall>(url, timeouts);
    call.set_current(http_call);
    pool.acquire(*b);
    std::shared_ptr<void> load(nullptr, [&pool, i = *b](void*) { pool.release(i); });
    try {
      ResponseHead head = http_call->start("POST", path, body, headers);
      if (head.status == 503) {
        // Loading, draining or overloaded: it did not start the request.
        last_problem = fmt::format("backend {} answered 503", url.str());
        continue;
      }
      return StartedCall{std::move(http_call), std::move(head), *b, std::move(load)};
    } catch (const CallError& e) {
      if (e.kind() != CallFailure::Unreachable) throw;
      pool.report_failure(*b);
      last_problem = e.what();
      log_warn("router: {}; trying another backend", e.what());
    }
  }
  throw ApiError(503, "no backend could take the request (" + last_problem + ")");
}

}  // namespace

void RouterServer::proxy(std::string path, std::string body, server::HttpRequest::header_type client_headers,
                         std::shared_ptr<server::ResponseChannel> channel) {
  auto call = std::make_shared<ProxiedCall>();
  call->channel = channel;
  call->api = path.rfind("/v1/messages", 0) == 0 ? Api::Messages : Api::Chat;
  channel->on_disconnect([weak = std::weak_ptr<ProxiedCall>(call)] {
    if (auto c = weak.lock()) c->cancel();
  });
  {
    std::lock_guard lock(mutex_);
    std::erase_if(calls_, [](const std::weak_ptr<ProxiedCall>& w) { return w.expired(); });
    calls_.push_back(call);
  }
  server::Counter& finished_ok = metrics_.counter("deepinfer_router:requests_total", "", {{"result", "ok"}});
  server::Counter& finished_err = metrics_.counter("deepinfer_router:requests_total", "", {{"result", "error"}});
  server::Counter& finished_cancel = metrics_.counter("deepinfer_router:requests_total", "", {{"result", "cancelled"}});
  try {
    const Headers headers = forward_headers(client_headers, pool_.options().api_key);
    if (is_generation_path(path)) {
      const RoutedRequest r = read_routed_request(path, body);
      call->api = r.api;
      proxy_generation(r, path, headers, *call);
    } else {
      const Picker any = [&](const std::set<size_t>& tried) -> std::optional<size_t> {
        std::vector<Candidate> c;
        for (const BackendState& b : pool_.snapshot()) {
          if (b.usable() && !tried.count(b.index)) c.push_back({b.index, b.load});
        }
        if (c.empty()) return std::nullopt;
        return whole_router_.choose(c, {}).backend;
      };
      StartedCall s = start_somewhere(pool_, any, path, body, headers, *call, options_.max_retries, options_.timeouts,
                                  metrics_.counter("deepinfer_router:retries_total", ""));
      forward_answer(s, *call, false);
    }
    finished_ok.inc();
  } catch (const CallError& e) {
    if (e.kind() == CallFailure::Cancelled) {
      finished_cancel.inc();
    } else {
      finished_err.inc();
      fail_call(*call, 502, e.what());
    }
  } catch (const ApiError& e) {
    finished_err.inc();
    fail_call(*call, e.status(), e.what());
  } catch (const std::exception& e) {
    finished_err.inc();
    log_error("router: proxying {} failed: {}", path, e.what());
    fail_call(*call, 500, "internal router error");
  }
  call->channel->on_disconnect([] {});
  {
    std::lock_guard lock(mutex_);
    in_flight_.fetch_sub(1);
  }
  done_.notify_all();
}

void RouterServer::fail_call(ProxiedCall& call, int status, const std::string& message) {
  if (!call.answered) {
    call.answered = true;
    call.channel->send(status, "application/json",
                       server::dump_json(server::error_body(call.api, status, message, ApiError::default_type(status), "")));
  } else if (call.streaming) {
    call.channel->write(stream_error_event(call.api, message));
    call.channel->end();
  }
}

void RouterServer::forward_answer(StartedCall& s, ProxiedCall& call, bool count_first_byte) {
  auto& first_byte = metrics_.histogram("deepinfer_router:time_to_first_byte_seconds", "", kSecondsBuckets);
  auto observe_first = [&] {
    if (count_first_byte) {
      first_byte.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - call.arrived).count());
    }
  };
  const bool sse = s.head.content_type.rfind("text/event-stream", 0) == 0;
  if (!sse) {
    std::string body = s.http->read_all(options_.max_answer_bytes);  // a failure here: 502 (nothing sent yet)
    observe_first();
    call.answered = true;
    call.channel->send(s.head.status, s.head.content_type.empty() ? "application/json" : s.head.content_type,
                       std::move(body), s.head.headers);
    return;
  }
  call.channel->start_stream(s.head.status, s.head.content_type);
  call.answered = true;
  call.streaming = true;
  std::string piece;
  bool first = true;
  while (s.http->read_some(piece)) {  // a failure mid-stream: an error event ends it
    if (piece.empty()) continue;
    if (first) observe_first();
    first = false;
    call.channel->write(std::move(piece));
    piece.clear();
  }
  call.channel->end();
}

void RouterServer::proxy_generation(const RoutedRequest& r, const std::string& path, const Headers& headers,
                                    ProxiedCall& call) {
  const std::vector<uint64_t> chunks = prefix_chunk_hashes(r.routing_text, options_.chunk_bytes);
  server::Counter& retries = metrics_.counter("deepinfer_router:retries_total", "");
  server::Counter& routed_chunks = metrics_.counter("deepinfer_router:routed_prefix_chunks_total", "");
  server::Counter& matched_chunks = metrics_.counter("deepinfer_router:matched_prefix_chunks_total", "");

  // The backends that serve the model asked for (any, when none is named).
  auto serves = [&](const BackendState& b) { return r.model.empty() || b.model == r.model; };
  const auto snapshot = pool_.snapshot();
  bool known = false, prefill = false, decode = false, whole = false;
  for (const BackendState& b : snapshot) {
    if (!b.known || !serves(b)) continue;
    known = true;
    if (!b.usable()) continue;
    prefill |= b.role == server::ServeRole::Prefill;
    decode |= b.role == server::ServeRole::Decode;
    whole |= b.role == server::ServeRole::Both;
  }
  const bool any_up = std::any_of(snapshot.begin(), snapshot.end(), [](const BackendState& b) { return b.usable(); });
  if (!known && !r.model.empty() && any_up) {
    throw ApiError(404, "The model `" + r.model + "` does not exist.", "model", "not_found_error");
  }
  // With no backend up at all the router cannot tell which models exist.
  if (!any_up) throw ApiError(503, "no backend is up");
  const bool disaggregate = prefill && decode;
  const server::ServeRole whole_role = whole ? server::ServeRole::Both : server::ServeRole::Decode;

  // Candidates of a role (for prefill, of the pool whose context fits), minus the tried ones.
  auto picker = [&](server::ServeRole role, bool by_length) -> Picker {
    return [&, role, by_length](const std::set<size_t>& tried) -> std::optional<size_t> {
      const auto now = pool_.snapshot();
      int64_t pool_len = -1;
      if (by_length) {
        // The smallest --max-model-len that fits the prompt (else the
        // largest): short prompts do not queue behind long ones.
        const int64_t need = estimated_prompt_tokens(r);
        int64_t smallest_fit = -1, largest = -1;
        for (const BackendState& b : now) {
          if (!b.usable() || b.role != role || !serves(b) || tried.count(b.index)) continue;
          largest = std::max(largest, b.max_model_len);
          if (b.max_model_len >= need && (smallest_fit < 0 || b.max_model_len < smallest_fit)) {
            smallest_fit = b.max_model_len;
          }
        }
        pool_len = smallest_fit >= 0 ? smallest_fit : largest;
      }
      std::vector<Candidate> c;
      for (const BackendState& b : now) {
        if (!b.usable() || b.role != role || !serves(b) || tried.count(b.index)) continue;
        if (by_length && b.max_model_len != pool_len) continue;
        c.push_back({b.index, b.load});
      }
      if (c.empty()) return std::nullopt;
      Router& router = role == server::ServeRole::Prefill ? prefill_router_
                       : role == server::ServeRole::Decode && disaggregate ? decode_router_
                                                                      : whole_router_;
      const RoutingChoice choice = router.choose(c, chunks);
      routed_chunks.inc(static_cast<double>(chunks.size()));
      matched_chunks.inc(static_cast<double>(choice.matched_chunks));
      return choice.backend;
    };
  };

  if (!disaggregate) {
    if (!whole && !decode) throw ApiError(503, "no backend is up for this model");
    StartedCall s = start_somewhere(pool_, picker(whole_role, false), path, server::dump_json(r.body), headers, call,
                                options_.max_retries, options_.timeouts, retries);
    forward_answer(s, call, true);
    return;
  }

  metrics_.counter("deepinfer_router:disaggregated_requests_total", "").inc();
  const auto prefill_start = std::chrono::steady_clock::now();
  Headers decode_headers = headers;
  {
    StartedCall p = start_somewhere(pool_, picker(server::ServeRole::Prefill, true), path, prefill_body(r), headers, call,
                                options_.max_retries, options_.timeouts, retries);
    if (p.head.status != 200) {
      // The prefill engine refused the request (too long, a bad field): the
      // decode engine would too, so its answer is the client's.
      forward_answer(p, call, true);
      return;
    }
    p.http->read_all(options_.max_answer_bytes);
    const bool exported = std::any_of(p.head.headers.begin(), p.head.headers.end(), [](const auto& h) {
      return boost::beast::iequals(h.first, "x-deepinfer-kv-exported") && h.second == "true";
    });
    metrics_.counter("deepinfer_router:kv_handoffs_total", "", {{"kv_exported", exported ? "true" : "false"}}).inc();
    // A prefill engine exporting through a shared pool names it: the decode
    // engine maps that pool to load from (a client's own header of that name
    // was not forwarded).
    for (const auto& [name, value] : p.head.headers) {
      if (boost::beast::iequals(name, "x-deepinfer-kv-source")) decode_headers.emplace_back(name, value);
    }
  }
  metrics_.histogram("deepinfer_router:prefill_seconds", "", kSecondsBuckets)
      .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count());
  StartedCall d = start_somewhere(pool_, picker(server::ServeRole::Decode, false), path, server::dump_json(r.body),
                                  decode_headers, call, options_.max_retries, options_.timeouts, retries);
  forward_answer(d, call, true);
}

}  // namespace deepinfer::router
