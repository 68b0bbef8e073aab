#include "router/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <charconv>

namespace deepinfer::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string Url::str() const { return "http://" + host + ":" + std::to_string(port) + base_path; }

Url parse_url(const std::string& text) {
  constexpr std::string_view kScheme = "http://";
  if (text.rfind(kScheme, 0) != 0) fail("backend URL '{}': only http://host[:port][/path] is supported", text);
  std::string_view rest = std::string_view(text).substr(kScheme.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  Url url;
  if (slash != std::string_view::npos) {
    url.base_path = std::string(rest.substr(slash));
    while (!url.base_path.empty() && url.base_path.back() == '/') url.base_path.pop_back();
  }
  if (authority.find('@') != std::string_view::npos) fail("backend URL '{}': user info is not supported", text);
  const size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']') == std::string_view::npos) {
    const std::string_view port = authority.substr(colon + 1);
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      fail("backend URL '{}': bad port '{}'", text, port);
    }
    url.port = static_cast<uint16_t>(value);
    authority = authority.substr(0, colon);
  }
  if (authority.empty()) fail("backend URL '{}': no host", text);
  url.host = std::string(authority);
  return url;
}

struct HttpCall::Impl {
  Url url;
  Timeouts timeouts;
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::buffer_body>> parser;
  std::atomic<bool> cancelled{false};
  bool finished = false;
  char chunk[16384];

  // Runs the io_context until the operation just started has completed. A
  // cancel() that came between two operations is noticed here: its posted
  // close ran before (or failed) this operation.
  void run() {
    ioc.restart();
    ioc.run();
    if (cancelled.load()) throw CallError(CallFailure::Cancelled, "cancelled");
  }
  [[noreturn]] void raise(CallFailure kind, const std::string& what, const beast::error_code& ec) {
    if (cancelled.load()) throw CallError(CallFailure::Cancelled, "cancelled");
    throw CallError(kind, fmt::format("{} {}: {}", what, url.str(), ec.message()));
  }
};

HttpCall::HttpCall(Url url, Timeouts timeouts) : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(url);
  impl_->timeouts = timeouts;
}

HttpCall::~HttpCall() = default;

void HttpCall::cancel() {
  Impl* s = impl_.get();
  s->cancelled.store(true);
  // Runs inside the call's next (or current) run(): closing fails the operation.
  asio::post(s->ioc, [s] {
    beast::error_code ec;
    s->stream.socket().close(ec);
  });
}

ResponseHead HttpCall::start(const std::string& method, const std::string& target, const std::string& body,
                             const Headers& headers) {
  Impl& s = *impl_;
  if (s.cancelled.load()) throw CallError(CallFailure::Cancelled, "cancelled");
  beast::error_code ec;
  tcp::resolver resolver(s.ioc);
  tcp::resolver::results_type endpoints;
  resolver.async_resolve(s.url.host, std::to_string(s.url.port), [&](const beast::error_code& e, tcp::resolver::results_type r) {
    ec = e;
    endpoints = std::move(r);
  });
  s.run();
  if (ec) s.raise(CallFailure::Unreachable, "resolving", ec);
  s.stream.expires_after(s.timeouts.connect);
  s.stream.async_connect(endpoints, [&](const beast::error_code& e, const tcp::endpoint&) { ec = e; });
  s.run();
  if (ec) s.raise(CallFailure::Unreachable, "connecting to", ec);

  http::request<http::string_body> req{http::string_to_verb(method), s.url.base_path + target, 11};
  req.set(http::field::host, s.url.host + ":" + std::to_string(s.url.port));
  req.set(http::field::user_agent, "deepinfer-router");
  req.set(http::field::connection, "close");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() || method == "POST") {
    req.body() = body;
    req.prepare_payload();
  }
  s.stream.expires_after(s.timeouts.send);
  http::async_write(s.stream, req, [&](const beast::error_code& e, size_t) { ec = e; });
  s.run();
  // Not sent whole: the backend cannot have started it.
  if (ec) s.raise(CallFailure::Unreachable, "sending to", ec);

  s.parser.emplace();
  s.parser->body_limit(boost::none);  // read_all() bounds what it keeps
  s.parser->header_limit(64 * 1024);
  s.stream.expires_after(s.timeouts.head);
  http::async_read_header(s.stream, s.buffer, *s.parser, [&](const beast::error_code& e, size_t) { ec = e; });
  s.run();
  // Sent, but no answer: the backend may have run it (it died mid-way).
  if (ec) s.raise(CallFailure::Broken, "reading the answer of", ec);

  const auto& msg = s.parser->get();
  ResponseHead head;
  head.status = static_cast<int>(msg.result_int());
  head.chunked = s.parser->chunked();
  for (const auto& field : msg) {
    const auto name = field.name();
    if (name == http::field::content_type) head.content_type = std::string(field.value());
    if (name == http::field::connection || name == http::field::transfer_encoding ||
        name == http::field::content_length || name == http::field::keep_alive || name == http::field::content_type ||
        name == http::field::date || name == http::field::server) {
      continue;
    }
    head.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  s.finished = s.parser->is_done();
  return head;
}

bool HttpCall::read_some(std::string& out) {
  Impl& s = *impl_;
  if (!s.parser) fail("HttpCall::read_some before start");
  if (s.finished || s.parser->is_done()) {
    s.finished = true;
    return false;
  }
  auto& body = s.parser->get().body();
  body.data = s.chunk;
  body.size = sizeof(s.chunk);
  beast::error_code ec;
  s.stream.expires_after(s.timeouts.idle);
  http::async_read_some(s.stream, s.buffer, *s.parser, [&](const beast::error_code& e, size_t) { ec = e; });
  s.run();
  if (ec == http::error::need_buffer) ec = {};
  if (ec) s.raise(CallFailure::Broken, "reading the answer of", ec);
  out.append(s.chunk, sizeof(s.chunk) - body.size);
  return true;
}

std::string HttpCall::read_all(size_t max_bytes) {
  std::string out;
  while (read_some(out)) {
    if (out.size() > max_bytes) {
      throw CallError(CallFailure::Broken, fmt::format("the answer of {} exceeds {} bytes", impl_->url.str(), max_bytes));
    }
  }
  return out;
}

std::optional<SimpleResponse> simple_request(const Url& url, const std::string& method, const std::string& target,
                                             const std::string& body, const Headers& headers,
                                             std::chrono::milliseconds timeout) {
  HttpCall::Timeouts t{timeout, timeout, timeout, timeout};
  HttpCall call(url, t);
  try {
    const ResponseHead head = call.start(method, target, body, headers);
    return SimpleResponse{head.status, call.read_all(size_t{1} << 20)};
  } catch (const CallError&) {
    return std::nullopt;
  }
}

}  // namespace deepinfer::router
