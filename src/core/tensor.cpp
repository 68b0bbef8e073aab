#include "core/tensor.h"

#include <fmt/format.h>

#include "core/error.h"

namespace deepinfer {

Tensor::Tensor(void* data, DType dtype, std::span<const int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  DI_CHECK(!shape.empty() && shape.size() <= kMaxDims, "tensor rank {} out of range 1..{}",
           shape.size(), kMaxDims);
  ndim_ = static_cast<int>(shape.size());
  for (int i = 0; i < ndim_; ++i) {
    DI_CHECK(shape[i] >= 0, "negative tensor dimension {}", shape[i]);
    shape_[i] = shape[i];
  }
  // For quantised types a per-element stride is meaningless (0); the row stride is what counts.
  strides_[ndim_ - 1] = is_quantized(dtype) ? 0 : dtype_info(dtype).block_bytes;
  int64_t row = static_cast<int64_t>(row_bytes(dtype, shape_[ndim_ - 1]));
  if (ndim_ >= 2) {
    strides_[ndim_ - 2] = row;
    for (int i = ndim_ - 3; i >= 0; --i) strides_[i] = strides_[i + 1] * shape_[i + 1];
  }
}

int Tensor::normalize_dim(int dim) const {
  int d = dim < 0 ? dim + ndim_ : dim;
  DI_CHECK(d >= 0 && d < ndim_, "dimension {} out of range for rank {}", dim, ndim_);
  return d;
}

int64_t Tensor::numel() const {
  if (ndim_ == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

size_t Tensor::nbytes() const {
  if (ndim_ == 0) return 0;
  size_t rows = 1;
  for (int i = 0; i < ndim_ - 1; ++i) rows *= static_cast<size_t>(shape_[i]);
  return rows * row_bytes(dtype_, shape_[ndim_ - 1]);
}

bool Tensor::is_contiguous() const {
  if (ndim_ == 0) return true;
  int64_t expect = static_cast<int64_t>(row_bytes(dtype_, shape_[ndim_ - 1]));
  for (int i = ndim_ - 2; i >= 0; --i) {
    if (shape_[i] > 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

Tensor Tensor::row(int64_t i) const {
  DI_CHECK(ndim_ >= 2, "row() needs rank >= 2, got {}", describe());
  DI_CHECK(i >= 0 && i < shape_[0], "row {} out of range for {}", i, describe());
  Tensor t;
  t.data_ = static_cast<char*>(data_) + i * strides_[0];
  t.dtype_ = dtype_;
  t.device_ = device_;
  t.ndim_ = ndim_ - 1;
  for (int d = 1; d < ndim_; ++d) {
    t.shape_[d - 1] = shape_[d];
    t.strides_[d - 1] = strides_[d];
  }
  return t;
}

Tensor Tensor::select(int dim, int64_t i) const {
  const int d = normalize_dim(dim);
  DI_CHECK(ndim_ >= 2 && d < ndim_ - 1, "select() of dim {} needs an outer dimension of a rank >= 2 tensor, got {}",
           dim, describe());
  DI_CHECK(i >= 0 && i < shape_[d], "index {} of dim {} out of range for {}", i, dim, describe());
  Tensor t;
  t.data_ = static_cast<char*>(data_) + i * strides_[d];
  t.dtype_ = dtype_;
  t.device_ = device_;
  t.ndim_ = ndim_ - 1;
  for (int s = 0, o = 0; s < ndim_; ++s) {
    if (s == d) continue;
    t.shape_[o] = shape_[s];
    t.strides_[o] = strides_[s];
    ++o;
  }
  return t;
}

Tensor Tensor::slice_rows(int64_t start, int64_t count) const {
  DI_CHECK(ndim_ >= 1, "slice_rows() on an empty tensor");
  DI_CHECK(start >= 0 && count >= 0 && start + count <= shape_[0],
           "rows [{}, {}) out of range for {}", start, start + count, describe());
  DI_CHECK(ndim_ >= 2 || !is_quantized(dtype_), "cannot slice elements of a quantised vector");
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + start * strides_[0];
  t.shape_[0] = count;
  return t;
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t len) const {
  int d = normalize_dim(dim);
  DI_CHECK(start >= 0 && len >= 0 && start + len <= shape_[d], "narrow [{}, {}) of dim {} out of range for {}",
           start, start + len, dim, describe());
  Tensor t = *this;
  if (d == ndim_ - 1) {
    t.data_ = static_cast<char*>(data_) + row_bytes(dtype_, start);
  } else {
    t.data_ = static_cast<char*>(data_) + start * strides_[d];
  }
  t.shape_[d] = len;
  return t;
}

Tensor Tensor::split_last(int64_t outer, int64_t inner) const {
  DI_CHECK(ndim_ >= 1 && ndim_ < kMaxDims && outer > 0 && inner > 0 && outer * inner == shape_[ndim_ - 1] &&
               !is_quantized(dtype_),
           "cannot split the last dimension of {} into [{}, {}]", describe(), outer, inner);
  Tensor t = *this;
  t.shape_[ndim_ - 1] = outer;
  t.strides_[ndim_ - 1] = static_cast<int64_t>(row_bytes(dtype_, inner));
  t.shape_[ndim_] = inner;
  t.strides_[ndim_] = static_cast<int64_t>(row_bytes(dtype_, 1));
  t.ndim_ = ndim_ + 1;
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> shape) const {
  return reshape(std::span<const int64_t>(shape.begin(), shape.size()));
}

Tensor Tensor::reshape(std::span<const int64_t> shape) const {
  DI_CHECK(is_contiguous(), "reshape of non-contiguous {}", describe());
  Tensor t(data_, dtype_, shape, device_);
  DI_CHECK(t.numel() == numel(), "cannot reshape {} to {} elements", describe(), t.numel());
  return t;
}

std::string Tensor::describe() const {
  std::string s = fmt::format("{}[", dtype_name(dtype_));
  for (int i = 0; i < ndim_; ++i) s += fmt::format("{}{}", i ? ", " : "", shape_[i]);
  s += device_.type == DeviceType::CPU ? "] cpu" : fmt::format("] cuda:{}", device_.index);
  return s;
}

}  // namespace deepinfer
