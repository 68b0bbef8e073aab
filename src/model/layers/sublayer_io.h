// How a sub-layer (attention, MLP) meets the residual stream.
//
// Two schemes, chosen per forward by the model:
// - separate: the model normalises the stream into `input` and takes the
//   sub-layer's output in `out` (delta), adding it to the stream later,
//   fused with the next norm (prefill, and backends without the fusions);
// - in place (Backend::residual_stream_in_place, decode on CUDA): `input` is
//   the stream itself and `norm` its RMSNorm, folded into the sub-layer's
//   first product; `out` is the stream too and the last product adds to it.
//   No norm or add kernel runs between the products.
#pragma once

#include "backend/backend.h"

namespace deepinfer::layers {

struct SublayerIo {
  Tensor input;                  // normalised rows, or the stream when norm is set
  const RowNorm* norm = nullptr;  // the stream's norm to fold into the first product
  Tensor normed;                 // scratch like input: the norm's rows where it cannot be folded
  Tensor out;                    // the output (delta), or the stream when accumulate
  bool accumulate = false;
  Tensor delta;                  // scratch like out: the product where it cannot accumulate
};

// linear(the normalised input): the norm folded in where it is set.
void project_in(Backend& backend, const SublayerIo& io, const Tensor& weight, const Tensor& bias, Tensor out);
// The normalised input as a tensor, for products that cannot fold the norm
// (runs the norm into io.normed when it is set).
Tensor normalised_input(Backend& backend, const SublayerIo& io);
// io.out = linear(x), or io.out += linear(x) when io.accumulate.
void project_out(Backend& backend, const SublayerIo& io, const Tensor& x, const Tensor& weight, const Tensor& bias);

}  // namespace deepinfer::layers
