// Kernels for GGUF block-quantised weights on the CPU: dequantisation and dot
// products that work on the blocks directly. Layouts follow ggml byte for byte.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_isa.h"
#include "core/dtype.h"

namespace deepinfer::cpu {

// The kernels for one weight dtype. Matrix-vector products first convert the
// activation vector once to `act` (e.g. Q8_1 or Q8_K, so that the inner loop is
// integer arithmetic), then call `dot` for every weight row.
struct QuantKernels {
  DType weight = DType::F32;
  DType act = DType::F32;  // F32 means `dot` reads the f32 vector directly
  // n is a multiple of the weight dtype's block size in all three functions.
  void (*dequantize_row)(const void* src, float* dst, int64_t n) = nullptr;
  void (*quantize_act)(const float* src, void* dst, int64_t n) = nullptr;  // null when act == F32
  float (*dot)(const void* weight_row, const void* act_row, int64_t n) = nullptr;
};

// Throws deepinfer::Error for dtypes without CPU kernels. Returns the kernels
// of active_isa() (cpu_isa.h): the widest vector units this CPU has.
const QuantKernels& quant_kernels(DType weight);

// The kernels of one instruction set; throws deepinfer::Error when this CPU
// cannot run it. For tests and benchmarks that compare the levels.
const QuantKernels& quant_kernels_for(DType weight, CpuIsa isa);

// The portable scalar kernels: same dequantisation bit for bit, and the same
// activation format and dots up to float rounding. For tests and comparison.
const QuantKernels& quant_kernels_portable(DType weight);

}  // namespace deepinfer::cpu
