// libFuzzer target: the cross-node KV transport's messages as an engine
// reads them off the network (src/kv/transport/kv_wire.h). The first byte
// picks the reader: a fetch request (a prefill engine reads it from any
// peer that connects), a reply header (a decode engine reads it), or a KV
// source address (from a request header). deepinfer::Error is the expected
// outcome for bad input; a request that decodes must encode back to the same
// bytes. Anything else (another exception, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "core/error.h"
#include "kv/transport/kv_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  if (size == 0) return 0;
  const std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  try {
    switch (data[0] % 3) {
      case 0: {
        const KvFetchRequest r = decode_fetch_request(rest);
        const std::vector<std::byte> again = encode_fetch_request(r);
        if (again.size() != rest.size() || std::memcmp(again.data(), rest.data(), rest.size()) != 0) __builtin_trap();
        break;
      }
      case 1: {
        const size_t requested = data[0] >> 2;
        const KvFetchReplyHeader h = decode_fetch_reply_header(rest, requested);
        if (h.found > requested || uint64_t{h.first} + h.count > h.found) __builtin_trap();
        break;
      }
      default: {
        const KvSourceAddress a =
            parse_kv_source_address(std::string_view(reinterpret_cast<const char*>(rest.data()), rest.size()));
        if (a.host.empty() || a.port == 0) __builtin_trap();
        const KvSourceAddress back = parse_kv_source_address(format_kv_source_address(a.host, a.port));
        if (back.host != a.host || back.port != a.port) __builtin_trap();
        break;
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
