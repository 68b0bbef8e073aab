#include "model/layers/sublayer_io.h"

#include "ops/ops.h"

namespace deepinfer::layers {

void project_in(Backend& backend, const SublayerIo& io, const Tensor& weight, const Tensor& bias, Tensor out) {
  if (io.norm) {
    ops::norm_linear(backend, io.input, *io.norm, weight, bias, out, io.normed);
  } else {
    ops::linear(backend, io.input, weight, bias, out);
  }
}

Tensor normalised_input(Backend& backend, const SublayerIo& io) {
  if (!io.norm) return io.input;
  ops::rms_norm(backend, io.input, io.norm->weight, io.norm->eps, io.norm->weight_offset, io.normed);
  return io.normed;
}

void project_out(Backend& backend, const SublayerIo& io, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (io.accumulate) {
    ops::linear_accumulate(backend, x, weight, bias, io.out, io.delta);
  } else {
    ops::linear(backend, x, weight, bias, io.out);
  }
}

}  // namespace deepinfer::layers
