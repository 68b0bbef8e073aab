// HttpServer: HTTP/1.1 on Boost.Beast/Asio with a small pool of I/O threads.
// Each connection is a session on its own strand; requests are read with a body
// limit and a read deadline, keep-alive is honoured, and a handler answers either
// with one complete response or with a chunked stream (server-sent events).
// While a response is pending the session keeps reading, so a client that goes
// away is noticed at once and the handler's disconnect callback runs (the
// server aborts the generation).
#pragma once

#include <boost/beast/http.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace deepinfer::server {

namespace http = boost::beast::http;
using HttpRequest = http::request<http::string_body>;

// How a handler answers. Every method is thread-safe (it is posted to the
// connection's strand) and may be called after the client went away (then it
// does nothing).
class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  // A complete response.
  virtual void send(int status, std::string content_type, std::string body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // Starts a chunked response; then write() any number of times and end() once.
  virtual void start_stream(int status, std::string content_type) = 0;
  virtual void write(std::string data) = 0;
  virtual void end() = 0;
  // Runs `fn` on the connection's strand (handlers keep per-request state there).
  virtual void post(std::function<void()> fn) = 0;
  // Called once, on the strand, if the client disconnects before the response ends.
  virtual void on_disconnect(std::function<void()> fn) = 0;
};

using RequestHandler = std::function<void(HttpRequest&& request, std::shared_ptr<ResponseChannel> channel)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  int io_threads = 2;
  uint64_t body_limit = 8u << 20;      // bytes; larger bodies get 413
  uint32_t header_limit = 64u << 10;   // bytes
  double read_timeout_s = 30;          // to receive one whole request
  double keep_alive_timeout_s = 60;    // idle between requests
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, RequestHandler handler);
  ~HttpServer();

  // Binds and listens (throws deepinfer::Error when it cannot), then starts the I/O threads.
  void start();
  uint16_t port() const { return port_; }
  // Closes the listening socket: new connections are refused from now on.
  void stop_accepting();
  // Responses still being produced or written.
  size_t active_responses() const { return active_->load(); }
  // Stops the I/O threads (open connections are dropped) and joins them.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  HttpServerOptions options_;
  uint16_t port_ = 0;
  std::shared_ptr<std::atomic<size_t>> active_;
};

}  // namespace deepinfer::server
