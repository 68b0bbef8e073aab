#include "dist/tcp_store_wire.h"

#include "core/error.h"

namespace deepinfer {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Reads a body front to back; every read is checked against what is left.
class BodyReader {
 public:
  explicit BodyReader(std::span<const uint8_t> body) : body_(body) {}

  uint8_t u8(const char* what) {
    need(1, what);
    return body_[pos_++];
  }
  uint32_t u32(const char* what) {
    need(4, what);
    const uint32_t v = get_u32(body_.data() + pos_);
    pos_ += 4;
    return v;
  }
  std::span<const uint8_t> bytes(size_t n, const char* what) {
    need(n, what);
    std::span<const uint8_t> s = body_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::string key() {
    const uint32_t n = u32("a key length");
    DI_CHECK(n >= 1 && n <= kStoreMaxKeyBytes, "tcp store frame: key length {} is outside 1..{}", n,
             kStoreMaxKeyBytes);
    std::span<const uint8_t> k = bytes(n, "a key");
    return std::string(k.begin(), k.end());
  }
  std::span<const uint8_t> rest() {
    std::span<const uint8_t> s = body_.subspan(pos_);
    pos_ = body_.size();
    return s;
  }
  void finish() const {
    DI_CHECK(pos_ == body_.size(), "tcp store frame: {} bytes left over after the message",
             body_.size() - pos_);
  }

 private:
  void need(size_t n, const char* what) const {
    DI_CHECK(n <= body_.size() - pos_, "tcp store frame: {} needs {} bytes, {} left", what, n,
             body_.size() - pos_);
  }

  std::span<const uint8_t> body_;
  size_t pos_ = 0;
};

void put_key(std::vector<uint8_t>& out, const std::string& key) {
  DI_CHECK(!key.empty() && key.size() <= kStoreMaxKeyBytes, "tcp store: key of {} bytes (1..{} allowed)",
           key.size(), kStoreMaxKeyBytes);
  put_u32(out, static_cast<uint32_t>(key.size()));
  out.insert(out.end(), key.begin(), key.end());
}

void patch_length(std::vector<uint8_t>& frame) {
  const size_t body = frame.size() - kStoreFrameHeaderBytes;
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<uint8_t>(body >> (8 * i));
}

}  // namespace

std::vector<uint8_t> encode_store_request(const StoreRequest& r) {
  std::vector<uint8_t> out(kStoreFrameHeaderBytes, 0);
  out.push_back(static_cast<uint8_t>(r.op));
  switch (r.op) {
    case StoreOp::Set:
      DI_CHECK(r.keys.size() == 1, "tcp store: a set takes one key");
      DI_CHECK(r.value.size() <= kStoreMaxValueBytes, "tcp store: value of {} bytes for '{}' (at most {})",
               r.value.size(), r.keys[0], kStoreMaxValueBytes);
      out.reserve(out.size() + 8 + r.keys[0].size() + r.value.size());
      put_key(out, r.keys[0]);
      put_u32(out, static_cast<uint32_t>(r.value.size()));
      out.insert(out.end(), r.value.begin(), r.value.end());
      break;
    case StoreOp::Get:
      DI_CHECK(r.keys.size() == 1, "tcp store: a get takes one key");
      put_key(out, r.keys[0]);
      break;
    case StoreOp::Wait:
      DI_CHECK(r.keys.size() <= kStoreMaxWaitKeys, "tcp store: wait on {} keys (at most {})", r.keys.size(),
               kStoreMaxWaitKeys);
      put_u32(out, static_cast<uint32_t>(r.keys.size()));
      for (const std::string& k : r.keys) put_key(out, k);
      break;
    default:
      fail("tcp store: unknown op {}", static_cast<int>(r.op));
  }
  patch_length(out);
  return out;
}

std::vector<uint8_t> encode_store_reply(StoreStatus status, std::span<const char> payload) {
  DI_CHECK(payload.size() <= kStoreMaxValueBytes, "tcp store: reply of {} bytes (at most {})", payload.size(),
           kStoreMaxValueBytes);
  std::vector<uint8_t> out(kStoreFrameHeaderBytes, 0);
  out.reserve(kStoreFrameHeaderBytes + 1 + payload.size());
  out.push_back(static_cast<uint8_t>(status));
  out.insert(out.end(), payload.begin(), payload.end());
  patch_length(out);
  return out;
}

size_t decode_store_frame_length(std::span<const uint8_t, kStoreFrameHeaderBytes> header, size_t max_body) {
  const uint32_t n = get_u32(header.data());
  DI_CHECK(n >= 1 && n <= max_body, "tcp store frame: body length {} is outside 1..{}", n, max_body);
  return n;
}

StoreRequest decode_store_request(std::span<const uint8_t> body) {
  BodyReader in(body);
  StoreRequest r;
  const uint8_t op = in.u8("the op");
  switch (op) {
    case static_cast<uint8_t>(StoreOp::Set): {
      r.op = StoreOp::Set;
      r.keys.push_back(in.key());
      const uint32_t n = in.u32("the value length");
      DI_CHECK(n <= kStoreMaxValueBytes, "tcp store frame: value length {} is above {}", n, kStoreMaxValueBytes);
      std::span<const uint8_t> v = in.bytes(n, "the value");
      r.value.assign(v.begin(), v.end());
      break;
    }
    case static_cast<uint8_t>(StoreOp::Get):
      r.op = StoreOp::Get;
      r.keys.push_back(in.key());
      break;
    case static_cast<uint8_t>(StoreOp::Wait): {
      r.op = StoreOp::Wait;
      const uint32_t count = in.u32("the key count");
      DI_CHECK(count <= kStoreMaxWaitKeys, "tcp store frame: wait on {} keys (at most {})", count,
               kStoreMaxWaitKeys);
      // Each key takes at least 5 bytes, so a forged count cannot reserve much.
      DI_CHECK(count <= body.size() / 5, "tcp store frame: {} keys cannot fit in {} bytes", count, body.size());
      r.keys.reserve(count);
      for (uint32_t i = 0; i < count; ++i) r.keys.push_back(in.key());
      break;
    }
    default:
      fail("tcp store frame: unknown op {}", op);
  }
  in.finish();
  return r;
}

StoreReply decode_store_reply(std::span<const uint8_t> body) {
  BodyReader in(body);
  StoreReply r;
  const uint8_t status = in.u8("the status");
  DI_CHECK(status <= static_cast<uint8_t>(StoreStatus::Error), "tcp store frame: unknown status {}", status);
  r.status = static_cast<StoreStatus>(status);
  std::span<const uint8_t> p = in.rest();
  DI_CHECK(p.size() <= kStoreMaxValueBytes, "tcp store frame: reply of {} bytes (at most {})", p.size(),
           kStoreMaxValueBytes);
  r.payload.assign(p.begin(), p.end());
  return r;
}

}  // namespace deepinfer
