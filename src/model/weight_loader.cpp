#include "model/weight_loader.h"

namespace deepinfer {

Tensor WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols) {
  return store_.matrix(host_matrix(name, rows, cols));
}

Tensor WeightLoader::linear(const std::string& name, int64_t rows, int64_t cols) {
  return store_.linear_weight(host_matrix(name, rows, cols));
}

Tensor WeightLoader::host_matrix(const std::string& name, int64_t rows, int64_t cols) {
  Tensor t = source_.get(name, {rows, cols});
  bytes_ += store_.stored_bytes(t);
  return t;
}

Tensor WeightLoader::vector(const std::string& name, int64_t n) { return store_.f32_vector(host_vector(name, n)); }

Tensor WeightLoader::optional_vector(const std::string& name, int64_t n) {
  return source_.has(name) ? vector(name, n) : Tensor();
}

Tensor WeightLoader::f32_table(const std::string& name, int64_t rows, int64_t cols) {
  return store_.f32_vector(source_.get(name, {rows, cols})).reshape({rows, cols});
}

Tensor WeightLoader::expert_stack(const std::string& name, int64_t experts, int64_t rows, int64_t cols,
                                  int64_t used) {
  Tensor t = source_.get_experts(name, experts, rows, cols);
  bytes_ += store_.stored_bytes(t) / static_cast<size_t>(experts) * static_cast<size_t>(used);
  return store_.expert_stack(t);
}

Tensor WeightLoader::host_experts(const std::string& name, int64_t experts, int64_t rows, int64_t cols,
                                  int64_t used, int32_t ranks) {
  Tensor t = source_.get_experts(name, experts, rows, cols);
  bytes_ += store_.stored_bytes(t) / static_cast<size_t>(experts) * static_cast<size_t>(used) /
            static_cast<size_t>(ranks);
  return t;
}

}  // namespace deepinfer
