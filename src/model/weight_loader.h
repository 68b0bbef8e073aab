// WeightLoader: named checkpoint tensors (shape-checked by the WeightSource)
// into a WeightStore, counting the bytes a decode step reads from them. The
// count feeds memory planning and the roofline in the log; norms and biases
// are too small to count, and of a layer's expert stacks a step reads only
// the chosen experts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/weight_source.h"
#include "model/weight_store.h"

namespace deepinfer {

class WeightLoader {
 public:
  WeightLoader(const WeightSource& source, WeightStore& store) : source_(source), store_(store) {}

  bool has(const std::string& name) const { return source_.has(name); }
  // [rows, cols], stored and counted.
  Tensor matrix(const std::string& name, int64_t rows, int64_t cols);
  // A linear layer's weight [rows, cols] (WeightStore::linear_weight), stored and counted.
  Tensor linear(const std::string& name, int64_t rows, int64_t cols);
  // [rows, cols] left where the source keeps it (to be fused or stored by the
  // caller), counted.
  Tensor host_matrix(const std::string& name, int64_t rows, int64_t cols);
  // [n], left where the source keeps it.
  Tensor host_vector(const std::string& name, int64_t n) const { return source_.get(name, {n}); }
  // [n] as f32 in the store.
  Tensor vector(const std::string& name, int64_t n);
  // The same, or an undefined tensor when the checkpoint has none.
  Tensor optional_vector(const std::string& name, int64_t n);
  // [rows, cols] as f32 in the store, not counted (per-expert biases).
  Tensor f32_table(const std::string& name, int64_t rows, int64_t cols);
  // [experts, rows, cols] in the store, counted as the `used` experts a
  // token routes to.
  Tensor expert_stack(const std::string& name, int64_t experts, int64_t rows, int64_t cols, int64_t used);
  // [experts, rows, cols] left where the source keeps it (expert
  // parallelism copies a rank's experts out), counted as the rank's share of
  // the `used` experts a token routes to, over `ranks` ranks.
  Tensor host_experts(const std::string& name, int64_t experts, int64_t rows, int64_t cols, int64_t used,
                      int32_t ranks);
  // Bytes read per step by something stored another way (a tied output
  // projection, a weight the caller stores after changing it).
  void count(size_t bytes) { bytes_ += bytes; }
  size_t bytes() const { return bytes_; }

 private:
  const WeightSource& source_;
  WeightStore& store_;
  size_t bytes_ = 0;
};

}  // namespace deepinfer
