// One .safetensors file: an 8-byte little-endian header length, a JSON header
// describing each tensor (dtype, shape, [begin, end) offsets into the data
// section), then the data. The header is validated completely on open; tensor
// data is read in place from the memory mapping.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "loader/mapped_file.h"

namespace deepinfer {

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // may have any rank, including 0 (a scalar)
  uint64_t offset = 0;         // from the start of the data section
  uint64_t nbytes = 0;

  int64_t numel() const;
};

// DType of a safetensors dtype string ("F32", "BF16", ...); throws for others.
DType dtype_from_safetensors(std::string_view name);

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  static SafetensorsFile open(const std::string& path);
  // Parses bytes owned by the caller, who keeps them alive (tests, fuzzing).
  static SafetensorsFile parse(std::span<const uint8_t> bytes);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return file_.path(); }
  uint64_t data_offset() const { return data_offset_; }
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Tensors sorted by name.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* find_tensor(std::string_view name) const;
  // A CPU view into the mapping (read-only by contract). A scalar is viewed as
  // shape [1]; ranks above Tensor::kMaxDims are an error.
  Tensor tensor(std::string_view name) const;
  Tensor tensor(const SafetensorsTensorInfo& info) const;
  std::span<const uint8_t> tensor_data(const SafetensorsTensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  void parse_all();

  MappedFile file_;  // empty for parse()
  std::span<const uint8_t> bytes_;
  uint64_t data_offset_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensorInfo> tensors_;
  // Keys view the names in tensors_, whose storage does not move once built.
  std::unordered_map<std::string_view, uint32_t> index_;
};

}  // namespace deepinfer
