// The KV tiers below the device pages: the host tier's slots (publish,
// content-verified hits, LRU around pinned slots, TTL), the load-or-recompute
// decision, the manager's use of a tier link (offers registered blocks, loads
// tier hits into fresh pages at admission), and KvTiers moving real bytes
// between a KvStorage, host slots and block files across instances.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"
#include "kv/tiers/host_tier.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/tiers/tier_cost_model.h"
#include "kv_test_util.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using kv_test::block_bytes;
using kv_test::fill_block;
using kv_test::iota_tokens;

const std::vector<int32_t> kGroup0 = {0};


// ---------------------------------------------------------------- host tier

TEST(HostKvTier, PublishedBlocksHitOnlyWithTheirContent) {
  auto backend = create_backend(DeviceType::CPU);
  HostKvTier tier(*backend, 64, 4);
  const auto tokens = iota_tokens(16);
  const KvBlockIdentity first{11, 0, true, "salt", tokens};
  auto slot = tier.reserve(first, 0);
  ASSERT_TRUE(slot.has_value());
  std::memset(tier.payload(*slot).data(), 0x5A, 64);
  EXPECT_EQ(tier.find_and_pin(first), -1) << "a slot being filled is invisible";
  EXPECT_FALSE(tier.reserve(first, 0).has_value()) << "one slot per key";
  tier.publish(*slot);
  const int32_t hit = tier.find_and_pin(first);
  ASSERT_EQ(hit, *slot);
  EXPECT_EQ(static_cast<int>(tier.payload(hit)[63]), 0x5A);
  tier.unpin(hit);

  // Same key, other content: another salt, other tokens, or a non-first block.
  EXPECT_EQ(tier.find_and_pin({11, 0, true, "other", tokens}), -1);
  const auto other_tokens = iota_tokens(16, 7);
  EXPECT_EQ(tier.find_and_pin({11, 0, true, "salt", other_tokens}), -1);
  EXPECT_EQ(tier.find_and_pin({11, 3, false, "", tokens}), -1);

  // A later block is verified by its parent's key.
  const KvBlockIdentity second{12, 11, false, "", tokens};
  auto s2 = tier.reserve(second, 0);
  ASSERT_TRUE(s2.has_value());
  tier.publish(*s2);
  EXPECT_EQ(tier.find_and_pin({12, 99, false, "", tokens}), -1);
  const int32_t h2 = tier.find_and_pin(second);
  EXPECT_EQ(h2, *s2);
  tier.unpin(h2);
  EXPECT_EQ(tier.stats().blocks, 2);
}

TEST(HostKvTier, EvictsTheLeastRecentlyUsedUnpinnedSlot) {
  auto backend = create_backend(DeviceType::CPU);
  HostKvTier tier(*backend, 32, 2);
  const auto tokens = iota_tokens(4);
  auto id = [&](uint64_t key) { return KvBlockIdentity{key, 0, true, "", tokens}; };
  const int32_t a = *tier.reserve(id(1), 0);
  tier.publish(a);
  const int32_t b = *tier.reserve(id(2), 0);
  tier.publish(b);
  // Pin 1 (it is also the most recent now): a third block must evict 2.
  ASSERT_EQ(tier.find_and_pin(id(1)), a);
  ASSERT_TRUE(tier.reserve(id(3), 0).has_value());
  EXPECT_FALSE(tier.contains(2));
  EXPECT_TRUE(tier.contains(1));
  EXPECT_EQ(tier.stats().evictions, 1);
  // Slot of 1 pinned, slot of 3 being filled: nothing can be evicted.
  EXPECT_FALSE(tier.reserve(id(4), 0).has_value());
  EXPECT_EQ(tier.stats().full, 1);
  tier.unpin(a);
  EXPECT_TRUE(tier.reserve(id(4), 0).has_value());
  EXPECT_FALSE(tier.contains(1));
}

std::chrono::system_clock::time_point g_now;
std::chrono::system_clock::time_point test_clock() { return g_now; }

TEST(HostKvTier, ExpiredBlocksAreMissesAndDropped) {
  auto backend = create_backend(DeviceType::CPU);
  HostKvTier tier(*backend, 32, 2);
  g_now = std::chrono::system_clock::time_point(std::chrono::seconds(1'000'000));
  tier.set_clock_for_testing(&test_clock);
  const auto tokens = iota_tokens(4);
  const KvBlockIdentity id{5, 0, true, "", tokens};
  tier.publish(*tier.reserve(id, 1'000'100));
  const int32_t s = tier.find_and_pin(id);
  ASSERT_GE(s, 0);
  tier.unpin(s);
  g_now += std::chrono::seconds(100);
  EXPECT_EQ(tier.find_and_pin(id), -1);
  EXPECT_FALSE(tier.contains(5));
  EXPECT_EQ(tier.stats().expirations, 1);
}

// ------------------------------------------------------------- cost model

TEST(TierCostModel, RecomputeCostGrowsWithContext) {
  TierCostModel m(1 << 20, 16);
  // 1024-token steps: 10.24 ms after no context, 30.72 ms after 8192 tokens.
  m.set_compute(1024, 10.24 + 0.5 * 1024 * 1024 * 2.5e-6, 8192, 30.72 + 0.5 * 1024 * 1024 * 2.5e-6);
  const TierCostEstimate e = m.estimate();
  EXPECT_NEAR(e.compute_ms_per_token_ctx, 20.48 / 1024 / 8192, 1e-12);
  EXPECT_NEAR(e.compute_ms_per_token, 0.01, 1e-3);
  // Recomputing 16 tokens costs more deep in a context than at its start.
  EXPECT_GT(m.recompute_ms(32768, 32784), 2 * m.recompute_ms(0, 16));
}

TEST(TierCostModel, SkipsATierSlowerThanRecomputingAndProbesIt) {
  // 1 MiB per block of 16 tokens.
  TierCostModel m(1 << 20, 16);
  EXPECT_TRUE(m.worth_loading(KvTierKind::Disk, 0, 4)) << "unmeasured: tried";
  m.set_compute(1024, 10.24, 0, 0.0);                  // 0.01 ms per token: 0.16 ms per block
  m.record_transfer(KvTierKind::Disk, 1 << 20, 1.0);   // ~1 GB/s: ~1 ms per block
  m.record_transfer(KvTierKind::Host, 10 << 20, 1.0);  // ~10 GB/s: ~0.1 ms per block
  EXPECT_TRUE(m.worth_loading(KvTierKind::Host, 0, 4));
  int tried = 0;
  for (int i = 0; i < 2 * TierCostModel::kProbeInterval; ++i) tried += m.worth_loading(KvTierKind::Disk, 0, 4);
  EXPECT_EQ(tried, 2) << "a slower tier is only probed";
  EXPECT_FALSE(m.worth_loading(KvTierKind::Host, 4, 4)) << "nothing to load";
}

// ---------------------------------------------- the manager and a tier link

// Remembers what the manager offers and serves hits for blocks it holds.
class FakeLink : public KvTierLink {
 public:
  struct Offer {
    int32_t group, index, block;
    uint64_t hash, parent;
  };
  std::vector<Offer> offers;
  std::vector<std::tuple<int32_t, int32_t, int32_t>> loads;  // index, group, block
  int32_t holds_blocks = 0;  // serves blocks [0, holds_blocks) of every group
  int releases = 0;

  bool on_registered(const KvBlockRef& ref, int32_t block_id, int64_t) override {
    offers.push_back({ref.group, ref.index, block_id, ref.hash.value, ref.parent.value});
    return hold;
  }
  std::vector<int32_t> take_released_blocks() override {
    std::vector<int32_t> out;
    out.swap(copied);
    return out;
  }
  bool hold = false;            // claim the offered blocks until `copied` returns them
  std::vector<int32_t> copied;
  int32_t acquire(const KvTierQuery&, int32_t from, int32_t to) override {
    return std::max(0, std::min(to, holds_blocks) - from);
  }
  void load(int32_t index, int32_t group, int32_t block_id) override { loads.emplace_back(index, group, block_id); }
  void release() override { ++releases; }
};

KvCacheManager make_manager(std::vector<int32_t> windows, int32_t blocks) {
  KvManagerConfig c;
  c.block_size = 16;
  c.max_step_tokens = 256;
  return KvCacheManager(KvLayout::from_windows(windows), blocks, c);
}

TEST(KvCacheManagerTiers, OffersRegisteredBlocksWithTheirChain) {
  KvCacheManager kv = make_manager({0}, 20);
  FakeLink link;
  kv.set_tier_link(&link);
  const auto prompt = iota_tokens(16 * 3 + 2);
  ASSERT_EQ(kv.admit(1, prompt, "", 0), 0);
  kv.commit(1, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16);
  ASSERT_EQ(link.offers.size(), 3u);
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(link.offers[i].index, i);
    EXPECT_EQ(link.offers[i].block, kv.tables(1).groups[0].blocks[i]);
    EXPECT_EQ(link.offers[i].hash, hashes[i].value);
    if (i > 0) {
      EXPECT_EQ(link.offers[i].parent, hashes[i - 1].value);
    }
  }
  // A second sequence hitting them on the device offers nothing new.
  kv.free(1);
  ASSERT_EQ(kv.admit(2, prompt, "", 0), 48);
  kv.commit(2, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  EXPECT_EQ(link.offers.size(), 3u);
  kv.check_integrity();
}

TEST(KvCacheManagerTiers, BlocksBeingCopiedStayOutOfThePool) {
  KvCacheManager kv = make_manager({0}, 6);
  FakeLink link;
  link.hold = true;
  kv.set_tier_link(&link);
  const auto prompt = iota_tokens(16 * 2 + 1);
  ASSERT_EQ(kv.admit(1, prompt, "", 0), 0);
  kv.commit(1, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  ASSERT_EQ(link.offers.size(), 2u);
  kv.free(1);
  kv.check_integrity();
  EXPECT_EQ(kv.pool().num_free(), 4) << "the two blocks being copied are not free";
  EXPECT_EQ(kv.num_tier_held_blocks(), 2u);
  link.copied = {link.offers[0].block, link.offers[1].block};
  kv.release_deferred(0);
  EXPECT_EQ(kv.pool().num_free(), 6);
  EXPECT_EQ(kv.num_tier_held_blocks(), 0u);
  // Still cached after the copy: a hit on the device.
  EXPECT_EQ(kv.admit(2, prompt, "", 0), 32);
  kv.check_integrity();
}

TEST(KvCacheManagerTiers, TierHitsAreLoadedIntoFreshPagesAfterTheDeviceHits) {
  KvCacheManager kv = make_manager({0}, 40);
  FakeLink link;
  kv.set_tier_link(&link);
  const auto prompt = iota_tokens(16 * 6 + 3);
  // The device holds blocks 0-1 (a shorter prompt computed them).
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 33);
  ASSERT_EQ(kv.admit(1, head, "", 0), 0);
  kv.commit(1, {head, {}}, 33, "");
  kv.free(1);
  link.holds_blocks = 5;
  link.releases = 0;
  const auto cached = kv.admit(2, prompt, "", 0);
  ASSERT_EQ(cached, 5 * 16) << "2 device blocks, then 3 from the tier";
  ASSERT_EQ(link.loads.size(), 3u);
  const SequenceKv& s = kv.tables(2);
  for (int32_t k = 0; k < 3; ++k) {
    const auto [index, group, block] = link.loads[k];
    EXPECT_EQ(index, 2 + k);
    EXPECT_EQ(group, 0);
    EXPECT_EQ(block, s.groups[0].blocks[2 + k]);
    EXPECT_TRUE(kv.prefix_cache()->is_cached(block)) << "loaded blocks serve later hits on the device";
  }
  EXPECT_EQ(kv.tier_hit_tokens(), 48);
  EXPECT_EQ(link.releases, 1);
  kv.check_integrity();
}

TEST(KvCacheManagerTiers, ARefusedAdmissionLoadsNothing) {
  KvCacheManager kv = make_manager({0}, 8);
  FakeLink link;
  link.holds_blocks = 4;
  kv.set_tier_link(&link);
  const auto prompt = iota_tokens(16 * 8 + 1);
  EXPECT_FALSE(kv.admit(1, prompt, "", 0).has_value());
  EXPECT_TRUE(link.loads.empty());
  EXPECT_EQ(link.releases, 1);
  EXPECT_EQ(kv.pool().num_free(), 8);
}

TEST(KvCacheManagerTiers, SlidingWindowLayersAreReplayedNotStored) {
  // Window 32 and full attention; r = 6, so a replay covers W + r = 38 tokens.
  KvCacheManager kv = make_manager({32, 0}, 60);
  ASSERT_EQ(kv.tier_groups(), (std::vector<int32_t>{1}));
  EXPECT_EQ(kv.swa_replay_tokens(), 38);
  FakeLink link;
  kv.set_tier_link(&link);
  // Only the full-attention group's blocks are offered to the tiers.
  const auto first = iota_tokens(16 * 3 + 1);
  ASSERT_EQ(kv.admit(1, first, "", 0), 0);
  kv.commit(1, {first, {}}, static_cast<int32_t>(first.size()), "");
  ASSERT_FALSE(link.offers.empty());
  for (const auto& o : link.offers) EXPECT_EQ(o.group, 1);
  kv.free(1);

  // A tier hit of 10 blocks (160 tokens) of a new prompt: the full group
  // loads up to s = floor((160 - 38) / 16) = 7 blocks; the windowed group
  // starts empty at 112 and the prefill from there rebuilds it.
  const auto prompt = iota_tokens(16 * 10 + 5, 5000);
  link.holds_blocks = 10;
  const auto cached = kv.admit(2, prompt, "", 0);
  ASSERT_EQ(cached, 7 * 16);
  int full = 0;
  for (const auto& [index, group, block] : link.loads) {
    EXPECT_EQ(group, 1) << "windowed blocks never come from a tier";
    EXPECT_LT(index, 7);
    ++full;
  }
  EXPECT_EQ(full, 7);
  const SequenceKv& s = kv.tables(2);
  EXPECT_EQ(s.groups[0].num_released, 7) << "windowed keys start at the replay start";
  EXPECT_FALSE(s.cacheable);
  EXPECT_EQ(s.replay_start, 112);
  EXPECT_EQ(kv.num_swa_replays(), 1);
  // The replayed sequence caches nothing, in any group.
  const size_t offers = link.offers.size();
  ASSERT_TRUE(kv.allocate_slots(2, 112, static_cast<int32_t>(prompt.size()) - 112, 0));
  kv.commit(2, {prompt, {}}, static_cast<int32_t>(prompt.size()), "");
  EXPECT_EQ(link.offers.size(), offers);
  kv.check_integrity();
  // A hit too short to leave anything after the replay loads nothing.
  link.loads.clear();
  link.holds_blocks = 2;
  const auto short_prompt = iota_tokens(16 * 2 + 3, 9000);
  EXPECT_EQ(kv.admit(3, short_prompt, "", 0), 0);
  EXPECT_TRUE(link.loads.empty());
  kv.check_integrity();
}

// ------------------------------------------------ KvTiers with real bytes

class KvTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deepinfer-kv-tiers-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    backend_ = create_backend(DeviceType::CPU);
    spec_ = kv_test::small_kv_spec();
  }
  void TearDown() override { fs::remove_all(dir_); }

  KvTierOptions options(bool disk) {
    KvTierOptions o;
    o.host_bytes = 64 * spec_.bytes_per_page();
    if (disk) o.dir = dir_;
    o.fingerprint = "test model";
    return o;
  }
  fs::path dir_;
  std::unique_ptr<Backend> backend_;
  KvCacheSpec spec_;
};

TEST_F(KvTiersTest, ABlockMakesTheRoundTripThroughHostAndDisk) {
  const auto prompt = iota_tokens(16 * 2 + 1);
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16, "tenant");
  const KvTierQuery query{hashes, prompt, "tenant", 16, kGroup0};
  std::vector<uint8_t> expected0, expected1;
  {
    KvStorage kv(*backend_, spec_, 8);
    KvTiers tiers(*backend_, kv, options(true));
    fill_block(kv, 3, 17);
    fill_block(kv, 5, 91);
    expected0 = block_bytes(kv, 3);
    expected1 = block_bytes(kv, 5);
    const auto t0 = std::span(prompt).first(16), t1 = std::span(prompt).subspan(16, 16);
    EXPECT_TRUE(tiers.on_registered({0, 0, hashes[0], {}, "tenant", t0}, 3, 0));
    EXPECT_TRUE(tiers.on_registered({0, 1, hashes[1], hashes[0], "", t1}, 5, 0));
    EXPECT_TRUE(tiers.take_released_blocks().empty()) << "held until copied";
    tiers.step_launched(1);
    EXPECT_EQ(tiers.acquire(query, 0, 2), 0) << "not final before its step completes";
    tiers.release();
    tiers.step_completed(1);
    EXPECT_EQ(tiers.take_released_blocks(), (std::vector<int32_t>{3, 5}));
    EXPECT_FALSE(tiers.on_registered({0, 1, hashes[1], hashes[0], "", t1}, 4, 0)) << "already in the host tier";
    // From the host tier into other pages.
    ASSERT_EQ(tiers.acquire(query, 0, 2), 2);
    tiers.load(0, 0, 6);
    tiers.load(1, 0, 7);
    tiers.release();
    tiers.step_launched(2);
    tiers.step_completed(2);
    EXPECT_EQ(block_bytes(kv, 6), expected0);
    EXPECT_EQ(block_bytes(kv, 7), expected1);
    // Another salt does not see them.
    const auto other = PrefixCache::compute_block_hashes(prompt, 16, "other");
    EXPECT_EQ(tiers.acquire({other, prompt, "other", 16, kGroup0}, 0, 2), 0);
    tiers.release();
    EXPECT_EQ(tiers.stats().offloaded_blocks, 2);
    EXPECT_EQ(tiers.stats().loaded_blocks, 2);
  }  // the destructor finishes the disk writes
  // A new process: the host tier is empty, the disk has both blocks.
  KvStorage kv(*backend_, spec_, 8);
  KvTiers tiers(*backend_, kv, options(true));
  EXPECT_EQ(tiers.stats().disk.files, 2);
  EXPECT_EQ(tiers.acquire(query, 0, 2), 0);
  tiers.release();
  ASSERT_TRUE(tiers.prefetch(42, query, 0));
  for (int i = 0; i < 2000 && !tiers.prefetch_done(42); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(tiers.acquire(query, 0, 2), 2);
  tiers.load(0, 0, 1);
  tiers.load(1, 0, 2);
  tiers.release();
  tiers.device_idle();
  EXPECT_EQ(block_bytes(kv, 1), expected0);
  EXPECT_EQ(block_bytes(kv, 2), expected1);
  EXPECT_EQ(tiers.stats().prefetched_blocks, 2);
  // Nothing more to read once the host tier holds them.
  EXPECT_FALSE(tiers.prefetch(43, query, 0));
}

TEST_F(KvTiersTest, TheExportFenceOpensOnceEveryAcceptedBlockIsOnDiskAndAnotherProcessFindsThem) {
  // A prefill engine (`serve --role prefill`) answers after wait_persisted;
  // the decode engine, another process on the same directory, must then
  // find every block by prefetch without a restart.
  const int32_t n_blocks = 6;
  const auto prompt = iota_tokens(16 * n_blocks + 1);
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16, "");
  const KvTierQuery query{hashes, prompt, "", 16, kGroup0};
  KvStorage decode_kv(*backend_, spec_, 8);
  KvTiers decode(*backend_, decode_kv, options(true));  // started before the blocks exist
  KvStorage kv(*backend_, spec_, 8);
  KvTiers prefill(*backend_, kv, options(true));
  EXPECT_TRUE(prefill.wait_persisted(prefill.persist_ticket(), std::chrono::milliseconds(0))) << "nothing accepted yet";
  std::vector<std::vector<uint8_t>> expected;
  for (int32_t b = 0; b < n_blocks; ++b) {
    fill_block(kv, b, static_cast<uint8_t>(11 * b + 1));
    expected.push_back(block_bytes(kv, b));
    ASSERT_TRUE(prefill.on_registered(kv_test::prompt_block_ref(prompt, hashes, b), b, 0));
  }
  const uint64_t ticket = prefill.persist_ticket();
  EXPECT_EQ(ticket, static_cast<uint64_t>(n_blocks));
  EXPECT_FALSE(prefill.wait_persisted(ticket, std::chrono::milliseconds(20))) << "not even copied to the host yet";
  prefill.step_launched(1);
  prefill.step_completed(1);
  ASSERT_TRUE(prefill.wait_persisted(ticket, std::chrono::seconds(20)));
  EXPECT_EQ(prefill.stats().disk.stored, n_blocks);

  ASSERT_TRUE(decode.prefetch(7, query, 0));
  for (int i = 0; i < 5000 && !decode.prefetch_done(7); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(decode.acquire(query, 0, n_blocks), n_blocks);
  for (int32_t b = 0; b < n_blocks; ++b) decode.load(b, 0, b);
  decode.release();
  decode.device_idle();
  for (int32_t b = 0; b < n_blocks; ++b) EXPECT_EQ(block_bytes(decode_kv, b), expected[static_cast<size_t>(b)]) << b;
}

TEST_F(KvTiersTest, AnotherFingerprintReadsNothing) {
  const auto prompt = iota_tokens(16 + 1);
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16);
  {
    KvStorage kv(*backend_, spec_, 4);
    KvTiers tiers(*backend_, kv, options(true));
    fill_block(kv, 1, 5);
    tiers.on_registered({0, 0, hashes[0], {}, "", std::span(prompt).first(16)}, 1, 0);
  }
  KvStorage kv(*backend_, spec_, 4);
  KvTierOptions o = options(true);
  o.fingerprint = "another model";
  KvTiers tiers(*backend_, kv, o);
  EXPECT_FALSE(tiers.prefetch(1, {hashes, prompt, "", 16, kGroup0}, 0));
  EXPECT_EQ(tiers.stats().disk.files, 0);
}

}  // namespace
}  // namespace deepinfer
