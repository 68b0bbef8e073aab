#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"

namespace deepinfer {

// Reaches into BlockPool to inject the corruptions check_integrity() must catch.
struct BlockPoolTestAccess {
  static void set_refcount(BlockPool& p, int32_t id, int32_t rc) { p.blocks_[id].refcount = rc; }
  static void set_next(BlockPool& p, int32_t id, int32_t next) { p.blocks_[id].next = next; }
  static void set_prev(BlockPool& p, int32_t id, int32_t prev) { p.blocks_[id].prev = prev; }
  static void set_num_free(BlockPool& p, int32_t n) { p.num_free_ = n; }
};

namespace {

struct RecordingListener : BlockReuseListener {
  std::vector<int32_t> reused;
  void on_block_reuse(int32_t id) override { reused.push_back(id); }
};

TEST(BlockPool, AllocateReleaseCounts) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_blocks(), 8);
  EXPECT_EQ(pool.num_free(), 8);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_DOUBLE_EQ(pool.usage(), 3.0 / 8.0);
  for (int32_t id : *a) EXPECT_EQ(pool.refcount(id), 1);
  pool.check_integrity();
  pool.release(*a);
  EXPECT_EQ(pool.num_free(), 8);
  pool.check_integrity();
  auto empty = pool.allocate(0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
}

TEST(BlockPool, AllOrNothing) {
  BlockPool pool(4);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(pool.allocate(2).has_value());
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_TRUE(pool.allocate(1).has_value());
  EXPECT_FALSE(pool.allocate(1).has_value());
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  pool.check_integrity();
}

TEST(BlockPool, FreedBlocksGoToTailInLruOrder) {
  BlockPool pool(6);
  auto a = *pool.allocate(6);
  pool.release(a[4]);
  pool.release(a[1]);
  pool.release(a[3]);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{4, 1, 3}));
  EXPECT_EQ(*pool.allocate(2), (std::vector<int32_t>{4, 1}));
  pool.release(a[0]);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{3, 0}));
  pool.check_integrity();
}

TEST(BlockPool, RefTakesFreeBlockOutOfQueueWithoutReuseNotification) {
  BlockPool pool(4);
  RecordingListener listener;
  pool.set_reuse_listener(&listener);
  auto a = *pool.allocate(2);
  EXPECT_EQ(listener.reused, (std::vector<int32_t>{0, 1}));
  pool.release(a[0]);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{2, 3, 0}));
  pool.ref(a[0]);  // a prefix-cache hit on a freed block
  EXPECT_EQ(pool.refcount(a[0]), 1);
  EXPECT_EQ(pool.free_queue(), (std::vector<int32_t>{2, 3}));
  pool.ref(a[1]);
  EXPECT_EQ(pool.refcount(a[1]), 2);
  pool.release(a[1]);
  EXPECT_EQ(pool.refcount(a[1]), 1);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(listener.reused, (std::vector<int32_t>{0, 1}));
  pool.check_integrity();
}

TEST(BlockPool, BadIdsAndDoubleFreeThrow) {
  BlockPool pool(2);
  EXPECT_THROW(pool.release(0), Error);
  EXPECT_THROW(pool.ref(2), Error);
  EXPECT_THROW(pool.ref(-1), Error);
  EXPECT_THROW(pool.refcount(5), Error);
  EXPECT_THROW(pool.allocate(-1), Error);
  EXPECT_THROW(BlockPool(-3), Error);
  pool.check_integrity();
}

TEST(BlockPool, IntegrityDetectsRefcountOfQueuedBlock) {
  BlockPool pool(4);
  BlockPoolTestAccess::set_refcount(pool, 2, 1);
  EXPECT_THROW(pool.check_integrity(), Error);
}

TEST(BlockPool, IntegrityDetectsHeldBlockMissingFromQueue) {
  BlockPool pool(4);
  auto a = *pool.allocate(1);
  BlockPoolTestAccess::set_refcount(pool, a[0], 0);
  EXPECT_THROW(pool.check_integrity(), Error);
}

TEST(BlockPool, IntegrityDetectsBrokenLinks) {
  {
    BlockPool pool(4);
    BlockPoolTestAccess::set_next(pool, 1, 0);  // cycle
    EXPECT_THROW(pool.check_integrity(), Error);
  }
  {
    BlockPool pool(4);
    BlockPoolTestAccess::set_prev(pool, 2, 0);
    EXPECT_THROW(pool.check_integrity(), Error);
  }
  {
    BlockPool pool(4);
    BlockPoolTestAccess::set_next(pool, 1, 3);  // skips block 2
    EXPECT_THROW(pool.check_integrity(), Error);
  }
  {
    BlockPool pool(4);
    BlockPoolTestAccess::set_next(pool, 1, 9);
    EXPECT_THROW(pool.check_integrity(), Error);
  }
}

TEST(BlockPool, IntegrityDetectsWrongFreeCount) {
  BlockPool pool(4);
  BlockPoolTestAccess::set_num_free(pool, 3);
  EXPECT_THROW(pool.check_integrity(), Error);
}

TEST(BlockPool, RandomisedOperationsKeepIntegrity) {
  BlockPool pool(32);
  std::vector<int32_t> held;  // one entry per reference
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  };
  for (int step = 0; step < 2000; ++step) {
    const uint32_t op = next() % 3;
    if (op == 0) {
      auto got = pool.allocate(static_cast<int32_t>(next() % 4));
      if (got) held.insert(held.end(), got->begin(), got->end());
    } else if (op == 1 && !held.empty()) {
      const size_t i = next() % held.size();
      pool.release(held[i]);
      held.erase(held.begin() + static_cast<ptrdiff_t>(i));
    } else if (!held.empty()) {
      const int32_t id = held[next() % held.size()];
      pool.ref(id);
      held.push_back(id);
    }
    pool.check_integrity();
    std::vector<int32_t> counts(32, 0);
    for (int32_t id : held) ++counts[id];
    int32_t free = 0;
    for (int32_t id = 0; id < 32; ++id) {
      ASSERT_EQ(pool.refcount(id), counts[id]);
      free += counts[id] == 0;
    }
    ASSERT_EQ(pool.num_free(), free);
  }
}

}  // namespace
}  // namespace deepinfer
