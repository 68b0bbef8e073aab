// BackendPool: the router's view of its backends. A health thread asks each
// backend for /server_info every interval and learns its role (prefill,
// decode, both), model and context length from the answer; a backend that
// does not answer, or answers not ready (loading, draining), takes no new
// requests until it does again. The router also reports failed calls, which
// take a backend out at once instead of at the next check. A backend that
// comes back is announced (its prefix cache is empty now).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "router/http_client.h"
#include "server/serve_role.h"

namespace deepinfer::router {

struct BackendState {
  size_t index = 0;
  Url url;
  server::ServeRole role = server::ServeRole::Both;
  std::string model;
  int64_t max_model_len = 0;
  bool known = false;     // answered /server_info at least once
  bool healthy = false;   // answered ready at the last check, and no call failed since
  bool draining = false;  // taken out by an operator (/router/drain)
  int64_t load = 0;       // requests this router has in flight on it
  bool usable() const { return known && healthy && !draining; }
};

class BackendPool {
 public:
  struct Options {
    std::chrono::milliseconds interval{1000};
    std::chrono::milliseconds timeout{2000};
    std::string api_key;  // sent to the backends (Authorization: Bearer)
  };
  BackendPool(std::vector<Url> urls, Options options);
  ~BackendPool();
  BackendPool(const BackendPool&) = delete;
  BackendPool& operator=(const BackendPool&) = delete;

  // Called (from the health thread) when a backend turns healthy after having
  // been down: whatever the router believed about its cache is stale.
  void on_recovered(std::function<void(size_t)> fn) { on_recovered_ = std::move(fn); }
  // Checks every backend once, then keeps checking on a thread.
  void start();
  void stop();

  size_t size() const { return slots_.size(); }
  std::vector<BackendState> snapshot() const;
  std::optional<size_t> find(const std::string& url) const;

  void acquire(size_t i) { slots_[i]->load.fetch_add(1); }
  void release(size_t i) { slots_[i]->load.fetch_sub(1); }
  // A call to backend i failed to connect or was refused while it looked healthy.
  void report_failure(size_t i);
  void set_draining(size_t i, bool draining);
  const Options& options() const { return options_; }

 private:
  struct Slot {
    Url url;
    std::atomic<int64_t> load{0};
    // Guarded by the pool's mutex.
    server::ServeRole role = server::ServeRole::Both;
    std::string model;
    int64_t max_model_len = 0;
    bool known = false, healthy = false, draining = false, was_down = false;
  };
  void check(size_t i);
  void loop();

  Options options_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::function<void(size_t)> on_recovered_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepinfer::router
