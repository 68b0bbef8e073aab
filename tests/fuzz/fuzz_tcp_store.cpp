// libFuzzer target: the TCP rendezvous store's frames (src/dist/tcp_store_wire.h)
// as its server reads requests from any client that connects, and as a
// client reads the server's replies. The first byte picks which. The rest is
// one frame, header included. deepinfer::Error is the expected outcome for
// bad input; a request that decodes must encode back to the same bytes, and
// nothing may pass the limits. Anything else (another exception, a crash, a
// sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "core/error.h"
#include "dist/tcp_store_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  if (size < 1 + kStoreFrameHeaderBytes) return 0;
  const bool is_request = data[0] % 2 == 0;
  const std::span<const uint8_t> frame(data + 1, size - 1);
  try {
    const size_t max_body = is_request ? kStoreMaxRequestBytes : kStoreMaxReplyBytes;
    const size_t n = decode_store_frame_length(frame.first<kStoreFrameHeaderBytes>(), max_body);
    if (n == 0 || n > max_body) __builtin_trap();
    const std::span<const uint8_t> body = frame.subspan(kStoreFrameHeaderBytes);
    if (body.size() != n) return 0;  // the server reads exactly n bytes; a short body never reaches the decoder
    if (is_request) {
      const StoreRequest r = decode_store_request(body);
      if (r.keys.size() > kStoreMaxWaitKeys || r.value.size() > kStoreMaxValueBytes) __builtin_trap();
      for (const auto& k : r.keys) {
        if (k.empty() || k.size() > kStoreMaxKeyBytes) __builtin_trap();
      }
      const std::vector<uint8_t> again = encode_store_request(r);
      if (again.size() != frame.size() || std::memcmp(again.data(), frame.data(), frame.size()) != 0) {
        __builtin_trap();
      }
    } else {
      const StoreReply r = decode_store_reply(body);
      const std::vector<uint8_t> again = encode_store_reply(r.status, r.payload);
      if (again.size() != frame.size() || std::memcmp(again.data(), frame.data(), frame.size()) != 0) {
        __builtin_trap();
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
