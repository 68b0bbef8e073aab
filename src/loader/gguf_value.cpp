// GGUF metadata: value validation and decoding, and GgufFile's typed getters.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "loader/gguf.h"
#include "loader/gguf_reader.h"

namespace deepinfer {

using gguf_detail::load;
using gguf_detail::Reader;

namespace gguf_detail {

namespace {
// Nested arrays are legal but never deep in practice; the limit keeps a hostile
// file from exhausting the stack through recursion.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kNumTypes = 13;
// Smallest encodings: a string is at least its 8-byte length, an array its
// 4-byte element type plus 8-byte count.
constexpr size_t kMinStringBytes = 8;
constexpr size_t kMinArrayBytes = 12;
}  // namespace

size_t fixed_size(GgufType type) {
  switch (type) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    case GgufType::String:
    case GgufType::Array:
      return 0;
  }
  return 0;
}

GgufType checked_type(uint32_t raw, const char* what) {
  DI_CHECK(raw < kNumTypes, "GGUF {} has unknown value type {}", what, raw);
  return static_cast<GgufType>(raw);
}

GgufValue read_value(Reader& reader, GgufType type, int depth) {
  GgufValue v;
  v.type = type;
  if (type == GgufType::String) {
    std::string_view s = reader.string("string value");
    v.data = {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
    return v;
  }
  if (type != GgufType::Array) {
    v.data = reader.take(fixed_size(type), "scalar value");
    DI_CHECK(type != GgufType::Bool || v.data[0] <= 1, "GGUF bool value {} is neither 0 nor 1",
             v.data[0]);
    return v;
  }
  DI_CHECK(depth < kMaxArrayDepth, "GGUF arrays nested deeper than {}", kMaxArrayDepth);
  v.elem_type = checked_type(reader.read<uint32_t>("array element type"), "array element");
  v.count = reader.read<uint64_t>("array length");
  size_t start = reader.pos();
  size_t elem = fixed_size(v.elem_type);
  if (elem) {
    DI_CHECK(v.count <= reader.remaining() / elem,
             "GGUF array of {} {} elements at offset {} runs past the end of the file", v.count,
             gguf_type_name(v.elem_type), start);
    v.data = reader.take(v.count * elem, "array");
    if (v.elem_type == GgufType::Bool) {
      for (uint8_t b : v.data) DI_CHECK(b <= 1, "GGUF bool array element {} is neither 0 nor 1", b);
    }
    return v;
  }
  size_t min_elem = v.elem_type == GgufType::String ? kMinStringBytes : kMinArrayBytes;
  DI_CHECK(v.count <= reader.remaining() / min_elem,
           "GGUF array of {} {} elements at offset {} runs past the end of the file", v.count,
           gguf_type_name(v.elem_type), start);
  for (uint64_t i = 0; i < v.count; ++i) read_value(reader, v.elem_type, depth + 1);
  v.data = reader.consumed_since(start);
  return v;
}

}  // namespace gguf_detail

namespace {

// An integer or floating-point scalar, widened without loss.
struct Number {
  enum class Kind { Unsigned, Signed, Float } kind;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
};

bool is_numeric(GgufType t) {
  return t != GgufType::Bool && t != GgufType::String && t != GgufType::Array;
}

Number read_number(GgufType type, const uint8_t* p) {
  Number n{Number::Kind::Unsigned};
  switch (type) {
    case GgufType::U8: n.u = load<uint8_t>(p); break;
    case GgufType::U16: n.u = load<uint16_t>(p); break;
    case GgufType::U32: n.u = load<uint32_t>(p); break;
    case GgufType::U64: n.u = load<uint64_t>(p); break;
    case GgufType::I8: n = {Number::Kind::Signed, 0, load<int8_t>(p)}; break;
    case GgufType::I16: n = {Number::Kind::Signed, 0, load<int16_t>(p)}; break;
    case GgufType::I32: n = {Number::Kind::Signed, 0, load<int32_t>(p)}; break;
    case GgufType::I64: n = {Number::Kind::Signed, 0, load<int64_t>(p)}; break;
    case GgufType::F32: n = {Number::Kind::Float, 0, 0, load<float>(p)}; break;
    case GgufType::F64: n = {Number::Kind::Float, 0, 0, load<double>(p)}; break;
    default: break;
  }
  return n;
}

std::string type_description(const GgufValue& v) {
  if (!v.is_array()) return std::string(gguf_type_name(v.type));
  return fmt::format("array of {}", gguf_type_name(v.elem_type));
}

[[noreturn]] void wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) {
  fail("GGUF key '{}' is {}, expected {}", key, type_description(v), expected);
}

// Integer conversions: floats are not silently truncated.
uint64_t to_u64(std::string_view key, const GgufValue& v, const Number& n) {
  if (n.kind == Number::Kind::Float) wrong_type(key, v, "an unsigned integer");
  if (n.kind == Number::Kind::Signed) {
    DI_CHECK(n.i >= 0, "GGUF key '{}' is {}, expected a non-negative value", key, n.i);
    return static_cast<uint64_t>(n.i);
  }
  return n.u;
}

int64_t to_i64(std::string_view key, const GgufValue& v, const Number& n) {
  if (n.kind == Number::Kind::Float) wrong_type(key, v, "an integer");
  if (n.kind == Number::Kind::Unsigned) {
    DI_CHECK(n.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             "GGUF key '{}' value {} does not fit in int64", key, n.u);
    return static_cast<int64_t>(n.u);
  }
  return n.i;
}

float to_f32(const Number& n) {
  switch (n.kind) {
    case Number::Kind::Unsigned: return static_cast<float>(n.u);
    case Number::Kind::Signed: return static_cast<float>(n.i);
    case Number::Kind::Float: break;
  }
  return static_cast<float>(n.f);
}

int32_t to_i32(std::string_view key, const GgufValue& v, const Number& n) {
  int64_t x = to_i64(key, v, n);
  DI_CHECK(x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max(),
           "GGUF key '{}' value {} does not fit in int32", key, x);
  return static_cast<int32_t>(x);
}

Number scalar_number(std::string_view key, const GgufValue& v, std::string_view expected) {
  if (!is_numeric(v.type)) wrong_type(key, v, expected);
  return read_number(v.type, v.data.data());
}

std::string_view as_string_view(std::span<const uint8_t> s) {
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

void append_value(std::string& out, const GgufValue& v, size_t max_elems) {
  if (v.type == GgufType::String) {
    std::string_view s = as_string_view(v.data);
    constexpr size_t kMaxChars = 120;
    if (s.size() > kMaxChars) {
      out += fmt::format("\"{}\"... ({} bytes)", s.substr(0, kMaxChars), s.size());
    } else {
      out += fmt::format("\"{}\"", s);
    }
    return;
  }
  if (v.type == GgufType::Bool) {
    out += v.data[0] ? "true" : "false";
    return;
  }
  if (!v.is_array()) {
    Number n = read_number(v.type, v.data.data());
    if (n.kind == Number::Kind::Unsigned) out += fmt::format("{}", n.u);
    if (n.kind == Number::Kind::Signed) out += fmt::format("{}", n.i);
    if (n.kind == Number::Kind::Float) out += fmt::format("{}", n.f);
    return;
  }
  out += fmt::format("[{} x {}: ", v.count, gguf_type_name(v.elem_type));
  Reader r(v.data);
  for (uint64_t i = 0; i < v.count && i < max_elems; ++i) {
    if (i) out += ", ";
    append_value(out, gguf_detail::read_value(r, v.elem_type, 0), max_elems);
  }
  if (v.count > max_elems) out += ", ...";
  out += "]";
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "unknown";
}

std::string format_gguf_value(const GgufValue& value, size_t max_elems) {
  std::string out;
  append_value(out, value, max_elems);
  return out;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufValue& GgufFile::value(std::string_view key) const {
  const GgufValue* v = find(key);
  DI_CHECK(v != nullptr, "GGUF key '{}' not found", key);
  return *v;
}

namespace {

std::string_view convert_string(std::string_view key, const GgufValue& v) {
  if (v.type != GgufType::String) wrong_type(key, v, "a string");
  return as_string_view(v.data);
}
uint64_t convert_u64(std::string_view key, const GgufValue& v) {
  return to_u64(key, v, scalar_number(key, v, "an unsigned integer"));
}
uint32_t convert_u32(std::string_view key, const GgufValue& v) {
  uint64_t x = convert_u64(key, v);
  DI_CHECK(x <= std::numeric_limits<uint32_t>::max(), "GGUF key '{}' value {} does not fit in uint32",
           key, x);
  return static_cast<uint32_t>(x);
}
int64_t convert_i64(std::string_view key, const GgufValue& v) {
  return to_i64(key, v, scalar_number(key, v, "an integer"));
}
float convert_f32(std::string_view key, const GgufValue& v) {
  return to_f32(scalar_number(key, v, "a number"));
}
bool convert_bool(std::string_view key, const GgufValue& v) {
  if (v.type != GgufType::Bool) wrong_type(key, v, "a bool");
  return v.data[0] != 0;
}

const GgufValue& array_value(std::string_view key, const GgufValue& v, std::string_view expected) {
  if (!v.is_array()) wrong_type(key, v, expected);
  return v;
}

// Decodes every element of a numeric array with the given conversion.
template <typename T, typename Convert>
std::vector<T> numeric_array(std::string_view key, const GgufValue& v, std::string_view expected,
                             Convert convert) {
  array_value(key, v, expected);
  if (!is_numeric(v.elem_type)) wrong_type(key, v, expected);
  size_t elem = gguf_detail::fixed_size(v.elem_type);
  std::vector<T> out(static_cast<size_t>(v.count));
  for (size_t i = 0; i < out.size(); ++i) out[i] = convert(read_number(v.elem_type, v.data.data() + i * elem));
  return out;
}

}  // namespace

std::string_view GgufFile::get_string(std::string_view key) const { return convert_string(key, value(key)); }
uint64_t GgufFile::get_u64(std::string_view key) const { return convert_u64(key, value(key)); }
uint32_t GgufFile::get_u32(std::string_view key) const { return convert_u32(key, value(key)); }
int64_t GgufFile::get_i64(std::string_view key) const { return convert_i64(key, value(key)); }
float GgufFile::get_f32(std::string_view key) const { return convert_f32(key, value(key)); }
bool GgufFile::get_bool(std::string_view key) const { return convert_bool(key, value(key)); }

std::optional<std::string_view> GgufFile::find_string(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional(convert_string(key, *v)) : std::nullopt;
}
std::optional<uint64_t> GgufFile::find_u64(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional(convert_u64(key, *v)) : std::nullopt;
}
std::optional<uint32_t> GgufFile::find_u32(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional(convert_u32(key, *v)) : std::nullopt;
}
std::optional<int64_t> GgufFile::find_i64(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional(convert_i64(key, *v)) : std::nullopt;
}
std::optional<float> GgufFile::find_f32(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional(convert_f32(key, *v)) : std::nullopt;
}
std::optional<bool> GgufFile::find_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional(convert_bool(key, *v)) : std::nullopt;
}

uint64_t GgufFile::get_array_size(std::string_view key) const {
  return array_value(key, value(key), "an array").count;
}

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = array_value(key, value(key), "an array of string");
  if (v.elem_type != GgufType::String) wrong_type(key, v, "an array of string");
  std::vector<std::string_view> out;
  out.reserve(static_cast<size_t>(v.count));
  Reader r(v.data);
  for (uint64_t i = 0; i < v.count; ++i) out.push_back(r.string("string array element"));
  return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
  return numeric_array<float>(key, value(key), "an array of numbers", to_f32);
}

std::vector<int32_t> GgufFile::get_i32_array(std::string_view key) const {
  const GgufValue& v = value(key);
  return numeric_array<int32_t>(key, v, "an array of integers",
                                [&](const Number& n) { return to_i32(key, v, n); });
}

}  // namespace deepinfer
