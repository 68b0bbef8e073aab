// GGUF parsing: header, metadata, tensor infos and the data section.
#include "loader/gguf.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "core/error.h"
#include "loader/gguf_reader.h"

namespace deepinfer {

using gguf_detail::Reader;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
// Smallest encodings, used to bound counts by the bytes left before allocating:
// a key/value is a key length (8) + type (4) + a 1-byte value; a tensor info is a
// name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
constexpr size_t kMinKeyValueBytes = 13;
constexpr size_t kMinTensorInfoBytes = 32;

// ggml type ids that have no DType, named so errors say what the file holds.
std::string_view unsupported_ggml_type_name(uint32_t id) {
  switch (id) {
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 25: return "I16";
    case 28: return "F64";
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return "unknown";
  }
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

DType dtype_from_ggml_type(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 2: return DType::Q4_0;
    case 3: return DType::Q4_1;
    case 6: return DType::Q5_0;
    case 7: return DType::Q5_1;
    case 8: return DType::Q8_0;
    case 9: return DType::Q8_1;
    case 10: return DType::Q2_K;
    case 11: return DType::Q3_K;
    case 12: return DType::Q4_K;
    case 13: return DType::Q5_K;
    case 14: return DType::Q6_K;
    case 15: return DType::Q8_K;
    case 24: return DType::I8;
    case 26: return DType::I32;
    case 27: return DType::I64;
    case 30: return DType::BF16;
    default: break;
  }
  fail("unsupported ggml tensor type {} ({})", ggml_type, unsupported_ggml_type_name(ggml_type));
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims()) n *= d;
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.file_ = MappedFile::open(path);
  f.bytes_ = f.file_.bytes();
  try {
    f.parse_all();
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  f.bytes_ = bytes;
  f.parse_all();
  return f;
}

void GgufFile::parse_all() {
  Reader r(bytes_);
  DI_CHECK(bytes_.size() >= 4 && r.read<uint32_t>("magic") == kMagic,
           "not a GGUF file (the first 4 bytes are not \"GGUF\")");
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    uint32_t swapped = __builtin_bswap32(version_);
    DI_CHECK(swapped != 2 && swapped != 3, "big-endian GGUF files are not supported");
    fail("unsupported GGUF version {} (only versions 2 and 3 are supported)", version_);
  }
  uint64_t n_tensors = r.read<uint64_t>("tensor count");
  uint64_t n_kv = r.read<uint64_t>("metadata count");
  DI_CHECK(n_kv <= r.remaining() / kMinKeyValueBytes,
           "GGUF metadata count {} is impossible in a {}-byte file", n_kv, bytes_.size());
  DI_CHECK(n_tensors <= r.remaining() / kMinTensorInfoBytes,
           "GGUF tensor count {} is impossible in a {}-byte file", n_tensors, bytes_.size());

  metadata_.reserve(static_cast<size_t>(n_kv));
  key_index_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKeyValue kv;
    kv.key = r.string("metadata key");
    DI_CHECK(!kv.key.empty(), "GGUF metadata key {} is empty", i);
    try {
      auto type = gguf_detail::checked_type(r.read<uint32_t>("metadata type"), "metadata value");
      kv.value = gguf_detail::read_value(r, type, 0);
    } catch (const Error& e) {
      fail("metadata key '{}': {}", kv.key, e.what());
    }
    bool inserted = key_index_.emplace(kv.key, static_cast<uint32_t>(metadata_.size())).second;
    DI_CHECK(inserted, "duplicate GGUF metadata key '{}'", kv.key);
    metadata_.push_back(kv);
  }

  if (auto align = find_u64("general.alignment")) {
    DI_CHECK(*align > 0 && *align <= std::numeric_limits<uint32_t>::max() && std::has_single_bit(*align),
             "general.alignment {} is not a power of two below 2^32", *align);
    alignment_ = *align;
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  tensor_index_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.string("tensor name");
    try {
      uint32_t n_dims = r.read<uint32_t>("tensor dimension count");
      DI_CHECK(n_dims >= 1 && n_dims <= static_cast<uint32_t>(Tensor::kMaxDims),
               "{} dimensions (1 to {} supported)", n_dims, Tensor::kMaxDims);
      t.n_dims = static_cast<int>(n_dims);
      for (int d = 0; d < t.n_dims; ++d) {
        uint64_t ne = r.read<uint64_t>("tensor dimension");
        DI_CHECK(ne <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "dimension {} is too large", ne);
        t.shape[t.n_dims - 1 - d] = static_cast<int64_t>(ne);
      }
      t.ggml_type = r.read<uint32_t>("tensor type");
      t.dtype = dtype_from_ggml_type(t.ggml_type);
      t.offset = r.read<uint64_t>("tensor offset");

      const DTypeInfo& info = dtype_info(t.dtype);
      auto inner = static_cast<uint64_t>(t.shape[t.n_dims - 1]);
      DI_CHECK(inner % static_cast<uint64_t>(info.block_elems) == 0,
               "innermost dimension {} is not a multiple of the {} block size {}", inner, info.name,
               info.block_elems);
      // Products are checked with every dimension at least 1 so that views of a
      // tensor with a zero dimension cannot overflow their strides either.
      auto block_elems = static_cast<uint64_t>(info.block_elems);
      uint64_t elems = 1;
      uint64_t bytes = 0;
      bool ok = checked_mul(std::max(inner, block_elems) / block_elems,
                            static_cast<uint64_t>(info.block_bytes), bytes);
      for (int d = 0; d < t.n_dims && ok; ++d) {
        auto dim = static_cast<uint64_t>(std::max<int64_t>(t.shape[d], 1));
        ok = checked_mul(elems, dim, elems);
        if (d < t.n_dims - 1) ok = ok && checked_mul(bytes, dim, bytes);
      }
      DI_CHECK(ok && elems <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                   bytes <= bytes_.size(),
               "shape is too large for a {}-byte file", bytes_.size());
      t.nbytes = t.numel() == 0 ? 0 : bytes;
    } catch (const Error& e) {
      fail("tensor '{}': {}", t.name, e.what());
    }
    bool inserted = tensor_index_.emplace(t.name, static_cast<uint32_t>(tensors_.size())).second;
    DI_CHECK(inserted, "duplicate GGUF tensor name '{}'", t.name);
    tensors_.push_back(t);
  }

  // The data section starts at the next multiple of the alignment; a file without
  // tensors may end before that padding.
  size_t pos = r.pos();
  uint64_t padded = pos + (alignment_ - pos % alignment_) % alignment_;
  DI_CHECK(padded <= bytes_.size() || tensors_.empty(),
           "GGUF data section offset {} is past the end of the {}-byte file", padded, bytes_.size());
  data_offset_ = std::min<uint64_t>(padded, bytes_.size());
  uint64_t data_size = bytes_.size() - data_offset_;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ranges.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) {
    DI_CHECK(t.offset % alignment_ == 0, "tensor '{}' offset {} is not a multiple of the alignment {}",
             t.name, t.offset, alignment_);
    DI_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset,
             "tensor '{}' data ({} bytes at offset {}) lies outside the {}-byte data section", t.name,
             t.nbytes, t.offset, data_size);
    if (t.nbytes) ranges.emplace_back(t.offset, t.offset + t.nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    DI_CHECK(ranges[i].first >= ranges[i - 1].second, "GGUF tensor data ranges overlap at data offset {}",
             ranges[i].first);
  }
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Tensor GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* info = find_tensor(name);
  DI_CHECK(info != nullptr, "GGUF tensor '{}' not found", name);
  return tensor(*info);
}

Tensor GgufFile::tensor(const GgufTensorInfo& info) const {
  // Tensor views are mutable by type; the mapping is read-only by contract.
  auto* data = const_cast<uint8_t*>(tensor_data(info).data());
  return Tensor(data, info.dtype, info.dims());
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensorInfo& info) const {
  return bytes_.subspan(static_cast<size_t>(data_offset_ + info.offset), static_cast<size_t>(info.nbytes));
}

}  // namespace deepinfer
