#include "server/request_workers.h"

#include <algorithm>

namespace deepinfer::server {

RequestWorkers::RequestWorkers(int threads, size_t max_queued) : max_queued_(std::max<size_t>(max_queued, 1)) {
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { run(); });
}

RequestWorkers::~RequestWorkers() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

bool RequestWorkers::try_submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (stop_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return true;
}

void RequestWorkers::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace deepinfer::server
