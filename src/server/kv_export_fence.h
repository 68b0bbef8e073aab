// KvExportFence: how a prefill engine (`serve --role prefill`) answers only
// once a finished request's KV is in the shared --kv-cache-dir, so the decode
// engine the router sends the request to next finds it there (docs/router.md).
// One thread waits on the tiers' persist tickets in arrival order and runs
// each job's continuation; a ticket not met within the timeout runs it anyway
// (the decode engine then recomputes what it does not find: slower, never
// wrong).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace deepinfer {
class KvTiers;
}

namespace deepinfer::server {

class Counter;

class KvExportFence {
 public:
  // persisted / timed_out: counters for /metrics (may be null).
  KvExportFence(std::chrono::milliseconds timeout, Counter* persisted, Counter* timed_out);
  ~KvExportFence();
  KvExportFence(const KvExportFence&) = delete;
  KvExportFence& operator=(const KvExportFence&) = delete;

  // Runs `then(persisted)` on the fence's thread once every block the tiers
  // accepted up to now is on disk, or at the timeout (persisted = false).
  void after_persisted(const KvTiers& tiers, std::function<void(bool persisted)> then);

 private:
  struct Waiter {
    const KvTiers* tiers;
    uint64_t ticket;
    std::chrono::steady_clock::time_point deadline;
    std::function<void(bool)> then;
  };
  void loop();

  std::chrono::milliseconds timeout_;
  Counter* persisted_;
  Counter* timed_out_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Waiter> waiters_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepinfer::server
