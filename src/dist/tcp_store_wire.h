// The TCP store's frames (src/dist/tcp_store.h), kept apart from the sockets
// so the decoders can be fuzzed (tests/fuzz/fuzz_tcp_store.cpp).
//
// Every frame is a little-endian u32 body length, then the body.
//   request body: u8 op, then
//     Set:  u32 key length, key, u32 value length, value
//     Get:  u32 key length, key
//     Wait: u32 key count, then per key: u32 key length, key
//   reply body: u8 status, then the payload: the value of a Get, an error
//     message when the status is Error, nothing otherwise.
// The server answers a Get or Wait once its keys exist; the client bounds the
// wait. Every length is checked against the limits below before anything is
// read or allocated: a frame that breaks one is an error, not a big allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace deepinfer {

constexpr size_t kStoreMaxKeyBytes = 4 << 10;
constexpr size_t kStoreMaxValueBytes = 64 << 20;
constexpr size_t kStoreMaxWaitKeys = 1024;
constexpr size_t kStoreFrameHeaderBytes = 4;
// The largest legal body: a Set of the longest key and value (a Wait of the
// most and longest keys is ~4 MiB, smaller).
constexpr size_t kStoreMaxRequestBytes = 1 + 4 + kStoreMaxKeyBytes + 4 + kStoreMaxValueBytes;
constexpr size_t kStoreMaxReplyBytes = 1 + kStoreMaxValueBytes;

enum class StoreOp : uint8_t { Set = 1, Get = 2, Wait = 3 };
enum class StoreStatus : uint8_t { Ok = 0, Error = 1 };

struct StoreRequest {
  StoreOp op = StoreOp::Get;
  std::vector<std::string> keys;  // one for Set and Get
  std::vector<char> value;        // Set only
};

struct StoreReply {
  StoreStatus status = StoreStatus::Ok;
  std::vector<char> payload;
};

// Whole frames, header included. Throw deepinfer::Error for a request that
// breaks the limits (the client checks before sending).
std::vector<uint8_t> encode_store_request(const StoreRequest& request);
std::vector<uint8_t> encode_store_reply(StoreStatus status, std::span<const char> payload);

// The body length from a frame header; throws deepinfer::Error when it is 0
// or above max_body.
size_t decode_store_frame_length(std::span<const uint8_t, kStoreFrameHeaderBytes> header, size_t max_body);

// Decode one body (without its header). Throw deepinfer::Error for an unknown
// op or status, a length past the end or the limits, an empty key, or bytes
// left over.
StoreRequest decode_store_request(std::span<const uint8_t> body);
StoreReply decode_store_reply(std::span<const uint8_t> body);

}  // namespace deepinfer
