#include "server/kv_export_fence.h"

#include "core/logging.h"
#include "kv/tiers/kv_tiers.h"
#include "server/metrics.h"

namespace deepinfer::server {

KvExportFence::KvExportFence(std::chrono::milliseconds timeout, Counter* persisted, Counter* timed_out)
    : timeout_(timeout), persisted_(persisted), timed_out_(timed_out), thread_([this] { loop(); }) {}

KvExportFence::~KvExportFence() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void KvExportFence::after_persisted(const KvTiers& tiers, std::function<void(bool)> then) {
  {
    std::lock_guard lock(mutex_);
    waiters_.push_back({&tiers, tiers.persist_ticket(), std::chrono::steady_clock::now() + timeout_, std::move(then)});
  }
  wake_.notify_all();
}

void KvExportFence::loop() {
  for (;;) {
    Waiter w;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !waiters_.empty(); });
      if (waiters_.empty()) return;  // stopping, nothing left
      w = std::move(waiters_.front());
      waiters_.pop_front();
    }
    // Tickets grow with arrival, so waiting on the oldest first never delays a
    // later one past its own deadline by more than the older one's wait.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - std::chrono::steady_clock::now());
    const bool ok = w.tiers->wait_persisted(w.ticket, std::max(left, std::chrono::milliseconds(0)));
    if (Counter* c = ok ? persisted_ : timed_out_) c->inc();
    if (!ok) log_warn("kv export: the request's KV was not on disk within {} ms; answering anyway", timeout_.count());
    try {
      w.then(ok);
    } catch (const std::exception& e) {
      log_error("kv export: continuation failed: {}", e.what());
    }
  }
}

}  // namespace deepinfer::server
