#include "kv/transport/kv_wire.h"

#include <charconv>
#include <cstring>

#include "core/error.h"

namespace deepinfer {
namespace {

class Writer {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_text(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get(const char* what) {
    DI_CHECK(in_.size() - pos_ >= sizeof(T), "kv fetch request: truncated at {} (byte {})", what, pos_);
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_text(const char* what) {
    const auto n = get<uint32_t>(what);
    DI_CHECK(n <= kKvWireMaxText, "kv fetch request: {} of {} bytes (at most {})", what, n, kKvWireMaxText);
    DI_CHECK(in_.size() - pos_ >= n, "kv fetch request: truncated in {}", what);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> encode_fetch_request(const KvFetchRequest& r) {
  Writer w;
  w.put(kKvWireMagic);
  w.put(kKvWireVersion);
  w.put(r.fetch_id);
  w.put(r.block_bytes);
  w.put_text(r.fingerprint);
  w.put_text(r.salt);
  w.put(static_cast<uint32_t>(r.blocks.size()));
  for (const KvWireBlock& b : r.blocks) {
    w.put(b.key);
    w.put(b.parent_key);
    w.put(static_cast<uint8_t>(b.first ? 1 : 0));
    w.put(static_cast<uint32_t>(b.tokens.size()));
    for (const int32_t t : b.tokens) w.put(t);
  }
  return w.take();
}

KvFetchRequest decode_fetch_request(std::span<const std::byte> bytes) {
  DI_CHECK(bytes.size() <= kKvWireMaxRequestBytes, "kv fetch request: {} bytes (at most {})", bytes.size(),
           kKvWireMaxRequestBytes);
  Reader in(bytes);
  DI_CHECK(in.get<uint32_t>("magic") == kKvWireMagic, "kv fetch request: not a DeepInfer KV fetch (bad magic)");
  const auto version = in.get<uint32_t>("version");
  DI_CHECK(version == kKvWireVersion, "kv fetch request: version {} (this engine speaks {})", version, kKvWireVersion);
  KvFetchRequest r;
  r.fetch_id = in.get<uint64_t>("fetch id");
  r.block_bytes = in.get<uint64_t>("block bytes");
  r.fingerprint = in.get_text("fingerprint");
  r.salt = in.get_text("salt");
  const auto n = in.get<uint32_t>("block count");
  DI_CHECK(n <= kKvWireMaxBlocks, "kv fetch request: {} blocks (at most {})", n, kKvWireMaxBlocks);
  // Each block takes at least 21 bytes: a count beyond the message is a lie.
  DI_CHECK(size_t{n} * 21 <= in.left(), "kv fetch request: {} blocks do not fit in {} bytes", n, in.left());
  r.blocks.resize(n);
  for (KvWireBlock& b : r.blocks) {
    b.key = in.get<uint64_t>("key");
    b.parent_key = in.get<uint64_t>("parent key");
    const auto first = in.get<uint8_t>("first flag");
    DI_CHECK(first <= 1, "kv fetch request: first flag {}", first);
    b.first = first == 1;
    const auto t = in.get<uint32_t>("token count");
    DI_CHECK(t > 0 && t <= kKvWireMaxTokensPerBlock, "kv fetch request: a block of {} tokens", t);
    DI_CHECK(size_t{t} * 4 <= in.left(), "kv fetch request: truncated in a block's tokens");
    b.tokens.resize(t);
    for (int32_t& tok : b.tokens) tok = in.get<int32_t>("token");
  }
  DI_CHECK(in.left() == 0, "kv fetch request: {} bytes after the last block", in.left());
  return r;
}

KvFetchReplyHeader decode_fetch_reply_header(std::span<const std::byte> bytes, size_t requested) {
  DI_CHECK(bytes.size() == sizeof(KvFetchReplyHeader), "kv fetch reply: header of {} bytes (want {})", bytes.size(),
           sizeof(KvFetchReplyHeader));
  KvFetchReplyHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  DI_CHECK(h.magic == kKvWireMagic, "kv fetch reply: bad magic");
  DI_CHECK(h.status <= static_cast<uint32_t>(KvFetchStatus::Unavailable), "kv fetch reply: status {}", h.status);
  DI_CHECK(h.found <= requested, "kv fetch reply: {} blocks found of {} asked for", h.found, requested);
  DI_CHECK(h.first <= h.found && h.count <= h.found - h.first, "kv fetch reply: blocks [{}, {}) outside the {} found",
           h.first, uint64_t{h.first} + h.count, h.found);
  return h;
}

KvSourceAddress parse_kv_source_address(std::string_view source) {
  constexpr std::string_view kScheme = "ucx://";
  DI_CHECK(source.substr(0, kScheme.size()) == kScheme, "kv source '{}': not ucx://host:port", source);
  std::string_view rest = source.substr(kScheme.size());
  KvSourceAddress a;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {  // [v6 address]:port
    const size_t close = rest.find(']');
    DI_CHECK(close != std::string_view::npos && close + 1 < rest.size() && rest[close + 1] == ':',
             "kv source '{}': bad [address]:port", source);
    a.host.assign(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    DI_CHECK(colon != std::string_view::npos && colon > 0, "kv source '{}': no host:port", source);
    a.host.assign(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  }
  DI_CHECK(!a.host.empty() && a.host.size() <= 253, "kv source '{}': bad host", source);
  for (const char c : a.host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == ':' || c == '_';
    DI_CHECK(ok, "kv source '{}': bad character in host", source);
  }
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  DI_CHECK(ec == std::errc() && end == port_text.data() + port_text.size() && port > 0 && port <= 65535,
           "kv source '{}': bad port", source);
  a.port = static_cast<uint16_t>(port);
  return a;
}

std::string format_kv_source_address(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) return fmt::format("ucx://[{}]:{}", host, port);
  return fmt::format("ucx://{}:{}", host, port);
}

}  // namespace deepinfer
