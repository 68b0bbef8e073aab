#include "backend/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace deepinfer::cpu {
namespace {

// Every index in [0, n) is visited exactly once, thread indices are in range,
// for static and dynamic splits and sizes around the grain.
TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000}) {
      for (int64_t grain : {1, 4, 100}) {
        for (int64_t chunk : {0, 1, 3}) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::atomic<bool> bad_thread{false};
          pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
            if (t < 0 || t >= threads) bad_thread = true;
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
          }, grain, chunk);
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << n << " " << grain << " " << chunk;
          ASSERT_FALSE(bad_thread);
        }
      }
    }
  }
}

TEST(ThreadPool, ManyBackToBackJobs) {
  // Decode dispatches thousands of short jobs; a lost wake-up would hang here.
  ThreadPool pool(3);
  int64_t total = 0;
  for (int job = 0; job < 3000; ++job) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(16, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    total += sum;
  }
  EXPECT_EQ(total, 3000 * 120);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e, int t) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, [&](int64_t ib, int64_t ie, int it) {
        EXPECT_EQ(it, t);
        inner += static_cast<int>(ie - ib);
      });
    }
  });
  EXPECT_EQ(inner, 40);
}

TEST(ThreadPool, RethrowsWorkerExceptions) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(30, [&](int64_t b, int64_t, int) {
    if (b == 0) throw std::runtime_error("boom");
  }), std::runtime_error);
  // The pool keeps working afterwards.
  std::atomic<int> count{0};
  pool.parallel_for(30, [&](int64_t b, int64_t e, int) { count += static_cast<int>(e - b); });
  EXPECT_EQ(count, 30);
}

TEST(ThreadPool, ZeroMeansHardwareThreads) {
  ThreadPool pool(0);
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace deepinfer::cpu
