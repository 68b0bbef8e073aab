// Prefill GEMM on block-quantised weights with AMX int8 tiles.
//
// out[n, m] = x[n, k] * W[m, k]^T (+ bias). The activations are quantised to
// 8 bits per 32-element block (the Q8_1 format of the matrix-vector path) and
// laid out once in the tile unit's VNNI order; each thread then takes 16
// weight rows at a time, expands their blocks to int8 with one scale (and
// min) per block, and multiplies them with every 16 activation rows by
// `tdpbssd`, one block per tile product. The int32 block sums are scaled by
// the weight and activation block scales and accumulated in f32, so the
// result equals the matrix-vector kernels' up to float rounding.
#pragma once

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace deepinfer::cpu::amx {

// Whether the AMX GEMM handles weights of this dtype (the 32-element block
// formats, Q4_K, Q5_K and Q6_K).
bool supports(DType weight);

// Runs only where active_isa() is CpuIsa::Amx. x, out: f32, rows contiguous;
// weight: a supported dtype; bias f32 or undefined.
void linear(ThreadPool& pool, ScratchBuffer& act_scratch, std::vector<ScratchBuffer>& thread_scratch,
            const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out);

}  // namespace deepinfer::cpu::amx
