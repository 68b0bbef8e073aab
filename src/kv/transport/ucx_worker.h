// UcxWorker: one UCX context and worker (the UCP layer, active messages)
// driven by a thread of its own. Every UCX call on the worker happens on
// that thread: other threads hand it work with post(). The thread sleeps on
// the worker's event descriptor, so an idle transport costs nothing.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace deepinfer {

// Throws Error naming `what` when a UCX call failed.
void check_ucx(ucs_status_t status, const char* what);

class UcxWorker {
 public:
  // name: for the logs. Throws Error when UCX cannot start.
  explicit UcxWorker(std::string name);
  // Stops the thread (after running on_stop there, if set) and frees the worker and context.
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h worker() const { return worker_; }
  // Runs fn on the worker thread, soon. Thread-safe.
  void post(std::function<void()> fn);
  // Called on the worker thread about every 50 ms (timeouts).
  void set_tick(std::function<void()> fn) { tick_ = std::move(fn); }
  // Runs on the worker thread when stopping, before the loop ends; the loop
  // then keeps progressing until quiesced() returns true (or 5 s pass).
  void set_on_stop(std::function<void()> fn, std::function<bool()> quiesced) {
    on_stop_ = std::move(fn);
    quiesced_ = std::move(quiesced);
  }
  // Starts the thread (after the handlers above are set).
  void start();
  // Stops the thread: on_stop, then progress until quiesced. Idempotent.
  void stop();
  bool on_worker_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void loop();
  bool run_posted();

  std::string name_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::function<void()>> posted_;
  std::function<void()> tick_, on_stop_;
  std::function<bool()> quiesced_;
};

}  // namespace deepinfer
