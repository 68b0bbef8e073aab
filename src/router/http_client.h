// HttpCall: one HTTP/1.1 exchange with a backend, from the calling thread,
// with deadlines. The router runs each proxied request on a thread of its
// own, so a blocking interface is the simple one; underneath, Asio's
// asynchronous operations run on a private io_context so that every step
// (connect, send, each read) has a timeout and cancel() can stop a call from
// another thread (a client that went away).
//
// The failure kinds matter to the router: a call that failed before the
// backend sent a byte of its answer (Unreachable) never started there and
// may be retried on another backend; one that failed mid-answer (Broken)
// may have run and must not be.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer::router {

struct Url {
  std::string host;
  uint16_t port = 80;
  std::string base_path;  // without a trailing '/', may be empty

  std::string str() const;
};
// Parses http://host[:port][/base]; throws deepinfer::Error on anything else
// (https and user info are not supported: backends sit on a private network).
Url parse_url(const std::string& text);

using Headers = std::vector<std::pair<std::string, std::string>>;

struct ResponseHead {
  int status = 0;
  std::string content_type;
  bool chunked = false;
  Headers headers;  // every header but the hop-by-hop ones
};

enum class CallFailure : uint8_t { Unreachable, Broken, Cancelled };

class CallError : public Error {
 public:
  CallError(CallFailure kind, const std::string& what) : Error(what), kind_(kind) {}
  CallFailure kind() const { return kind_; }

 private:
  CallFailure kind_;
};

class HttpCall {
 public:
  struct Timeouts {
    std::chrono::milliseconds connect{2000};
    std::chrono::milliseconds send{10000};
    std::chrono::milliseconds head{600000};  // until the answer starts (a prefill may take long)
    std::chrono::milliseconds idle{600000};  // between two pieces of the body
  };

  explicit HttpCall(Url url, Timeouts timeouts);
  ~HttpCall();
  HttpCall(const HttpCall&) = delete;
  HttpCall& operator=(const HttpCall&) = delete;

  // Connects, sends the request and reads the answer's head. Throws CallError
  // (Unreachable when no byte of an answer came: not started).
  ResponseHead start(const std::string& method, const std::string& target, const std::string& body, const Headers& headers);
  // The next piece of the body (appended to `out`); false once the body is
  // complete. Throws CallError(Broken) when the connection fails first.
  bool read_some(std::string& out);
  // The rest of the body, at most max_bytes.
  std::string read_all(size_t max_bytes);
  // Thread-safe: makes the current and every later operation fail with Cancelled.
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One whole exchange (GET /health and friends): the status and body, or
// nullopt when the backend could not be reached or answered garbage.
struct SimpleResponse {
  int status = 0;
  std::string body;
};
std::optional<SimpleResponse> simple_request(const Url& url, const std::string& method, const std::string& target,
                                             const std::string& body, const Headers& headers,
                                             std::chrono::milliseconds timeout);

}  // namespace deepinfer::router
