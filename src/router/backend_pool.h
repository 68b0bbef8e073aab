// BackendPool: the router's view of its backends. A health thread asks each
// backend for /server_info every interval and learns its role (prefill,
// decode, both), model and context length from the answer; a backend that
// does not answer, or answers not ready (loading, draining), takes no new
// requests until it does again. The router also reports failed calls, which
// take a backend out at once instead of at the next check. A backend that
// comes back is announced (its prefix cache is empty now).
//
// Membership: the --backend list, or a discovery function (etcd, router/etcd.h)
// the health thread calls every interval: backends it names for the first
// time join, those it no longer names leave (they take no new requests; their
// slot and index stay, and come back if the backend does). Indices are stable.
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
  bool listed = true;     // named by the backend list or the discovery
  int64_t load = 0;       // requests this router has in flight on it
  bool usable() const { return listed && known && healthy && !draining; }
};

class BackendPool {
 public:
  struct Options {
    std::chrono::milliseconds interval{1000};
    std::chrono::milliseconds timeout{2000};
    std::string api_key;  // sent to the backends (Authorization: Bearer)
    // The backends' URLs now, asked every interval (nothing: no answer, keep
    // the members as they are). Unset: the members are the constructor's.
    std::function<std::optional<std::vector<std::string>>()> discover;
  };
  static constexpr size_t kMaxBackends = 1024;
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

  size_t size() const { return count_.load(); }
  // Every listed backend.
  std::vector<BackendState> snapshot() const;
  std::optional<size_t> find(const std::string& url) const;
  const Url& url_of(size_t i) const { return slots_[i]->url; }  // fixed once the slot exists

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
    bool known = false, healthy = false, draining = false, was_down = false, listed = true;
  };
  void check(size_t i);
  void loop();
  // Applies a discovery answer: joins, leaves, returns.
  void update_members(const std::vector<std::string>& urls);

  Options options_;
  // A fixed array: a slot is written before count_ grows past it, so readers
  // index it without the lock.
  std::unique_ptr<std::unique_ptr<Slot>[]> slots_;
  std::atomic<size_t> count_{0};
  std::function<void(size_t)> on_recovered_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepinfer::router
