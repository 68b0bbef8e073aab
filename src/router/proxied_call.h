// What RouterServer keeps per proxied request (private to src/router).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>

#include "router/http_client.h"
#include "server/http_server.h"
#include "server/protocol.h"

namespace deepinfer::router {

// One proxied request: its client channel and the backend call in progress,
// so a client that goes away (or RouterServer::drain) cancels whichever call
// is running.
struct ProxiedCall {
  std::shared_ptr<server::ResponseChannel> channel;
  server::Api api = server::Api::Chat;
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  // Worker thread only: the client has a status line / a stream in progress.
  bool answered = false;
  bool streaming = false;

  void set_current(std::shared_ptr<HttpCall> c) {
    std::lock_guard lock(mutex_);
    current_ = std::move(c);
    if (cancelled_ && current_) current_->cancel();
  }
  void cancel() {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    if (current_) current_->cancel();
  }

 private:
  std::mutex mutex_;
  std::shared_ptr<HttpCall> current_;
  bool cancelled_ = false;
};

// A backend call that has its answer's head, holding its backend's load count.
struct StartedCall {
  std::shared_ptr<HttpCall> http;
  ResponseHead head;
  size_t backend = 0;
  std::shared_ptr<void> load;  // releases the backend's load count when dropped
};

}  // namespace deepinfer::router
