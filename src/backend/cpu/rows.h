// Row addressing for strided tensor views: the CPU ops treat every tensor as a
// list of contiguous innermost rows whose outer dimensions may have any stride.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace deepinfer::cpu {

class Rows {
 public:
  explicit Rows(const Tensor& t) : base_(static_cast<char*>(t.data())), ndim_(t.ndim()) {
    cols_ = t.size(-1);
    rows_ = 1;
    for (int d = 0; d + 1 < ndim_; ++d) {
      shape_[d] = t.size(d);
      stride_[d] = t.stride_bytes(d);
      rows_ *= shape_[d];
    }
  }

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  template <typename T = float>
  T* row(int64_t r) const {
    if (ndim_ <= 2) return reinterpret_cast<T*>(base_ + (ndim_ == 2 ? r * stride_[0] : 0));
    int64_t offset = 0;
    for (int d = ndim_ - 2; d >= 0; --d) {
      offset += (r % shape_[d]) * stride_[d];
      r /= shape_[d];
    }
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  char* base_;
  int ndim_;
  int64_t rows_ = 1;
  int64_t cols_ = 0;
  int64_t shape_[Tensor::kMaxDims] = {};
  int64_t stride_[Tensor::kMaxDims] = {};
};

}  // namespace deepinfer::cpu
