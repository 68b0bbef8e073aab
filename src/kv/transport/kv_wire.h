// The messages of the cross-node KV transport (kv/transport/ucx_kv_*.h): a
// decode engine asks a prefill engine for a request's prompt blocks by their
// identities; the prefill engine answers with the leading run of those it
// holds, payloads in request order, in one or more replies.
//
//   fetch request  (decode -> prefill): KvFetchRequest, encoded below
//   fetch reply    (prefill -> decode): KvFetchReplyHeader + payloads of
//                  blocks [first, first + count) of the request
//
// Everything read off the wire is bounds-checked: a malformed message is an
// Error, never a read past its end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

inline constexpr uint32_t kKvWireMagic = 0x4b56444e;  // "NDVK"
inline constexpr uint32_t kKvWireVersion = 1;
// Bounds on what one request may ask for (a peer's request beyond them is refused).
inline constexpr size_t kKvWireMaxBlocks = size_t{1} << 16;
inline constexpr size_t kKvWireMaxTokensPerBlock = 4096;
inline constexpr size_t kKvWireMaxText = 4096;  // fingerprint, salt
inline constexpr size_t kKvWireMaxRequestBytes = size_t{64} << 20;
// Active-message ids of the two messages.
inline constexpr unsigned kKvFetchRequestMessage = 0x4b1;
inline constexpr unsigned kKvFetchReplyMessage = 0x4b2;

struct KvWireBlock {
  uint64_t key = 0;
  uint64_t parent_key = 0;
  bool first = false;
  std::vector<int32_t> tokens;
};

struct KvFetchRequest {
  uint64_t fetch_id = 0;
  uint64_t block_bytes = 0;  // what the asker's blocks hold: the answerer's must match
  std::string fingerprint;   // kv_cache_fingerprint: model, weights, KV dtype and layout
  std::string salt;          // the request's cache salt (verifies block 0)
  std::vector<KvWireBlock> blocks;
};

enum class KvFetchStatus : uint32_t {
  Ok = 0,
  Refused = 1,      // another model or layout, or a malformed request
  Unavailable = 2,  // the engine is still loading
};

// Fixed-size header of a reply (the payloads follow as the message's data).
struct KvFetchReplyHeader {
  uint32_t magic = kKvWireMagic;
  uint32_t status = 0;  // KvFetchStatus
  uint64_t fetch_id = 0;
  uint32_t first = 0;   // index of the first block in this reply
  uint32_t count = 0;   // blocks in this reply
  uint32_t found = 0;   // blocks the whole answer carries (the leading run found)
  uint32_t reserved = 0;
};
static_assert(sizeof(KvFetchReplyHeader) == 32);

std::vector<std::byte> encode_fetch_request(const KvFetchRequest& r);
// Throws Error on anything malformed or beyond the bounds above.
KvFetchRequest decode_fetch_request(std::span<const std::byte> bytes);

// The reply header, checked for its magic and for the blocks fitting in a
// request of `requested` blocks; throws Error otherwise.
KvFetchReplyHeader decode_fetch_reply_header(std::span<const std::byte> bytes, size_t requested);

// "ucx://host:port" -> host and port; throws Error on anything else.
struct KvSourceAddress {
  std::string host;
  uint16_t port = 0;
};
KvSourceAddress parse_kv_source_address(std::string_view source);
std::string format_kv_source_address(std::string_view host, uint16_t port);

}  // namespace deepinfer
