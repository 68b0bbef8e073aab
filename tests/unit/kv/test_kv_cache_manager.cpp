// KvLayout and KvCacheManager: layer groups, windowed release, prefix hits
// per group, lookahead slots, deferred frees, integrity.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_layout.h"
#include "kv_test_util.h"

namespace deepinfer {
namespace {

using kv_test::iota_tokens;


// Gemma 3 270M's pattern: every sixth layer full, the others windowed.
std::vector<int32_t> gemma3_windows(int32_t window) {
  std::vector<int32_t> w(18, window);
  for (int32_t l = 5; l < 18; l += 6) w[static_cast<size_t>(l)] = 0;
  return w;
}

TEST(KvLayout, GroupsLayersByKindInBlocksOfTheSmallestKind) {
  const KvLayout l = KvLayout::from_windows(gemma3_windows(512));
  EXPECT_EQ(l.slots_per_block, 3);
  ASSERT_EQ(l.num_groups(), 6);
  // Kinds in order of first appearance: the windowed one (layer 0) first.
  for (int32_t g = 0; g < 5; ++g) EXPECT_EQ(l.groups[static_cast<size_t>(g)].window, 512);
  EXPECT_EQ(l.groups[5].window, 0);
  EXPECT_EQ(l.groups[5].layers, (std::vector<int32_t>{5, 11, 17}));
  EXPECT_EQ(l.groups[0].layers, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(l.group_of_layer[11], 5);
  EXPECT_EQ(l.slot_of_layer[11], 1);
  EXPECT_EQ(l.slot_of_layer[4], 1);  // windowed layers 3, 4, 6 form group 1
  EXPECT_EQ(l.group_of_layer[6], 1);
}

TEST(KvLayout, UnevenKindsLeaveSlotsUnusedAndOneKindIsOneGroup) {
  const KvLayout mixed = KvLayout::from_windows(std::vector<int32_t>{128, 0, 128, 0, 128});
  EXPECT_EQ(mixed.slots_per_block, 2);
  ASSERT_EQ(mixed.num_groups(), 3);  // windowed {0, 2}, {4}; full {1, 3}
  EXPECT_EQ(mixed.groups[1].layers, (std::vector<int32_t>{4}));
  const KvLayout dense = KvLayout::from_windows(std::vector<int32_t>(4, 0));
  EXPECT_EQ(dense.num_groups(), 1);
  EXPECT_EQ(dense.slots_per_block, 4);
  EXPECT_THROW(KvLayout::from_windows(std::vector<int32_t>{}), Error);
  EXPECT_THROW(KvLayout::from_windows(std::vector<int32_t>{-1}), Error);
}

KvCacheManager make_manager(std::vector<int32_t> windows, int32_t blocks, int32_t step_tokens = 64,
                            bool prefix = true) {
  KvManagerConfig c;
  c.block_size = 16;
  c.max_step_tokens = step_tokens;
  c.enable_prefix_caching = prefix;
  return KvCacheManager(KvLayout::from_windows(windows), blocks, c);
}

TEST(KvCacheManager, WindowedGroupHoldsTheWindowAndTheStepOnly) {
  // One windowed layer (window 32) and one full layer: two groups of one slot.
  KvCacheManager kv = make_manager({32, 0}, 200, /*step_tokens=*/64);
  const auto prompt = iota_tokens(300);
  ASSERT_EQ(kv.admit(1, prompt, "", 0), 0);
  const SequenceKv& s = kv.tables(1);
  // Full group: all 300 positions (19 blocks); windowed: the first step's 64 (4 blocks).
  EXPECT_EQ(s.groups[1].blocks.size(), 19u);
  EXPECT_EQ(s.groups[0].blocks.size(), 4u);
  // A 64-token chunk computed: positions before 64 - 32 + 1 = 33 are dead (blocks 0 and 1).
  kv.commit(1, {prompt, {}}, 64, "");
  EXPECT_EQ(s.groups[0].num_released, 2);
  EXPECT_EQ(s.groups[1].num_released, 0);
  ASSERT_TRUE(kv.allocate_slots(1, 64, 300 - 64, 0));
  EXPECT_EQ(s.groups[0].blocks.size(), 8u);  // up to position 127
  EXPECT_EQ(s.groups[0].num_held(), 6);
  kv.check_integrity();
  // Decoding at 300: the window's 32 positions, at most three blocks.
  kv.commit(1, {prompt, {}}, 300, "");
  ASSERT_TRUE(kv.allocate_slots(1, 300, 1, 0));
  EXPECT_LE(s.groups[0].num_held(), 3);
  EXPECT_EQ(kv.blocks_when_decoding(300), 19 + 3);
  kv.free(1);
  EXPECT_EQ(kv.pool().num_free(), 200);
  kv.check_integrity();
}

TEST(KvCacheManager, AdmissionCountsEveryGroupAndRefusesWhenShort) {
  KvCacheManager kv = make_manager({0, 0}, 10);  // one group of two slots
  EXPECT_FALSE(kv.admit(1, iota_tokens(16 * 10), "", 1).has_value());
  EXPECT_FALSE(kv.holds(1));
  EXPECT_EQ(kv.pool().num_free(), 10);
  EXPECT_TRUE(kv.admit(1, iota_tokens(16 * 9), "", 1).has_value());
  EXPECT_FALSE(kv.allocate_slots(1, 16 * 9, 16 * 2, 0));  // needs 2, 1 free: nothing allocated
  EXPECT_EQ(kv.pool().num_free(), 1);
  EXPECT_TRUE(kv.allocate_slots(1, 16 * 9, 1, 0));
  EXPECT_EQ(kv.pool().num_free(), 0);
  EXPECT_THROW(kv.admit(1, iota_tokens(4), "", 0), Error);  // admitted twice
  kv.check_integrity();
}

TEST(KvCacheManager, LookaheadSlotsExtendEveryGroup) {
  KvCacheManager kv = make_manager({32, 0}, 100);
  ASSERT_TRUE(kv.admit(7, iota_tokens(15), "", 0).has_value());
  EXPECT_EQ(kv.tables(7).groups[0].blocks.size(), 1u);
  ASSERT_TRUE(kv.allocate_slots(7, 15, 1, 5));  // positions up to 20: two blocks
  EXPECT_EQ(kv.tables(7).groups[0].blocks.size(), 2u);
  EXPECT_EQ(kv.tables(7).groups[1].blocks.size(), 2u);
  EXPECT_THROW(kv.allocate_slots(7, 15, -1, 0), Error);
  EXPECT_THROW(kv.allocate_slots(8, 0, 1, 0), Error);
}

TEST(KvCacheManager, PrefixHitsArePerGroupAndWindowsOnlyHoldWhatTheyRead) {
  KvCacheManager kv = make_manager({32, 0}, 200);
  const auto prompt = iota_tokens(16 * 8 + 5);
  ASSERT_EQ(kv.admit(1, prompt, "", 0), 0);
  kv.commit(1, {prompt, {}}, 64, "");
  ASSERT_TRUE(kv.allocate_slots(1, 64, static_cast<int32_t>(prompt.size()) - 64, 0));
  kv.commit(1, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  const std::vector<int32_t> first_full = kv.tables(1).groups[1].blocks;
  kv.free(1);
  kv.check_integrity();

  // Same prompt: every full block is cached in both groups.
  const auto hit = kv.admit(2, prompt, "", 0);
  ASSERT_EQ(hit, 16 * 8);
  const SequenceKv& s = kv.tables(2);
  EXPECT_TRUE(std::equal(s.groups[1].blocks.begin(), s.groups[1].blocks.begin() + 8, first_full.begin()));
  // The windowed group holds only the blocks the next query (position 128) reads: from 97 on, blocks 6 and 7.
  EXPECT_EQ(s.groups[0].num_released, 6);
  EXPECT_EQ(kv.pool().refcount(s.groups[0].blocks[5]), 0);
  EXPECT_EQ(kv.pool().refcount(s.groups[0].blocks[6]), 1);
  // Another salt shares nothing.
  EXPECT_EQ(kv.admit(3, prompt, "tenant", 0), 0);
  kv.check_integrity();
  EXPECT_EQ(kv.prefix_cache()->stats().hit_tokens, 16 * 8);
}

TEST(KvCacheManager, AHitNeedsEveryGroup) {
  KvCacheManager kv = make_manager({32, 0}, 40);
  const auto prompt = iota_tokens(16 * 4 + 1);
  ASSERT_EQ(kv.admit(1, prompt, "", 0), 0);
  kv.commit(1, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  ASSERT_EQ(kv.tables(1).groups[0].num_released, 2);
  // While sequence 1 still holds its other pages, hand out every free block:
  // that reuses the two the window released, so only the windowed group's
  // chain breaks (at block 0).
  auto taken = kv.pool().allocate(kv.pool().num_free());
  ASSERT_TRUE(taken.has_value());
  kv.pool().release(*taken);
  kv.free(1);
  EXPECT_EQ(kv.admit(2, prompt, "", 0), 0) << "the full group alone holds the prefix";
  kv.check_integrity();
}

TEST(KvCacheManager, AHitSurvivesWhenEveryGroupKeepsItsBlocks) {
  KvCacheManager kv = make_manager({32, 0}, 40);
  const auto prompt = iota_tokens(16 * 4 + 1);
  ASSERT_EQ(kv.admit(1, prompt, "", 0), 0);
  kv.commit(1, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  kv.free(1);
  EXPECT_EQ(kv.admit(2, prompt, "", 0), 64);
  kv.check_integrity();
}

TEST(KvCacheManager, DeferredFreesWaitForTheirStep) {
  KvCacheManager kv = make_manager({0}, 20);
  ASSERT_TRUE(kv.admit(1, iota_tokens(40), "", 0).has_value());
  kv.free_after_step(1, 5);
  EXPECT_FALSE(kv.holds(1));
  EXPECT_EQ(kv.num_deferred_blocks(), 3u);
  EXPECT_EQ(kv.pool().num_free(), 17);
  kv.check_integrity();
  kv.release_deferred(4);
  EXPECT_EQ(kv.pool().num_free(), 17);
  kv.release_deferred(5);
  EXPECT_EQ(kv.pool().num_free(), 20);
  EXPECT_EQ(kv.num_deferred_blocks(), 0u);
  kv.check_integrity();
}

TEST(KvCacheManager, IntegrityCatchesAForeignReference) {
  KvCacheManager kv = make_manager({0}, 8, 64, false);
  ASSERT_TRUE(kv.admit(1, iota_tokens(20), "", 0).has_value());
  kv.check_integrity();
  kv.pool().ref(kv.tables(1).groups[0].blocks[0]);  // a reference no table accounts for
  EXPECT_THROW(kv.check_integrity(), Error);
}

TEST(KvCacheManager, FootprintBoundsForConcurrency) {
  // Gemma 3 270M at 8192 tokens: 512 blocks in the full group, 33 in each of five windowed ones.
  KvCacheManager kv = make_manager(gemma3_windows(512), 100, 512);
  EXPECT_EQ(kv.blocks_when_decoding(8192), 512 + 5 * 33);
  EXPECT_EQ(kv.max_blocks(8192), 512 + 5 * (64 + 1));
  EXPECT_EQ(kv.blocks_when_decoding(20), 6 * 2);  // short sequences hold everything
}

}  // namespace
}  // namespace deepinfer
