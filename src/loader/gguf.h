// GGUF model files (versions 2 and 3): metadata key/values, tensor infos and
// tensor data, read in place from a memory mapping.
//
// Everything read from the file is validated on open (counts, lengths, offsets,
// dimensions and their products against the file size), so later accessors
// never read outside the file. Metadata is not copied: values are views of their
// encoding in the file, decoded when asked for (a 262,144-entry vocabulary costs
// nothing until get_string_array is called, and then only string_views).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "loader/mapped_file.h"

namespace deepinfer {

// Metadata value types, numbered as in the GGUF specification.
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view gguf_type_name(GgufType type);

// A metadata value: a view of its encoding inside the file.
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // arrays only
  uint64_t count = 1;                 // arrays: number of elements
  // Scalars: the value's bytes; strings: the characters; arrays: the encoded elements.
  std::span<const uint8_t> data;

  bool is_array() const { return type == GgufType::Array; }
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
};

// Human-readable rendering of a value for dumps; arrays show at most max_elems elements.
std::string format_gguf_value(const GgufValue& value, size_t max_elems = 8);

struct GgufTensorInfo {
  std::string_view name;
  uint32_t ggml_type = 0;
  DType dtype = DType::F32;
  int n_dims = 0;
  std::array<int64_t, Tensor::kMaxDims> shape{};  // outermost first (ggml ne[] reversed)
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;

  std::span<const int64_t> dims() const { return {shape.data(), static_cast<size_t>(n_dims)}; }
  int64_t numel() const;
};

// DType of a ggml tensor type id; throws for ids DeepInfer does not support.
DType dtype_from_ggml_type(uint32_t ggml_type);

class GgufFile {
 public:
  static constexpr uint64_t kDefaultAlignment = 32;

  // Maps and parses a file; tensors and values stay valid while this object lives.
  static GgufFile open(const std::string& path);
  // Parses bytes owned by the caller, who keeps them alive (tests, fuzzing).
  static GgufFile parse(std::span<const uint8_t> bytes);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  std::span<const uint8_t> bytes() const { return bytes_; }

  // Metadata, in file order.
  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const;
  const GgufValue& value(std::string_view key) const;  // throws if missing

  // Typed getters throw deepinfer::Error if the key is missing or its value does
  // not convert (wrong type, or out of the target's range). Integer getters accept
  // every integer type; get_f32 accepts floats and integers.
  std::string_view get_string(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  uint32_t get_u32(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;
  bool get_bool(std::string_view key) const;

  // As above, but std::nullopt when the key is missing (still throws on a wrong type).
  std::optional<std::string_view> find_string(std::string_view key) const;
  std::optional<uint64_t> find_u64(std::string_view key) const;
  std::optional<uint32_t> find_u32(std::string_view key) const;
  std::optional<int64_t> find_i64(std::string_view key) const;
  std::optional<float> find_f32(std::string_view key) const;
  std::optional<bool> find_bool(std::string_view key) const;

  // Arrays. String views point into the file.
  uint64_t get_array_size(std::string_view key) const;
  std::vector<std::string_view> get_string_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // A CPU view of the tensor's data inside the mapping. The memory is read-only:
  // writing through the view is not allowed.
  Tensor tensor(std::string_view name) const;
  Tensor tensor(const GgufTensorInfo& info) const;
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& info) const;

 private:
  GgufFile() = default;
  void parse_all();

  MappedFile file_;  // empty for parse()
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::unordered_map<std::string_view, uint32_t> key_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string_view, uint32_t> tensor_index_;
};

}  // namespace deepinfer
