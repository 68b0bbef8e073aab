// DiskKvTier: blocks survive the process, are verified by content, and every
// kind of damage (corrupt, truncated, deleted, half-written, expired, a
// vanished directory) is a miss, never wrong bytes and never a crash.
#include "kv/tiers/disk_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <tuple>
#include <numeric>
#include <vector>

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deepinfer-disk-tier-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  DiskKvTier::Options options(uint64_t capacity = 1 << 20, std::string fingerprint = "model-a f16 16x2x64") {
    return DiskKvTier::Options{dir_, std::move(fingerprint), capacity};
  }

  fs::path dir_;
};

struct Block {
  std::vector<int32_t> tokens;
  std::vector<std::byte> payload;
  KvBlockIdentity id;
};

Block make_block(uint64_t key, uint64_t parent, bool first, int32_t token_base, size_t payload_bytes,
                 std::string_view salt = {}) {
  Block b;
  b.tokens.resize(16);
  std::iota(b.tokens.begin(), b.tokens.end(), token_base);
  b.payload.resize(payload_bytes);
  for (size_t i = 0; i < payload_bytes; ++i) b.payload[i] = static_cast<std::byte>((i * 7 + key) & 0xFF);
  b.id = KvBlockIdentity{key, parent, first, salt, {}};
  return b;
}

KvBlockIdentity id_of(const Block& b) {
  KvBlockIdentity id = b.id;
  id.tokens = b.tokens;
  return id;
}

std::vector<std::byte> read_back(DiskKvTier& tier, const Block& b, bool* hit) {
  std::vector<std::byte> out(b.payload.size(), std::byte{0xEE});
  *hit = tier.get(id_of(b), out);
  return out;
}

TEST_F(DiskTierTest, BlocksSurviveTheProcessAndAreVerifiedByContent) {
  Block b0 = make_block(0x1111, 0, true, 100, 4096, "tenant-a");
  Block b1 = make_block(0x2222, 0x1111, false, 200, 4096);
  {
    DiskKvTier tier(options());
    ASSERT_TRUE(tier.enabled());
    EXPECT_TRUE(tier.put(id_of(b0), b0.payload, std::chrono::seconds(0)));
    EXPECT_TRUE(tier.put(id_of(b1), b1.payload, std::chrono::seconds(0)));
    EXPECT_EQ(tier.stats().stored, 2);
  }
  DiskKvTier again(options());  // a new process would index the same files
  EXPECT_TRUE(again.contains(0x1111) && again.contains(0x2222));
  bool hit = false;
  EXPECT_EQ(read_back(again, b0, &hit), b0.payload);
  EXPECT_TRUE(hit);
  EXPECT_EQ(read_back(again, b1, &hit), b1.payload);
  EXPECT_TRUE(hit);

  // The same key asked with other content is a miss (and the file stays).
  Block other_tokens = b1;
  other_tokens.tokens[3] += 1;
  read_back(again, other_tokens, &hit);
  EXPECT_FALSE(hit);
  Block other_parent = b1;
  other_parent.id.parent_key = 0x9999;
  read_back(again, other_parent, &hit);
  EXPECT_FALSE(hit);
  Block other_salt = b0;
  other_salt.id.salt = "tenant-b";
  read_back(again, other_salt, &hit);
  EXPECT_FALSE(hit);
  Block other_size = b0;
  other_size.payload.resize(100);
  read_back(again, other_size, &hit);
  EXPECT_FALSE(hit);
  EXPECT_TRUE(again.contains(0x2222));
  EXPECT_EQ(again.stats().hits, 2);
  EXPECT_EQ(again.stats().rejected, 0);
}

TEST_F(DiskTierTest, ModelsNeverReadEachOthersBlocks) {
  Block b = make_block(0x42, 0, true, 0, 512);
  DiskKvTier a(options(1 << 20, "model-a"));
  ASSERT_TRUE(a.put(id_of(b), b.payload, std::chrono::seconds(0)));
  DiskKvTier other(options(1 << 20, "model-a but fp8 KV"));
  bool hit = true;
  read_back(other, b, &hit);
  EXPECT_FALSE(hit);
  EXPECT_NE(a.folder(), other.folder());
}

TEST_F(DiskTierTest, DamagedFilesAreMissesAndAreRemoved) {
  DiskKvTier tier(options());
  std::vector<Block> blocks;
  for (uint64_t k = 1; k <= 4; ++k) blocks.push_back(make_block(k, k - 1, k == 1, int32_t(k * 16), 2048));
  for (const Block& b : blocks) ASSERT_TRUE(tier.put(id_of(b), b.payload, std::chrono::seconds(0)));
  auto path = [&](uint64_t key) {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.kvb", static_cast<unsigned long long>(key));
    return tier.folder() / name;
  };
  {  // one flipped payload byte
    std::fstream f(path(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x5A');
  }
  fs::resize_file(path(2), fs::file_size(path(2)) - 7);  // truncated
  fs::remove(path(3));                                     // deleted
  {  // a header-sized stub, as a torn copy might leave
    std::ofstream f(path(4), std::ios::binary | std::ios::trunc);
    f << "DIKVBLK1 torn";
  }
  for (const Block& b : blocks) {
    bool hit = true;
    read_back(tier, b, &hit);
    EXPECT_FALSE(hit) << b.id.key;
  }
  EXPECT_FALSE(fs::exists(path(1)));
  EXPECT_FALSE(fs::exists(path(2)));
  EXPECT_FALSE(fs::exists(path(4)));
  EXPECT_EQ(tier.stats().rejected, 3);
  EXPECT_EQ(tier.stats().files, 0);
  // The damaged blocks can be stored again.
  EXPECT_TRUE(tier.put(id_of(blocks[0]), blocks[0].payload, std::chrono::seconds(0)));
  bool hit = false;
  EXPECT_EQ(read_back(tier, blocks[0], &hit), blocks[0].payload);
  EXPECT_TRUE(hit);
}

// A hostile file under a block's name: the right magic, fingerprint and key,
// but lengths that point past the end or wrap around. Every one is a miss and
// is removed; nothing is read out of bounds.
TEST_F(DiskTierTest, HeadersWithLyingLengthsAreRejected) {
  Block b = make_block(7, 0, true, 0, 64);
  DiskKvTier tier(options());
  ASSERT_TRUE(tier.put(id_of(b), b.payload, std::chrono::seconds(0)));
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.kvb", 7ull);
  const fs::path path = tier.folder() / name;
  std::vector<char> good(fs::file_size(path));
  std::ifstream(path, std::ios::binary).read(good.data(), static_cast<std::streamsize>(good.size()));
  // Header offsets: n_tokens at 36, salt_bytes at 40, payload_bytes at 48.
  auto with = [&](size_t offset, uint64_t value, size_t width) {
    std::vector<char> f = good;
    std::memcpy(f.data() + offset, &value, width);
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(f.data(), static_cast<std::streamsize>(f.size()));
  };
  const std::vector<std::tuple<size_t, uint64_t, size_t>> lies = {
      {36, 0xFFFFFFFFu, 4}, {36, 1u << 19, 4}, {40, 0xFFFFFFFFu, 4},
      {48, ~uint64_t{0}, 8}, {48, ~uint64_t{0} - 60, 8}, {48, 1u << 30, 8}};
  for (const auto& [offset, value, width] : lies) {
    with(offset, value, width);
    bool hit = true;
    read_back(tier, b, &hit);
    EXPECT_FALSE(hit) << offset << " " << value;
    EXPECT_FALSE(fs::exists(path)) << offset << " " << value;
  }
  EXPECT_EQ(tier.stats().rejected, static_cast<int64_t>(lies.size()));
}

TEST_F(DiskTierTest, AWriterKilledBeforeItsRenameLeavesNothingBehind) {
  fs::path folder;
  {
    DiskKvTier tier(options());
    folder = tier.folder();
  }
  // What a killed writer leaves: a temporary file with part of a block.
  { std::ofstream(folder / ".tmp-0000000000000007-12345-0", std::ios::binary) << "partial block bytes"; }
  DiskKvTier tier(options());
  EXPECT_FALSE(fs::exists(folder / ".tmp-0000000000000007-12345-0"));
  EXPECT_EQ(tier.stats().files, 0);
}

TEST_F(DiskTierTest, CapacityEvictsTheLeastRecentlyUsed) {
  Block a = make_block(1, 0, true, 0, 3000), b = make_block(2, 1, false, 16, 3000),
        c = make_block(3, 2, false, 32, 3000);
  DiskKvTier tier(options(7000));  // two blocks with their headers fit, three do not
  ASSERT_TRUE(tier.put(id_of(a), a.payload, std::chrono::seconds(0)));
  ASSERT_TRUE(tier.put(id_of(b), b.payload, std::chrono::seconds(0)));
  bool hit = false;
  read_back(tier, a, &hit);  // a is now the most recent
  ASSERT_TRUE(hit);
  ASSERT_TRUE(tier.put(id_of(c), c.payload, std::chrono::seconds(0)));
  EXPECT_TRUE(tier.contains(1));
  EXPECT_FALSE(tier.contains(2));
  EXPECT_TRUE(tier.contains(3));
  EXPECT_EQ(tier.stats().evictions, 1);
  EXPECT_LE(tier.stats().bytes, 7000);
  // A block larger than the whole tier is refused, nothing evicted for it.
  Block huge = make_block(4, 3, false, 48, 8000);
  EXPECT_FALSE(tier.put(id_of(huge), huge.payload, std::chrono::seconds(0)));
  EXPECT_TRUE(tier.contains(1) && tier.contains(3));
}

std::chrono::system_clock::time_point g_now{std::chrono::seconds(1'800'000'000)};
std::chrono::system_clock::time_point test_clock() { return g_now; }

TEST_F(DiskTierTest, BlocksExpireAfterTheirTimeToLive) {
  Block a = make_block(1, 0, true, 0, 256), b = make_block(2, 1, false, 16, 256);
  {
    DiskKvTier tier(options());
    tier.set_clock_for_testing(test_clock);
    ASSERT_TRUE(tier.put(id_of(a), a.payload, std::chrono::seconds(60)));
    ASSERT_TRUE(tier.put(id_of(b), b.payload, std::chrono::seconds(3600)));
    g_now += std::chrono::seconds(61);
    bool hit = true;
    read_back(tier, a, &hit);
    EXPECT_FALSE(hit);
    EXPECT_FALSE(tier.contains(1));
    read_back(tier, b, &hit);
    EXPECT_TRUE(hit);
    EXPECT_EQ(tier.stats().expirations, 1);
  }
  // Indexed from disk by a later process: the expiry is read from the file.
  g_now += std::chrono::seconds(3600);
  DiskKvTier later(options());
  later.set_clock_for_testing(test_clock);
  EXPECT_TRUE(later.contains(2));
  later.remove_expired();
  EXPECT_FALSE(later.contains(2));
  EXPECT_EQ(later.stats().expirations, 1);
}

TEST_F(DiskTierTest, AVanishedOrUnusableDirectoryDegradesWithoutThrowing) {
  Block a = make_block(1, 0, true, 0, 256);
  DiskKvTier tier(options());
  ASSERT_TRUE(tier.enabled());
  fs::remove_all(dir_);  // e.g. an unmounted file system
  EXPECT_FALSE(tier.put(id_of(a), a.payload, std::chrono::seconds(0)));
  EXPECT_EQ(tier.stats().write_errors, 1);
  bool hit = true;
  read_back(tier, a, &hit);
  EXPECT_FALSE(hit);

  // A path that is a file, not a directory: the tier is off.
  { std::ofstream(dir_.string() + "-file") << "not a directory"; }
  DiskKvTier off(DiskKvTier::Options{dir_.string() + "-file", "m", 1 << 20});
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.put(id_of(a), a.payload, std::chrono::seconds(0)));
  read_back(off, a, &hit);
  EXPECT_FALSE(hit);
  fs::remove(dir_.string() + "-file");
}

TEST_F(DiskTierTest, ABlockWrittenByAnotherProcessIsFoundWithoutARestart) {
  Block a = make_block(9, 0, true, 0, 1024);
  DiskKvTier reader(options());
  DiskKvTier writer(options());  // another replica sharing the directory
  ASSERT_TRUE(writer.put(id_of(a), a.payload, std::chrono::seconds(0)));
  EXPECT_FALSE(reader.contains(9));
  bool hit = false;
  EXPECT_EQ(read_back(reader, a, &hit), a.payload);
  EXPECT_TRUE(hit);
  EXPECT_TRUE(reader.contains(9));
}

TEST_F(DiskTierTest, DiscoverFindsAnotherProcesssBlockByItsFileOnly) {
  // How a decode engine's prefetch learns of the blocks a prefill engine exported.
  Block a = make_block(11, 0, true, 0, 512);
  DiskKvTier reader(options());
  DiskKvTier writer(options());
  EXPECT_FALSE(reader.discover(11));
  ASSERT_TRUE(writer.put(id_of(a), a.payload, std::chrono::seconds(0)));
  EXPECT_FALSE(reader.contains(11));
  EXPECT_TRUE(reader.discover(11));
  EXPECT_TRUE(reader.contains(11));  // indexed now
  EXPECT_FALSE(reader.discover(12));
  bool hit = false;
  EXPECT_EQ(read_back(reader, a, &hit), a.payload);
  EXPECT_TRUE(hit);
}

}  // namespace
}  // namespace deepinfer
