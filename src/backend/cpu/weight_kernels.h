// Row kernels for every weight dtype the CPU backend accepts: the plain float
// formats are handled here, block-quantised ones by quants.h.
#pragma once

#include "backend/cpu/quants.h"

namespace deepinfer::cpu {

// Throws deepinfer::Error for dtypes the CPU backend cannot read as weights.
const QuantKernels& weight_kernels(DType weight);

}  // namespace deepinfer::cpu
