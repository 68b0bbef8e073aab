// A small persistent thread pool for the CPU backend's data-parallel loops.
//
// Decode steps dispatch ~10 parallel loops per layer, each only tens of
// microseconds long, so dispatch latency matters more than throughput: workers
// spin briefly on a generation counter after each job (catching the next one
// without a syscall) and only then sleep on a condition variable.
// (std::atomic::wait is avoided: libstdc++ 12 can lose wake-ups on 64-bit words.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace deepinfer::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 = std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread_index) over disjoint ranges covering [0, n).
  // Ranges hold at least `grain` items (except the last), so loops smaller than
  // grain run inline on the caller. thread_index < num_threads() identifies the
  // executing thread (for per-thread scratch). With chunk > 0, ranges of `chunk`
  // items are handed out dynamically (for uneven work); otherwise each thread
  // gets one contiguous range. Exceptions thrown by fn are rethrown here.
  // Calls from inside a running job execute serially on the calling thread.
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn, int64_t grain = 1, int64_t chunk = 0) {
    using F = std::remove_reference_t<Fn>;
    run(n, grain, chunk,
        [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<F*>(ctx))(b, e, t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  // A counter that threads wait on to change: spin first, then sleep.
  class WaitableCounter {
   public:
    uint64_t load() const { return value_.load(std::memory_order_acquire); }
    void store(uint64_t v);  // wakes all waiters
    void decrement();        // wakes waiters when it reaches zero
    uint64_t wait_for_change(uint64_t old);

   private:
    void wake();
    std::atomic<uint64_t> value_{0};
    std::atomic<int> sleepers_{0};
    std::mutex mutex_;
    std::condition_variable cv_;
  };

  using Thunk = void (*)(void* ctx, int64_t begin, int64_t end, int thread_index);

  void run(int64_t n, int64_t grain, int64_t chunk, Thunk thunk, void* ctx);
  void worker_loop(int index);
  void execute(int index);

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex dispatch_mutex_;  // one job at a time if several threads share the pool

  // The current job; written by the dispatcher before the generation is bumped.
  Thunk thunk_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int active_ = 0;  // threads taking part in this job
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  std::mutex error_mutex_;

  WaitableCounter generation_;
  WaitableCounter pending_;  // threads still working on the current job
  std::atomic<bool> stop_{false};
};

}  // namespace deepinfer::cpu
