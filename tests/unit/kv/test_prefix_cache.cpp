#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/prefix_cache.h"

namespace deepinfer {

// Reaches into PrefixCache to inject the corruptions check_integrity() must catch.
struct PrefixCacheTestAccess {
  static void set_cached(PrefixCache& c, int32_t id, bool v) { c.entries_[id].cached = v; }
  static void set_hash(PrefixCache& c, int32_t id, uint64_t h) { c.entries_[id].hash.value = h; }
  static void map_hash(PrefixCache& c, uint64_t h, int32_t id) { c.by_hash_[h] = id; }
  static void set_parent_uid(PrefixCache& c, int32_t id, uint64_t uid) { c.entries_[id].parent_uid = uid; }
};

namespace {

constexpr int32_t kBs = 4;

std::vector<int32_t> iota_tokens(int32_t n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Plays the role of the engine for one sequence: hit blocks first, then fresh
// blocks for the rest, every full block inserted in order.
struct Sequence {
  std::vector<int32_t> blocks;
  int32_t n_hit = 0;

  Sequence(BlockPool& pool, PrefixCache& cache, const std::vector<int32_t>& tokens, std::string_view salt = {}) {
    auto hashes = PrefixCache::compute_block_hashes(tokens, kBs, salt);
    blocks = cache.match(hashes, tokens, salt);
    n_hit = static_cast<int32_t>(blocks.size());
    for (int32_t id : blocks) pool.ref(id);
    const int32_t n_needed = static_cast<int32_t>((tokens.size() + kBs - 1) / kBs);
    auto fresh = pool.allocate(n_needed - n_hit);
    EXPECT_TRUE(fresh.has_value());
    blocks.insert(blocks.end(), fresh->begin(), fresh->end());
    for (size_t i = static_cast<size_t>(n_hit); i < hashes.size(); ++i) {
      const std::span<const int32_t> block(tokens.data() + i * kBs, kBs);
      cache.insert(hashes[i], blocks[i], block, i == 0 ? PrefixCache::kNoParent : blocks[i - 1], salt);
    }
  }
  void release(BlockPool& pool) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) pool.release(*it);
  }
};

TEST(PrefixCache, HashesChainAndSkipPartialBlock) {
  auto t = iota_tokens(10, 100);
  auto h = PrefixCache::compute_block_hashes(t, kBs);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_NE(h[0], h[1]);
  auto t2 = t;
  t2[0] = 7;  // changing block 0 changes every later hash
  auto h2 = PrefixCache::compute_block_hashes(t2, kBs);
  EXPECT_NE(h[0], h2[0]);
  EXPECT_NE(h[1], h2[1]);
  auto t3 = t;
  t3[9] = 7;  // partial block: not hashed
  EXPECT_EQ(PrefixCache::compute_block_hashes(t3, kBs)[1], h[1]);
  EXPECT_NE(PrefixCache::compute_block_hashes(t, kBs, "tenant")[0], h[0]);
  EXPECT_THROW(PrefixCache::compute_block_hashes(t, 0), Error);
}

TEST(PrefixCache, FullHitReturnsSameBlocks) {
  BlockPool pool(16);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(12, 1);
  Sequence a(pool, cache, tokens);
  EXPECT_EQ(a.n_hit, 0);
  EXPECT_EQ(cache.num_cached_blocks(), 3);
  a.release(pool);
  cache.check_integrity();

  Sequence b(pool, cache, tokens);
  EXPECT_EQ(b.n_hit, 3);
  EXPECT_EQ(b.blocks, a.blocks);
  EXPECT_EQ(cache.stats().num_queries, 2);
  EXPECT_EQ(cache.stats().query_tokens, 24);
  EXPECT_EQ(cache.stats().hit_tokens, 12);
  // Shared while both run: refcount 2.
  Sequence c(pool, cache, tokens);
  EXPECT_EQ(pool.refcount(a.blocks[0]), 2);
  cache.check_integrity();
  pool.check_integrity();
}

TEST(PrefixCache, PartialHitStopsAtFirstDifferentBlock) {
  BlockPool pool(16);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(14, 1);
  Sequence a(pool, cache, tokens);
  EXPECT_EQ(cache.num_cached_blocks(), 3);  // the partial 4th block is not cached
  auto other = tokens;
  other[9] = 999;  // block 2 differs
  Sequence b(pool, cache, other);
  EXPECT_EQ(b.n_hit, 2);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_NE(b.blocks[2], a.blocks[2]);
  // Hashes limited by the caller (e.g. to keep the last token uncomputed).
  auto hashes = PrefixCache::compute_block_hashes(tokens, kBs);
  EXPECT_EQ(cache.match(std::span(hashes).first(1), tokens).size(), 1u);
  cache.check_integrity();
}

TEST(PrefixCache, SaltIsolatesTenants) {
  BlockPool pool(16);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(8, 1);
  Sequence a(pool, cache, tokens, "tenant-a");
  Sequence b(pool, cache, tokens, "tenant-b");
  EXPECT_EQ(b.n_hit, 0);
  Sequence none(pool, cache, tokens);
  EXPECT_EQ(none.n_hit, 0);
  Sequence a2(pool, cache, tokens, "tenant-a");
  EXPECT_EQ(a2.n_hit, 2);
  EXPECT_EQ(a2.blocks, a.blocks);
  cache.check_integrity();
}

TEST(PrefixCache, SaltIsConfirmedEvenWhenHashesCollide) {
  BlockPool pool(4);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(4, 1);
  const BlockHash forged{42};
  auto ids = *pool.allocate(1);
  ASSERT_TRUE(cache.insert(forged, ids[0], tokens, PrefixCache::kNoParent, "tenant-a"));
  std::vector<BlockHash> q{forged};
  EXPECT_TRUE(cache.match(q, tokens, "tenant-b").empty());
  EXPECT_EQ(cache.match(q, tokens, "tenant-a"), ids);
}

TEST(PrefixCache, CollisionIsConfirmedByContent) {
  BlockPool pool(8);
  PrefixCache cache(pool, kBs);
  auto t1 = iota_tokens(4, 1);
  auto t2 = iota_tokens(4, 50);
  const BlockHash forged{0xdeadbeef};
  auto ids = *pool.allocate(2);
  ASSERT_TRUE(cache.insert(forged, ids[0], t1, PrefixCache::kNoParent));
  std::vector<BlockHash> q{forged};
  EXPECT_TRUE(cache.match(q, t2).empty());
  EXPECT_EQ(cache.match(q, t1), std::vector<int32_t>{ids[0]});
  // The colliding content takes the slot; the first block is no longer reachable.
  ASSERT_TRUE(cache.insert(forged, ids[1], t2, PrefixCache::kNoParent));
  EXPECT_FALSE(cache.is_cached(ids[0]));
  EXPECT_TRUE(cache.match(q, t1).empty());
  EXPECT_EQ(cache.match(q, t2), std::vector<int32_t>{ids[1]});
  cache.check_integrity();
}

TEST(PrefixCache, ChildOfEvictedParentIsNotMatched) {
  BlockPool pool(3);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(8, 1);
  Sequence a(pool, cache, tokens);  // blocks 0, 1
  pool.release(a.blocks[0]);        // only block 0 freed: it goes first in LRU after block 2
  auto filler = *pool.allocate(2);  // takes block 2, then evicts block 0
  EXPECT_FALSE(cache.is_cached(a.blocks[0]));
  EXPECT_TRUE(cache.is_cached(a.blocks[1]));
  pool.release(filler);
  // Block 0's content is cached again in a new block; the old block 1 was
  // computed after a different cache entry and must not be chained to it.
  auto hashes = PrefixCache::compute_block_hashes(tokens, kBs);
  auto fresh = *pool.allocate(1);
  ASSERT_TRUE(cache.insert(hashes[0], fresh[0], std::span(tokens).first(kBs), PrefixCache::kNoParent));
  EXPECT_EQ(cache.match(hashes, tokens), std::vector<int32_t>{fresh[0]});
  // Re-inserting block 1 after the new parent replaces the stale entry.
  auto fresh1 = *pool.allocate(1);
  ASSERT_TRUE(cache.insert(hashes[1], fresh1[0], std::span(tokens).subspan(kBs, kBs), fresh[0]));
  EXPECT_FALSE(cache.is_cached(a.blocks[1]));
  EXPECT_EQ(cache.match(hashes, tokens), (std::vector<int32_t>{fresh[0], fresh1[0]}));
  cache.check_integrity();
  pool.check_integrity();
}

TEST(PrefixCache, EvictionWhenCachedBlockIsReallocatedLruOrder) {
  BlockPool pool(4);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(8, 1);
  Sequence a(pool, cache, tokens);  // blocks 0, 1
  a.release(pool);                  // freed last block first: queue 2, 3, 1, 0
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  auto x = *pool.allocate(2);  // never-cached blocks go first
  EXPECT_EQ(cache.num_cached_blocks(), 2);
  auto y = *pool.allocate(1);  // evicts the sequence's last block
  EXPECT_EQ(y[0], a.blocks[1]);
  EXPECT_EQ(cache.num_cached_blocks(), 1);
  auto hashes = PrefixCache::compute_block_hashes(tokens, kBs);
  EXPECT_EQ(cache.match(hashes, tokens), std::vector<int32_t>{a.blocks[0]});
  pool.ref(a.blocks[0]);  // hit pins the block: nothing left to evict
  EXPECT_FALSE(pool.allocate(1).has_value());
  EXPECT_TRUE(cache.is_cached(a.blocks[0]));
  cache.check_integrity();
  pool.check_integrity();
}

TEST(PrefixCache, InsertRules) {
  BlockPool pool(8);
  PrefixCache cache(pool, kBs);
  auto tokens = iota_tokens(8, 1);
  auto hashes = PrefixCache::compute_block_hashes(tokens, kBs);
  auto ids = *pool.allocate(4);
  const std::span<const int32_t> b0(tokens.data(), kBs);
  const std::span<const int32_t> b1(tokens.data() + kBs, kBs);
  // Parent not cached: the child is not cached either.
  EXPECT_FALSE(cache.insert(hashes[1], ids[1], b1, ids[0]));
  EXPECT_TRUE(cache.insert(hashes[0], ids[0], b0, PrefixCache::kNoParent));
  EXPECT_TRUE(cache.insert(hashes[0], ids[0], b0, PrefixCache::kNoParent));  // idempotent
  // Same content computed twice: the second copy stays private.
  EXPECT_FALSE(cache.insert(hashes[0], ids[2], b0, PrefixCache::kNoParent));
  EXPECT_FALSE(cache.is_cached(ids[2]));
  EXPECT_TRUE(cache.insert(hashes[1], ids[1], b1, ids[0]));
  EXPECT_THROW(cache.insert(hashes[1], ids[0], b1, PrefixCache::kNoParent), Error);  // cached under another hash
  EXPECT_THROW(cache.insert(hashes[0], ids[3], std::span(tokens).first(3), PrefixCache::kNoParent), Error);
  EXPECT_THROW(cache.insert(hashes[0], 6, b0, PrefixCache::kNoParent), Error);  // not held
  EXPECT_THROW(cache.insert(hashes[0], 99, b0, PrefixCache::kNoParent), Error);
  EXPECT_THROW(cache.insert(hashes[1], ids[3], b1, 99), Error);
  EXPECT_THROW(cache.match(hashes, std::span(tokens).first(5)), Error);
  cache.check_integrity();
  cache.clear();
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  EXPECT_TRUE(cache.match(hashes, tokens).empty());
  cache.check_integrity();
}

TEST(PrefixCache, IntegrityDetectsCorruption) {
  auto setup = [](BlockPool& pool, PrefixCache& cache) {
    auto tokens = iota_tokens(8, 1);
    Sequence s(pool, cache, tokens);
    cache.check_integrity();
    return s.blocks;
  };
  {
    BlockPool pool(4);
    PrefixCache cache(pool, kBs);
    auto b = setup(pool, cache);
    PrefixCacheTestAccess::set_cached(cache, b[1], false);
    EXPECT_THROW(cache.check_integrity(), Error);
  }
  {
    BlockPool pool(4);
    PrefixCache cache(pool, kBs);
    auto b = setup(pool, cache);
    PrefixCacheTestAccess::set_hash(cache, b[0], 1234);
    EXPECT_THROW(cache.check_integrity(), Error);
  }
  {
    BlockPool pool(4);
    PrefixCache cache(pool, kBs);
    setup(pool, cache);
    PrefixCacheTestAccess::map_hash(cache, 77, 3);  // points at an uncached block
    EXPECT_THROW(cache.check_integrity(), Error);
  }
  {
    BlockPool pool(4);
    PrefixCache cache(pool, kBs);
    auto b = setup(pool, cache);
    PrefixCacheTestAccess::set_parent_uid(cache, b[0], 1000);
    EXPECT_THROW(cache.check_integrity(), Error);
  }
}

TEST(PrefixCache, RandomisedWorkloadKeepsIntegrityAndCorrectHits) {
  BlockPool pool(24);
  PrefixCache cache(pool, kBs);
  uint64_t state = 99;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  };
  std::vector<Sequence> live;
  // What each block's KV was computed from: the whole prefix up to its end.
  std::vector<std::vector<int32_t>> written(24);
  int64_t checked_hits = 0;
  for (int step = 0; step < 400; ++step) {
    if (live.size() < 3 && next() % 2 == 0) {
      // Prompts from a few shared prefixes so hits, partial hits and evictions all happen.
      std::vector<int32_t> tokens;
      const int32_t family = static_cast<int32_t>(next() % 3);
      const int32_t len = 4 + static_cast<int32_t>(next() % 20);
      for (int32_t i = 0; i < len; ++i) tokens.push_back(i < 8 ? family * 100 + i : static_cast<int32_t>(next() % 5));
      const int32_t n_needed = (len + kBs - 1) / kBs;
      if (pool.num_free() < n_needed) continue;
      Sequence s(pool, cache, tokens);
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        const size_t end = std::min(tokens.size(), (i + 1) * kBs);
        std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(end));
        if (static_cast<int32_t>(i) < s.n_hit) {
          ASSERT_EQ(written[s.blocks[i]], prefix) << "hit returned a block computed from another prefix";
          ++checked_hits;
        } else {
          written[s.blocks[i]] = prefix;
        }
      }
      live.push_back(std::move(s));
    } else if (!live.empty()) {
      const size_t i = next() % live.size();
      live[i].release(pool);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    }
    cache.check_integrity();
    pool.check_integrity();
  }
  EXPECT_GT(checked_hits, 10);
  EXPECT_GT(cache.stats().hit_tokens, 0);
  EXPECT_LT(cache.stats().hit_tokens, cache.stats().query_tokens);
}

}  // namespace
}  // namespace deepinfer
