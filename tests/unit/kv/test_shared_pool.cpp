// The shared KV pool (kv/tiers/shared_pool.h), the one-node transport from a
// prefill engine to a decode engine: slots published by the creator and found
// by content through a second mapping of the segment, pins that keep a slot
// from reuse, refusal of segments that are not pools of this model and
// layout, and KvTiers exporting through a pool that another KvTiers imports
// from, bytes compared.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_storage.h"
#include "kv/prefix_cache.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/tiers/shared_pool.h"
#include "kv_test_util.h"

namespace deepinfer {
namespace {

using kv_test::block_bytes;
using kv_test::fill_block;
using kv_test::iota_tokens;


SharedKvPool::Options pool_options(int64_t capacity = 4) {
  return SharedKvPool::Options{"model A; kv f32 page 16", 64, capacity, 16};
}

TEST(SharedKvPool, ABlockPublishedByTheCreatorIsFoundByContentThroughAnotherMapping) {
  auto backend = create_backend(DeviceType::CPU);
  auto creator = SharedKvPool::create(*backend, pool_options());
  ASSERT_TRUE(SharedKvPool::valid_name(creator->name())) << creator->name();
  auto reader = SharedKvPool::attach(*backend, creator->name(), pool_options(0));
  ASSERT_NE(reader, nullptr);
  EXPECT_FALSE(reader->is_creator());
  EXPECT_TRUE(reader->creator_alive());
  EXPECT_EQ(reader->capacity_blocks(), 4);

  const auto tokens = iota_tokens(16);
  const KvBlockIdentity first{11, 0, true, "tenant", tokens};
  const auto slot = creator->reserve(first, 0);
  ASSERT_TRUE(slot.has_value());
  EXPECT_TRUE(reader->contains(11)) << "a slot being filled holds its key";
  EXPECT_EQ(reader->find_and_pin(first), -1) << "but is not found until published";
  EXPECT_FALSE(creator->reserve(first, 0).has_value()) << "one slot per key";
  std::memset(creator->payload(*slot).data(), 0x3C, 64);
  creator->publish(*slot);

  const int32_t hit = reader->find_and_pin(first);
  ASSERT_EQ(hit, *slot);
  EXPECT_NE(reader->payload(hit).data(), creator->payload(hit).data()) << "two mappings of one segment";
  EXPECT_EQ(static_cast<int>(reader->payload(hit)[0]), 0x3C);
  EXPECT_EQ(static_cast<int>(reader->payload(hit)[63]), 0x3C);
  const KvBlockIdentity seen = reader->identity(hit);
  EXPECT_EQ(seen.salt, "tenant");
  EXPECT_TRUE(std::equal(seen.tokens.begin(), seen.tokens.end(), tokens.begin()));
  reader->unpin(hit);

  // Same key, other content: another salt, other tokens, a non-first block.
  EXPECT_EQ(reader->find_and_pin({11, 0, true, "other", tokens}), -1);
  const auto other_tokens = iota_tokens(16, 7);
  EXPECT_EQ(reader->find_and_pin({11, 0, true, "tenant", other_tokens}), -1);
  EXPECT_EQ(reader->find_and_pin({11, 3, false, "", tokens}), -1);
  // A later block is verified by its parent's key.
  const KvBlockIdentity second{12, 11, false, "", tokens};
  const auto s2 = creator->reserve(second, 0);
  ASSERT_TRUE(s2.has_value());
  creator->publish(*s2);
  EXPECT_EQ(reader->find_and_pin({12, 99, false, "", tokens}), -1);
  const int32_t h2 = reader->find_and_pin(second);
  EXPECT_EQ(h2, *s2);
  reader->unpin(h2);
  EXPECT_EQ(reader->stats().hits, 2);
  EXPECT_EQ(creator->stats().blocks, 2);
  EXPECT_EQ(creator->stats().stored, 2);
  // An expired block is a miss; a salt too long to share is not stored.
  const KvBlockIdentity old{13, 12, false, "", tokens};
  const auto s3 = creator->reserve(old, 1);  // expired in 1970
  ASSERT_TRUE(s3.has_value());
  creator->publish(*s3);
  EXPECT_EQ(reader->find_and_pin(old), -1);
  const std::string long_salt(200, 's');
  EXPECT_FALSE(creator->reserve({14, 0, true, long_salt, tokens}, 0).has_value());
}

TEST(SharedKvPool, AReaderPinKeepsASlotFromReuseAndTheLeastRecentlyUsedGoesFirst) {
  auto backend = create_backend(DeviceType::CPU);
  auto creator = SharedKvPool::create(*backend, pool_options(2));
  auto reader = SharedKvPool::attach(*backend, creator->name(), pool_options(0));
  ASSERT_NE(reader, nullptr);
  const auto tokens = iota_tokens(16);
  auto id = [&](uint64_t key) { return KvBlockIdentity{key, 0, true, "", tokens}; };
  creator->publish(*creator->reserve(id(1), 0));
  creator->publish(*creator->reserve(id(2), 0));
  const int32_t pinned = reader->find_and_pin(id(1));  // 1 is now the more recently used too
  ASSERT_GE(pinned, 0);
  // Full: the unpinned 2 goes, never the pinned 1.
  const auto s3 = creator->reserve(id(3), 0);
  ASSERT_TRUE(s3.has_value());
  creator->publish(*s3);
  EXPECT_TRUE(reader->contains(1));
  EXPECT_FALSE(reader->contains(2));
  EXPECT_EQ(creator->stats().evictions, 1);
  // 1 pinned, 3 pinned: nothing to give.
  const int32_t p3 = reader->find_and_pin(id(3));
  ASSERT_GE(p3, 0);
  EXPECT_FALSE(creator->reserve(id(4), 0).has_value());
  EXPECT_EQ(creator->stats().full, 1);
  reader->unpin(pinned);
  reader->unpin(p3);
  // Unpinned, 1 is the least recently used now (3 was pinned later).
  creator->publish(*creator->reserve(id(4), 0));
  EXPECT_FALSE(reader->contains(1));
  EXPECT_TRUE(reader->contains(3));
  EXPECT_TRUE(reader->contains(4));
  // Keys come and go many times without the index filling with tombstones.
  for (uint64_t k = 100; k < 400; ++k) {
    const auto s = creator->reserve(id(k), 0);
    ASSERT_TRUE(s.has_value()) << k;
    creator->publish(*s);
    ASSERT_TRUE(reader->contains(k));
  }
}

TEST(SharedKvPool, RefusesWhatIsNotAPoolOfThisModelAndLayout) {
  auto backend = create_backend(DeviceType::CPU);
  for (const char* bad : {"", "x", "deepinfer-kv-", "deepinfer-kv-12", "deepinfer-kv-1-", "deepinfer-kv-a-1",
                          "deepinfer-kv-1-2/../x", "../deepinfer-kv-1-2", "deepinfer-kv-12345678901-1"}) {
    EXPECT_FALSE(SharedKvPool::valid_name(bad)) << bad;
    EXPECT_EQ(SharedKvPool::attach(*backend, bad, pool_options(0)), nullptr) << bad;
  }
  EXPECT_EQ(SharedKvPool::attach(*backend, "deepinfer-kv-999999999-0", pool_options(0)), nullptr) << "missing";

  auto creator = SharedKvPool::create(*backend, pool_options());
  SharedKvPool::Options other = pool_options(0);
  other.fingerprint = "model B; kv f32 page 16";
  EXPECT_EQ(SharedKvPool::attach(*backend, creator->name(), other), nullptr) << "another model";
  other = pool_options(0);
  other.block_bytes = 128;
  EXPECT_EQ(SharedKvPool::attach(*backend, creator->name(), other), nullptr) << "other block bytes";
  other = pool_options(0);
  other.block_tokens = 32;
  EXPECT_EQ(SharedKvPool::attach(*backend, creator->name(), other), nullptr) << "other block tokens";

  // A segment of the right name whose header is damaged.
  const std::string fake = "deepinfer-kv-" + std::to_string(::getpid()) + "-999999";
  const int fd = ::shm_open(("/" + fake).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> junk(1 << 16, 'D');
  std::memcpy(junk.data(), "DIKVPOOL", 8);  // the magic, then nonsense
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  EXPECT_EQ(SharedKvPool::attach(*backend, fake, pool_options(0)), nullptr);
  ::shm_unlink(("/" + fake).c_str());

  // A segment left by a process that died without removing it goes when
  // the next pool is created.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const std::string orphan = "/deepinfer-kv-" + std::to_string(child) + "-0";
  const int ofd = ::shm_open(orphan.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(ofd, 0);
  ::close(ofd);
  auto next = SharedKvPool::create(*backend, pool_options());
  EXPECT_LT(::shm_open(orphan.c_str(), O_RDONLY, 0), 0) << "the orphan is removed";

  // The creator's end removes the segment.
  const std::string name = creator->name();
  creator.reset();
  EXPECT_EQ(SharedKvPool::attach(*backend, name, pool_options(0)), nullptr);
}

// ------------------------------------------------ KvTiers across a pool

class SharedKvTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = create_backend(DeviceType::CPU);
    spec_ = kv_test::small_kv_spec();
  }
  KvTierOptions options() const {
    KvTierOptions o;
    o.fingerprint = "test model";
    return o;
  }
  std::unique_ptr<Backend> backend_;
  KvCacheSpec spec_;
};

TEST_F(SharedKvTiersTest, ThePrefillSideExportsThroughItsPoolAndTheDecodeSideLoadsFromIt) {
  const int32_t n_blocks = 5;
  const auto prompt = iota_tokens(16 * n_blocks + 1);
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16, "");
  const std::vector<int32_t> groups = {0};
  const KvTierQuery query{hashes, prompt, "", 16, groups};

  KvStorage prefill_kv(*backend_, spec_, 8);
  KvTierOptions po = options();
  po.shared_pool_bytes = 16 * spec_.bytes_per_page();
  KvTiers prefill(*backend_, prefill_kv, po);
  ASSERT_FALSE(prefill.shared_pool_name().empty());
  EXPECT_TRUE(prefill.exports());
  EXPECT_FALSE(prefill.disk_enabled());

  KvStorage decode_kv(*backend_, spec_, 8);
  KvTierOptions d_opts = options();
  d_opts.import_shared = true;
  KvTiers decode(*backend_, decode_kv, d_opts);
  EXPECT_TRUE(decode.shared_pool_name().empty());
  EXPECT_FALSE(decode.exports());

  std::vector<std::vector<uint8_t>> expected;
  for (int32_t b = 0; b < n_blocks; ++b) {
    fill_block(prefill_kv, b, static_cast<uint8_t>(7 * b + 3));
    expected.push_back(block_bytes(prefill_kv, b));
    ASSERT_TRUE(prefill.on_registered(kv_test::prompt_block_ref(prompt, hashes, b), b, 0));
  }
  const uint64_t ticket = prefill.persist_ticket();
  EXPECT_EQ(ticket, static_cast<uint64_t>(n_blocks)) << "the fence counts pool exports";
  EXPECT_FALSE(prefill.wait_persisted(ticket, std::chrono::milliseconds(10))) << "not copied yet";
  prefill.step_launched(1);
  prefill.step_completed(1);
  ASSERT_TRUE(prefill.wait_persisted(ticket, std::chrono::seconds(5)));

  // Before attaching the decode side finds nothing; after, every block.
  EXPECT_EQ(decode.acquire(query, 0, n_blocks), 0);
  decode.release();
  ASSERT_TRUE(decode.attach_peer(prefill.shared_pool_name()));
  ASSERT_TRUE(decode.attach_peer(prefill.shared_pool_name())) << "attaching again keeps the one mapping";
  EXPECT_EQ(decode.stats().peers, 1);
  EXPECT_FALSE(decode.attach_peer("deepinfer-kv-999999999-1"));
  ASSERT_EQ(decode.acquire(query, 0, n_blocks), n_blocks);
  for (int32_t b = 0; b < n_blocks; ++b) decode.load(b, 0, 7 - b);
  decode.release();
  decode.step_launched(1);
  decode.step_completed(1);
  for (int32_t b = 0; b < n_blocks; ++b) EXPECT_EQ(block_bytes(decode_kv, 7 - b), expected[static_cast<size_t>(b)]) << b;
  EXPECT_EQ(decode.stats().peer_loaded_blocks, n_blocks);
  EXPECT_EQ(decode.stats().loaded_blocks, n_blocks);
  EXPECT_EQ(decode.stats().timed_load_bytes, n_blocks * static_cast<int64_t>(decode_kv.bytes_per_block()))
      << "the batch of loads was timed";
  // Another salt finds nothing there.
  const auto other = PrefixCache::compute_block_hashes(prompt, 16, "other");
  EXPECT_EQ(decode.acquire({other, prompt, "other", 16, groups}, 0, n_blocks), 0);
  decode.release();

  // An engine not told to import maps nothing.
  KvStorage plain_kv(*backend_, spec_, 8);
  KvTiers plain(*backend_, plain_kv, options());
  EXPECT_FALSE(plain.attach_peer(prefill.shared_pool_name()));
  // Another model's engine is refused the pool.
  KvTierOptions o2 = options();
  o2.fingerprint = "another model";
  o2.import_shared = true;
  KvStorage other_kv(*backend_, spec_, 8);
  KvTiers other_model(*backend_, other_kv, o2);
  EXPECT_FALSE(other_model.attach_peer(prefill.shared_pool_name()));
}

}  // namespace
}  // namespace deepinfer
