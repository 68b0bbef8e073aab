#include "loader/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_parse.h"

namespace deepinfer {

namespace {

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr size_t kMaxRank = 16;

// Dtypes the format defines but DeepInfer does not load, so that the error can
// tell "unsupported" from "not a dtype at all".
bool is_known_unsupported(std::string_view name) {
  static constexpr std::string_view kNames[] = {"BOOL", "I16", "U16", "U32", "U64", "F64",
                                                "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                                "F6_E3M2", "F4", "C64"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

uint64_t as_offset(const json& v, std::string_view what, std::string_view tensor) {
  DI_CHECK(v.is_number_unsigned(), "tensor '{}': {} must be a non-negative integer, got {}", tensor,
           what, json_excerpt(v));
  return v.get<uint64_t>();
}

}  // namespace

DType dtype_from_safetensors(std::string_view name) {
  if (name == "F32") return DType::F32;
  if (name == "F16") return DType::F16;
  if (name == "BF16") return DType::BF16;
  if (name == "I32") return DType::I32;
  if (name == "I64") return DType::I64;
  if (name == "I8") return DType::I8;
  if (name == "U8") return DType::U8;
  if (name == "F8_E4M3") return DType::F8E4M3;  // FP8 weights (with their scales, model/weight_source.h)
  DI_CHECK(!is_known_unsupported(name), "unsupported safetensors dtype '{}'", name);
  fail("unknown safetensors dtype '{}'", name);
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  f.bytes_ = f.file_.bytes();
  try {
    f.parse_all();
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes) {
  SafetensorsFile f;
  f.bytes_ = bytes;
  f.parse_all();
  return f;
}

void SafetensorsFile::parse_all() {
  DI_CHECK(bytes_.size() >= 8, "safetensors file of {} bytes is shorter than its 8-byte header length",
           bytes_.size());
  uint64_t header_len;
  std::memcpy(&header_len, bytes_.data(), 8);
  DI_CHECK(header_len <= kMaxHeaderBytes, "safetensors header length {} exceeds the {}-byte limit",
           header_len, kMaxHeaderBytes);
  DI_CHECK(header_len <= bytes_.size() - 8, "safetensors header length {} runs past the end of the {}-byte file",
           header_len, bytes_.size());
  data_offset_ = 8 + header_len;
  const uint64_t data_size = bytes_.size() - data_offset_;

  // A header nests three levels: tensor table, tensor entry, shape list.
  JsonLimits limits;
  limits.max_depth = 3;
  json header = parse_json(
      {reinterpret_cast<const char*>(bytes_.data()) + 8, static_cast<size_t>(header_len)}, "safetensors header", limits);
  DI_CHECK(header.is_object(), "safetensors header is not a JSON object");
  tensors_.reserve(header.size());
  for (auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      DI_CHECK(entry.is_object(), "safetensors __metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        DI_CHECK(v.is_string(), "safetensors __metadata__ value of '{}' is not a string", k);
        metadata_.emplace(k, v.get<std::string>());
      }
      continue;
    }
    DI_CHECK(entry.is_object(), "safetensors entry '{}' is not an object", name);
    SafetensorsTensorInfo t;
    t.name = name;
    auto dtype = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    DI_CHECK(dtype != entry.end() && dtype->is_string(), "tensor '{}' has no dtype string", name);
    DI_CHECK(shape != entry.end() && shape->is_array(), "tensor '{}' has no shape array", name);
    DI_CHECK(shape->size() <= kMaxRank, "tensor '{}': shape has {} dimensions; at most {} are supported", name,
             shape->size(), kMaxRank);
    DI_CHECK(offsets != entry.end() && offsets->is_array() && offsets->size() == 2,
             "tensor '{}' has no data_offsets pair", name);
    try {
      t.dtype = dtype_from_safetensors(dtype->get_ref<const std::string&>());
    } catch (const Error& e) {
      fail("tensor '{}': {}", name, e.what());
    }
    // Products are checked with every dimension at least 1 so that strides of
    // views cannot overflow even when some dimension is 0.
    auto elem_size = static_cast<uint64_t>(dtype_info(t.dtype).block_bytes);
    uint64_t span = elem_size;
    uint64_t nbytes = elem_size;
    for (const json& d : *shape) {
      uint64_t dim = as_offset(d, "a shape dimension", name);
      DI_CHECK(!__builtin_mul_overflow(span, std::max<uint64_t>(dim, 1), &span) &&
                   span <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               "tensor '{}': shape {} is too large", name, json_excerpt(*shape));
      nbytes *= dim;  // cannot overflow: bounded by span
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t begin = as_offset((*offsets)[0], "data_offsets begin", name);
    uint64_t end = as_offset((*offsets)[1], "data_offsets end", name);
    DI_CHECK(begin <= end && end <= data_size,
             "tensor '{}': data_offsets [{}, {}) lie outside the {}-byte data section", name, begin, end,
             data_size);
    DI_CHECK(end - begin == nbytes, "tensor '{}': data_offsets [{}, {}) hold {} bytes but {} {} needs {}",
             name, begin, end, end - begin, dtype_name(t.dtype), json_excerpt(*shape), nbytes);
    t.offset = begin;
    t.nbytes = nbytes;
    tensors_.push_back(std::move(t));
  }

  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : tensors_)
    if (t.nbytes) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    DI_CHECK(by_offset[i]->offset >= prev->offset + prev->nbytes, "safetensors tensors '{}' and '{}' overlap",
             prev->name, by_offset[i]->name);
  }
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, static_cast<uint32_t>(i));
}

const SafetensorsTensorInfo* SafetensorsFile::find_tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsTensorInfo* info = find_tensor(name);
  DI_CHECK(info != nullptr, "safetensors tensor '{}' not found", name);
  return tensor(*info);
}

Tensor SafetensorsFile::tensor(const SafetensorsTensorInfo& info) const {
  DI_CHECK(info.shape.size() <= static_cast<size_t>(Tensor::kMaxDims),
           "tensor '{}' has rank {}; at most {} is supported", info.name, info.shape.size(), Tensor::kMaxDims);
  // Tensor views are mutable by type; the mapping is read-only by contract.
  auto* data = const_cast<uint8_t*>(tensor_data(info).data());
  if (info.shape.empty()) return Tensor(data, info.dtype, {1});
  return Tensor(data, info.dtype, info.shape);
}

std::span<const uint8_t> SafetensorsFile::tensor_data(const SafetensorsTensorInfo& info) const {
  return bytes_.subspan(static_cast<size_t>(data_offset_ + info.offset), static_cast<size_t>(info.nbytes));
}

}  // namespace deepinfer
