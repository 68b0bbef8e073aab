// The cross-node KV transport (kv/transport): the wire format's round trip
// and its refusals of malformed bytes, source addresses, and a UCX server
// and client on localhost — KvTiers exporting its host tier and another
// KvTiers fetching a prompt's prefix from it, bytes compared; the leading
// run when only part is there; refusals (another model, an untrusted host);
// a source with nothing listening; and a long fetch of large blocks that
// takes several replies by rendezvous.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_storage.h"
#include "kv/prefix_cache.h"
#include "kv/tiers/host_tier.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/transport/kv_wire.h"
#include "kv/transport/ucx_kv_client.h"
#include "kv/transport/ucx_kv_server.h"
#include "kv_test_util.h"

namespace deepinfer {
namespace {

using kv_test::block_bytes;
using kv_test::fill_block;
using kv_test::iota_tokens;

KvFetchRequest sample_request() {
  KvFetchRequest r;
  r.fetch_id = 42;
  r.block_bytes = 4096;
  r.fingerprint = "weights 0123; kv f16";
  r.salt = "tenant-7";
  r.blocks.push_back({11, 0, true, iota_tokens(16)});
  r.blocks.push_back({12, 11, false, iota_tokens(16, 116)});
  return r;
}

TEST(KvWire, AFetchRequestSurvivesTheRoundTrip) {
  const KvFetchRequest r = sample_request();
  const KvFetchRequest back = decode_fetch_request(encode_fetch_request(r));
  EXPECT_EQ(back.fetch_id, 42u);
  EXPECT_EQ(back.block_bytes, 4096u);
  EXPECT_EQ(back.fingerprint, r.fingerprint);
  EXPECT_EQ(back.salt, r.salt);
  ASSERT_EQ(back.blocks.size(), 2u);
  EXPECT_TRUE(back.blocks[0].first);
  EXPECT_FALSE(back.blocks[1].first);
  EXPECT_EQ(back.blocks[1].key, 12u);
  EXPECT_EQ(back.blocks[1].parent_key, 11u);
  EXPECT_EQ(back.blocks[1].tokens, r.blocks[1].tokens);
}

TEST(KvWire, MalformedRequestsAreErrorsNotReadsPastTheEnd) {
  const std::vector<std::byte> good = encode_fetch_request(sample_request());
  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_THROW(decode_fetch_request(std::span(good).first(n)), Error) << n;
  }
  // Trailing bytes, a bad magic, another version.
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  EXPECT_THROW(decode_fetch_request(longer), Error);
  std::vector<std::byte> bad = good;
  bad[0] = std::byte{0};
  EXPECT_THROW(decode_fetch_request(bad), Error);
  bad = good;
  bad[4] = std::byte{9};
  EXPECT_THROW(decode_fetch_request(bad), Error);
  // A block count far beyond the message.
  KvFetchRequest r = sample_request();
  r.blocks.clear();
  std::vector<std::byte> empty = encode_fetch_request(r);
  const uint32_t lie = 60000;
  std::memcpy(empty.data() + empty.size() - 4, &lie, 4);
  EXPECT_THROW(decode_fetch_request(empty), Error);
  // A block of zero tokens.
  r = sample_request();
  r.blocks[0].tokens.clear();
  EXPECT_THROW(decode_fetch_request(encode_fetch_request(r)), Error);
}

TEST(KvWire, ReplyHeadersAreCheckedAgainstTheRequest) {
  KvFetchReplyHeader h;
  h.fetch_id = 3;
  h.found = 4;
  h.first = 2;
  h.count = 2;
  auto bytes = [&] { return std::span(reinterpret_cast<const std::byte*>(&h), sizeof h); };
  EXPECT_EQ(decode_fetch_reply_header(bytes(), 4).count, 2u);
  EXPECT_THROW(decode_fetch_reply_header(bytes(), 3), Error) << "more found than asked for";
  h.count = 3;
  EXPECT_THROW(decode_fetch_reply_header(bytes(), 4), Error) << "past the blocks found";
  h.count = 2;
  h.magic = 0;
  EXPECT_THROW(decode_fetch_reply_header(bytes(), 4), Error);
  h.magic = kKvWireMagic;
  h.status = 77;
  EXPECT_THROW(decode_fetch_reply_header(bytes(), 4), Error);
  EXPECT_THROW(decode_fetch_reply_header(bytes().first(8), 4), Error);
}

TEST(KvWire, SourceAddresses) {
  const KvSourceAddress a = parse_kv_source_address("ucx://10.0.0.5:13337");
  EXPECT_EQ(a.host, "10.0.0.5");
  EXPECT_EQ(a.port, 13337);
  const KvSourceAddress v6 = parse_kv_source_address("ucx://[fd00::1]:80");
  EXPECT_EQ(v6.host, "fd00::1");
  EXPECT_EQ(format_kv_source_address("fd00::1", 80), "ucx://[fd00::1]:80");
  EXPECT_EQ(format_kv_source_address("node-3", 9), "ucx://node-3:9");
  for (const char* bad : {"", "ucx://", "ucx://host", "ucx://host:0", "ucx://host:70000", "ucx://:5", "http://h:5",
                          "ucx://h/x:5", "ucx://h:5x", "ucx://[::1]5", "deepinfer-kv-1-2"}) {
    EXPECT_THROW(parse_kv_source_address(bad), Error) << bad;
  }
}

// ------------------------------------------------ KvTiers across UCX

class UcxKvTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = create_backend(DeviceType::CPU);
    spec_ = kv_test::small_kv_spec();
  }
  KvTierOptions options(const char* fingerprint = "test model") const {
    KvTierOptions o;
    o.fingerprint = fingerprint;
    o.host_bytes = 32 * spec_.bytes_per_page();
    return o;
  }
  // Waits for a request's prefetch to finish (the transport always ends it).
  static bool wait_done(KvTiers& t, uint64_t request) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (t.prefetch_done(request)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  std::unique_ptr<Backend> backend_;
  KvCacheSpec spec_;
};

TEST_F(UcxKvTiersTest, ADecodeEngineFetchesAPromptsBlocksFromThePrefillEngine) {
  const int32_t n_blocks = 5;
  const auto prompt = iota_tokens(16 * n_blocks + 1);
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16, "");
  const std::vector<int32_t> groups = {0};
  const KvTierQuery query{hashes, prompt, "", 16, groups};

  KvStorage prefill_kv(*backend_, spec_, 8);
  KvTiers prefill(*backend_, prefill_kv, options());
  EXPECT_FALSE(prefill.exports());
  UcxKvServer server(prefill.export_pool(), prefill.fingerprint(), "127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  const std::string source = format_kv_source_address("127.0.0.1", server.port());
  prefill.set_export_source(source);
  EXPECT_TRUE(prefill.exports());
  EXPECT_EQ(prefill.export_source(), source);

  // The prefill engine computes four of the five blocks.
  std::vector<std::vector<uint8_t>> expected;
  for (int32_t b = 0; b < n_blocks - 1; ++b) {
    fill_block(prefill_kv, b, static_cast<uint8_t>(5 * b + 1));
    expected.push_back(block_bytes(prefill_kv, b));
    ASSERT_TRUE(prefill.on_registered(kv_test::prompt_block_ref(prompt, hashes, b), b, 0));
  }
  const uint64_t ticket = prefill.persist_ticket();
  EXPECT_EQ(ticket, static_cast<uint64_t>(n_blocks - 1)) << "the fence counts the exported host blocks";
  prefill.step_launched(1);
  prefill.step_completed(1);
  ASSERT_TRUE(prefill.wait_persisted(ticket, std::chrono::seconds(5)));

  KvStorage decode_kv(*backend_, spec_, 8);
  KvTiers decode(*backend_, decode_kv, options());
  EXPECT_FALSE(decode.prefetch_remote(1, query, 0, source)) << "no fetcher: nothing fetched";
  decode.set_remote_fetcher(std::make_unique<UcxKvClient>(), {"127.0.0.1"});
  ASSERT_TRUE(decode.prefetch_remote(1, query, 0, source));
  ASSERT_TRUE(wait_done(decode, 1));
  // The leading four blocks landed in the host tier; the fifth is recomputed.
  ASSERT_EQ(decode.acquire(query, 0, n_blocks), n_blocks - 1);
  for (int32_t b = 0; b < n_blocks - 1; ++b) decode.load(b, 0, 7 - b);
  decode.release();
  decode.step_launched(1);
  decode.step_completed(1);
  for (int32_t b = 0; b < n_blocks - 1; ++b) {
    EXPECT_EQ(block_bytes(decode_kv, 7 - b), expected[static_cast<size_t>(b)]) << b;
  }
  const KvTierStats s = decode.stats();
  EXPECT_TRUE(s.remote_enabled);
  EXPECT_EQ(s.remote.fetches, 1);
  EXPECT_EQ(s.remote.failed, 0);
  EXPECT_EQ(s.remote.blocks, n_blocks - 1);
  EXPECT_EQ(s.remote.bytes, (n_blocks - 1) * static_cast<int64_t>(decode_kv.bytes_per_block()));
  EXPECT_EQ(server.stats().blocks_sent, n_blocks - 1);
  EXPECT_GT(s.cost.network_gb_per_s, 0.0) << "the fetch was timed";

  // Blocks the host tier already holds are not fetched again.
  EXPECT_FALSE(decode.prefetch_remote(2, {hashes, std::span(prompt).first(16 * 4 + 1), "", 16, groups}, 0, source));
  // Another salt: asked for, none found.
  const auto salted = PrefixCache::compute_block_hashes(prompt, 16, "s");
  ASSERT_TRUE(decode.prefetch_remote(3, {salted, prompt, "s", 16, groups}, 0, source));
  ASSERT_TRUE(wait_done(decode, 3));
  EXPECT_EQ(decode.acquire({salted, prompt, "s", 16, groups}, 0, n_blocks), 0);
  decode.release();
  // Sources the engine does not trust, or cannot parse, are not contacted.
  const int64_t fetches = decode.stats().remote.fetches;
  EXPECT_FALSE(decode.prefetch_remote(4, {salted, prompt, "s", 16, groups}, 0,
                                      format_kv_source_address("localhost", server.port())));
  EXPECT_FALSE(decode.prefetch_remote(5, {salted, prompt, "s", 16, groups}, 0, "ucx://127.0.0.1"));
  EXPECT_EQ(decode.stats().remote_refused_sources, 2);
  EXPECT_EQ(decode.stats().remote.fetches, fetches);

  // Another model's engine is refused: its fetch ends with nothing.
  KvStorage other_kv(*backend_, spec_, 8);
  KvTiers other(*backend_, other_kv, options("another model"));
  other.set_remote_fetcher(std::make_unique<UcxKvClient>(), {"127.0.0.1"});
  ASSERT_TRUE(other.prefetch_remote(1, query, 0, source));
  ASSERT_TRUE(wait_done(other, 1));
  EXPECT_EQ(other.acquire(query, 0, n_blocks), 0);
  other.release();
  EXPECT_EQ(other.stats().remote.failed, 1);
  EXPECT_GE(server.stats().refused, 1);
}

TEST_F(UcxKvTiersTest, AFetchFromAnEngineThatIsGoneEndsEmpty) {
  const auto prompt = iota_tokens(16 * 3 + 1);
  const auto hashes = PrefixCache::compute_block_hashes(prompt, 16, "");
  const std::vector<int32_t> groups = {0};
  KvStorage decode_kv(*backend_, spec_, 8);
  KvTiers decode(*backend_, decode_kv, options());
  decode.set_remote_fetcher(std::make_unique<UcxKvClient>(std::chrono::seconds(10)), {"127.0.0.1"});
  uint16_t port = 0;
  {
    // A server that has stopped: its port is free again.
    KvStorage kv(*backend_, spec_, 8);
    KvTiers t(*backend_, kv, options());
    UcxKvServer gone(t.export_pool(), t.fingerprint(), "127.0.0.1", 0);
    port = gone.port();
  }
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(decode.prefetch_remote(1, {hashes, prompt, "", 16, groups}, 0, format_kv_source_address("127.0.0.1", port)));
  ASSERT_TRUE(wait_done(decode, 1));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "a refused connection, not a timeout";
  EXPECT_EQ(decode.acquire({hashes, prompt, "", 16, groups}, 0, 3), 0);
  decode.release();
  EXPECT_EQ(decode.stats().remote.failed, 1);
  // The slots it had reserved are free again: the whole tier can be filled.
  EXPECT_EQ(decode.stats().host.blocks, 0);
}

TEST(UcxKvTransport, ALongFetchOfLargeBlocksTakesSeveralRepliesAndLandsIntact) {
  auto backend = create_backend(DeviceType::CPU);
  const size_t bytes = size_t{256} << 10;  // 256 KiB blocks: rendezvous
  const int32_t n = 150;                   // more than one reply's worth
  auto pool = std::make_shared<HostKvTier>(*backend, bytes, n + 2);
  std::vector<std::vector<int32_t>> tokens;
  KvFetchRequest request;
  request.block_bytes = bytes;
  request.fingerprint = "big model";
  for (int32_t b = 0; b < n; ++b) {
    tokens.push_back(iota_tokens(16, 16 * b));
    const KvBlockIdentity id{1000u + static_cast<uint64_t>(b), b ? 999u + static_cast<uint64_t>(b) : 0u, b == 0, "",
                             tokens.back()};
    const std::optional<int32_t> slot = pool->reserve(id, 0);
    ASSERT_TRUE(slot);
    std::span<std::byte> p = pool->payload(*slot);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>((i * 7 + static_cast<size_t>(b)) & 0xff);
    pool->publish(*slot);
    request.blocks.push_back({id.key, id.parent_key, id.first, tokens.back()});
  }
  UcxKvServer server(pool, "big model", "127.0.0.1", 0);
  UcxKvClient client;
  std::vector<std::vector<std::byte>> dest(n, std::vector<std::byte>(bytes));
  std::vector<std::span<std::byte>> spans(dest.begin(), dest.end());
  std::promise<size_t> received;
  client.fetch({"127.0.0.1", server.port()}, request, spans, [&](size_t got) { received.set_value(got); });
  auto fut = received.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_EQ(fut.get(), static_cast<size_t>(n));
  for (int32_t b = 0; b < n; ++b) {
    for (size_t i = 0; i < bytes; i += 4099) {
      ASSERT_EQ(dest[static_cast<size_t>(b)][i], static_cast<std::byte>((i * 7 + static_cast<size_t>(b)) & 0xff))
          << "block " << b << " byte " << i;
    }
  }
  EXPECT_EQ(server.stats().blocks_sent, n);
  EXPECT_EQ(client.stats().blocks, n);
  EXPECT_EQ(client.stats().connections, 1);
  // Every slot the server pinned for sending has been let go: the whole
  // pool can be taken by other blocks (a pinned slot is never reused).
  for (int32_t b = 0; b < n + 2; ++b) {
    const auto t = iota_tokens(16, 7);
    ASSERT_TRUE(pool->reserve({5000u + static_cast<uint64_t>(b), 0, true, "", t}, 0)) << b;
  }
}

}  // namespace
}  // namespace deepinfer
