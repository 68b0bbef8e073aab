#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace deepinfer::cpu {

namespace {

// How long an idle thread spins before sleeping: long enough to bridge the
// serial gaps between the ops of one decode step, short enough not to burn a
// core between steps.
constexpr auto kSpinTime = std::chrono::microseconds(100);

// The job word packs a generation counter (high bits) with the number of
// threads taking part (low bits), so a worker reads both atomically.
constexpr uint64_t kActiveBits = 16;
constexpr uint64_t kActiveMask = (uint64_t{1} << kActiveBits) - 1;

thread_local bool tl_in_job = false;
thread_local int tl_thread_index = 0;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

}  // namespace

void ThreadPool::WaitableCounter::wake() {
  // A sleeper registers (sleepers_) before re-checking the value under the
  // mutex, so either it sees the new value or we see it and notify after it
  // has started waiting (we cannot take the mutex before it waits).
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }
    cv_.notify_all();
  }
}

void ThreadPool::WaitableCounter::store(uint64_t v) {
  value_.store(v, std::memory_order_seq_cst);
  wake();
}

void ThreadPool::WaitableCounter::decrement() {
  if (value_.fetch_sub(1, std::memory_order_seq_cst) == 1) wake();
}

uint64_t ThreadPool::WaitableCounter::wait_for_change(uint64_t old) {
  auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    uint64_t v = value_.load(std::memory_order_acquire);
    if (v != old) return v;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  uint64_t v;
  while ((v = value_.load(std::memory_order_seq_cst)) == old) cv_.wait(lock);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return v;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::clamp(num_threads, 1, static_cast<int>(kActiveMask));
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.store(((generation_.load() >> kActiveBits) + 1) << kActiveBits);
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  tl_thread_index = index;
  // Not generation_.load(): a job may already have been posted before this
  // thread got to run, and it must not be mistaken for one already seen.
  uint64_t seen = 0;
  for (;;) {
    seen = generation_.wait_for_change(seen);
    if (stop_.load(std::memory_order_acquire)) return;
    if (static_cast<uint64_t>(index) >= (seen & kActiveMask)) continue;
    tl_in_job = true;
    execute(index);
    tl_in_job = false;
    pending_.decrement();
  }
}

void ThreadPool::execute(int index) {
  try {
    if (chunk_ <= 0) {
      int64_t per = (n_ + active_ - 1) / active_;
      int64_t begin = per * index;
      int64_t end = std::min(n_, begin + per);
      if (begin < end) thunk_(ctx_, begin, end, index);
    } else {
      for (;;) {
        int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
        if (begin >= n_) break;
        thunk_(ctx_, begin, std::min(n_, begin + chunk_), index);
      }
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::run(int64_t n, int64_t grain, int64_t chunk, Thunk thunk, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t pieces = chunk > 0 ? (n + chunk - 1) / chunk : (n + grain - 1) / grain;
  if (tl_in_job || num_threads_ == 1 || pieces <= 1) {
    thunk(ctx, 0, n, tl_thread_index);
    return;
  }
  std::lock_guard<std::mutex> lock(dispatch_mutex_);
  int active = static_cast<int>(std::min<int64_t>(num_threads_, pieces));
  thunk_ = thunk;
  ctx_ = ctx;
  n_ = n;
  chunk_ = chunk;
  active_ = active;
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  pending_.store(static_cast<uint64_t>(active - 1));
  generation_.store(((generation_.load() >> kActiveBits) + 1) << kActiveBits | static_cast<uint64_t>(active));

  tl_in_job = true;
  execute(0);
  tl_in_job = false;
  for (uint64_t left = pending_.load(); left != 0;) left = pending_.wait_for_change(left);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace deepinfer::cpu
