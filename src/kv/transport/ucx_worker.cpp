#include "kv/transport/ucx_worker.h"

#include <poll.h>

#include <chrono>

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer {

void check_ucx(ucs_status_t status, const char* what) {
  if (status != UCS_OK) fail("ucx: {} failed: {}", what, ucs_status_string(status));
}

UcxWorker::UcxWorker(std::string name) : name_(std::move(name)) {
  ucp_config_t* config = nullptr;
  check_ucx(ucp_config_read(nullptr, nullptr, &config), "reading the configuration");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  const ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check_ucx(s, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the worker thread calls it
  if (const ucs_status_t ws = ucp_worker_create(context_, &wp, &worker_); ws != UCS_OK) {
    ucp_cleanup(context_);
    check_ucx(ws, "creating a worker");
  }
  if (const ucs_status_t es = ucp_worker_get_efd(worker_, &efd_); es != UCS_OK) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    check_ucx(es, "getting the worker's event descriptor");
  }
}

UcxWorker::~UcxWorker() {
  stop();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

void UcxWorker::start() { thread_ = std::thread([this] { loop(); }); }

void UcxWorker::stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  ucp_worker_signal(worker_);
  thread_.join();
}

void UcxWorker::post(std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    posted_.push_back(std::move(fn));
  }
  ucp_worker_signal(worker_);  // thread-safe by UCX's contract
}

bool UcxWorker::run_posted() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard lock(mutex_);
    work.swap(posted_);
  }
  for (auto& fn : work) {
    try {
      fn();
    } catch (const std::exception& e) {
      log_error("{}: {}", name_, e.what());
    }
  }
  return !work.empty();
}

void UcxWorker::loop() {
  using Clock = std::chrono::steady_clock;
  auto next_tick = Clock::now();
  while (!stop_) {
    bool busy = run_posted();
    while (ucp_worker_progress(worker_) != 0) busy = true;
    if (Clock::now() >= next_tick) {
      if (tick_) tick_();
      next_tick = Clock::now() + std::chrono::milliseconds(50);
    }
    if (busy) continue;
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    {
      // A post() between run_posted() and the arm may have had its signal
      // consumed by the arm: look again before sleeping.
      std::lock_guard lock(mutex_);
      if (!posted_.empty()) continue;
    }
    pollfd p{efd_, POLLIN, 0};
    poll(&p, 1, 50);
  }
  // Stopping: let the owner close its endpoints, then finish what is in flight.
  run_posted();
  if (on_stop_) on_stop_();
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    run_posted();
    ucp_worker_progress(worker_);
    if (!quiesced_ || quiesced_()) break;
  }
  if (quiesced_ && !quiesced_()) log_warn("{}: operations still in flight at shutdown", name_);
  run_posted();
}

}  // namespace deepinfer
