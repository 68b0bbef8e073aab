// Internal to the GGUF loader: a bounds-checked little-endian cursor and the
// decoding of metadata values shared by the parser and the typed getters.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "core/error.h"
#include "loader/gguf.h"

namespace deepinfer::gguf_detail {

static_assert(std::endian::native == std::endian::little, "GGUF decoding assumes a little-endian host");

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes, size_t pos = 0) : bytes_(bytes), pos_(pos) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail("GGUF truncated: {} needs {} bytes at offset {} but only {} remain", what, n, pos_,
           remaining());
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v = load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  std::span<const uint8_t> take(uint64_t n, const char* what) {
    need(n, what);
    auto s = bytes_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  // The bytes consumed since position start.
  std::span<const uint8_t> consumed_since(size_t start) const {
    return bytes_.subspan(start, pos_ - start);
  }
  std::string_view string(const char* what) {
    uint64_t n = read<uint64_t>(what);
    auto s = take(n, what);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_;
};

// Size of one element of a fixed-size type; 0 for strings and arrays.
size_t fixed_size(GgufType type);
// Checks that the raw id names a value type.
GgufType checked_type(uint32_t raw, const char* what);
// Reads (and validates) one value of the given type at the reader's position.
GgufValue read_value(Reader& reader, GgufType type, int depth);

}  // namespace deepinfer::gguf_detail
