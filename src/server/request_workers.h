// RequestWorkers: a few threads that do the CPU work of requests (JSON
// parsing, validation, chat templates, tokenisation) off the I/O threads, so
// a heavy request delays neither other connections nor /health. The queue is
// bounded: when it is full, try_submit refuses and the caller answers 503.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer::server {

class RequestWorkers {
 public:
  RequestWorkers(int threads, size_t max_queued);
  ~RequestWorkers();  // runs what is queued, then joins
  RequestWorkers(const RequestWorkers&) = delete;
  RequestWorkers& operator=(const RequestWorkers&) = delete;

  // False when `max_queued` tasks already wait. A task must not throw.
  bool try_submit(std::function<void()> task);

 private:
  void run();

  const size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace deepinfer::server
