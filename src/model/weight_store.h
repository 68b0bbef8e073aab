// WeightStore: places checkpoint tensors on the backend. On the CPU, matrices
// stay zero-copy views into the memory-mapped file; small vectors (norm
// weights, biases) are converted to f32 and owned here. Device backends have
// no kernels for GGUF's block-quantised matrices: those are dequantised on the
// host and stored in the backend's activation dtype.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace deepinfer {

class WeightStore {
 public:
  explicit WeightStore(Backend& backend) : backend_(backend) {}

  // A weight matrix on the backend: the file's own view where the backend
  // reads host weights (Backend::reads_host_weights), else a copy in backend
  // memory, quantised blocks dequantised to the activation dtype.
  Tensor matrix(const Tensor& host);
  // A linear layer's weight: as matrix(), except that FP8 row blocks stay
  // FP8 on a backend that multiplies with them (Backend::stores_fp8_weights).
  Tensor linear_weight(const Tensor& host);
  // Matrices with equal columns and dtype stacked along their rows into one
  // matrix (fused QKV / gate-up projections), so one product reads them all.
  // Returns an undefined tensor where the backend does not stack projections
  // (Backend::stacks_projections) or when the parts cannot be fused.
  Tensor fused_matrix(std::initializer_list<Tensor> parts);
  // A stack of expert matrices [experts, rows, cols]; where the backend reads
  // host weights any view of the file (e.g. half of a fused gate_up stack),
  // elsewhere a contiguous copy.
  Tensor expert_stack(const Tensor& host);
  // A vector converted to f32 (from f32/f16/bf16), on the backend.
  Tensor f32_vector(const Tensor& host);
  Tensor f32_vector(const std::vector<float>& values);
  // Vectors concatenated into one f32 vector (biases of fused projections).
  Tensor f32_concat(std::initializer_list<Tensor> parts);

  // Bytes `host` takes once stored (what a decode step reads of it).
  size_t stored_bytes(const Tensor& host) const;

  size_t bytes_mapped() const { return bytes_mapped_; }
  size_t bytes_owned() const { return bytes_owned_; }

 private:
  // `host`, or for a contiguous quantised tensor its rows dequantised into
  // `scratch` in the activation dtype (device backends have no block kernels).
  Tensor dequantized_view(const Tensor& host, std::vector<char>& scratch) const;

  Backend& backend_;
  std::vector<Buffer> owned_;
  size_t bytes_mapped_ = 0;
  size_t bytes_owned_ = 0;
};

// Contiguous GGUF block-quantised rows (any number of leading dimensions)
// dequantised with the CPU kernels and rounded to `to` (f32, f16 or bf16).
std::vector<char> dequantize_rows(const Tensor& host, DType to);

}  // namespace deepinfer
