// Tensor: a non-owning view of memory on some device, with a dtype, a shape
// (outermost dimension first, as in PyTorch) and byte strides (as in ggml, so
// block-quantised rows fit the same description). Owning storage lives elsewhere
// (Buffer, the model's weight store, the KV cache); views are cheap to copy.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/dtype.h"

namespace deepinfer {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
};

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;
  // Contiguous row-major view. For quantised dtypes the innermost dimension must
  // be a multiple of the block size.
  Tensor(void* data, DType dtype, std::span<const int64_t> shape, Device device = Device::cpu());
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
         Device device = Device::cpu())
      : Tensor(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device) {}

  bool defined() const { return ndim_ > 0; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int dim) const { return shape_[normalize_dim(dim)]; }
  std::span<const int64_t> shape() const { return {shape_.data(), static_cast<size_t>(ndim_)}; }
  // Stride in bytes.
  int64_t stride_bytes(int dim) const { return strides_[normalize_dim(dim)]; }
  int64_t numel() const;
  // Bytes spanned by a contiguous tensor.
  size_t nbytes() const;
  bool is_contiguous() const;

  // Row i of the outermost dimension (a view with one dimension fewer).
  Tensor row(int64_t i) const;
  // Rows [start, start+count) of the outermost dimension.
  Tensor slice_rows(int64_t start, int64_t count) const;
  // Index i of dimension dim (not the innermost), which is dropped: e.g. head
  // h of a [tokens, heads, dim] view as a [tokens, dim] view.
  Tensor select(int dim, int64_t i) const;
  // Elements [start, start+len) of dimension dim (same memory, same strides).
  // Narrowing the innermost dimension of a quantised tensor must keep whole blocks.
  Tensor narrow(int dim, int64_t start, int64_t len) const;
  // The innermost dimension seen as [outer, inner] (outer * inner elements,
  // float dtypes); valid for any outer strides, e.g. the q columns of a fused
  // QKV output split into heads.
  Tensor split_last(int64_t outer, int64_t inner) const;
  // Same memory, new shape; the tensor must be contiguous.
  Tensor reshape(std::initializer_list<int64_t> shape) const;
  Tensor reshape(std::span<const int64_t> shape) const;

  std::string describe() const;  // "f32[2, 3] cpu" — for error messages

 private:
  int normalize_dim(int dim) const;

  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Device device_{};
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace deepinfer
