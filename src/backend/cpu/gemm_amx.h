// Prefill GEMM on block-quantised weights with AMX int8 tiles.
//
// out[n, m] = x[n, k] * W[m, k]^T (+ bias). Each 32-element block of the
// activations becomes two int8 planes - its Q8_1 quants and their rounding
// residual at 1/128 of the scale - laid out once in the tile unit's VNNI
// order; each thread then takes 16 weight rows at a time, expands their
// blocks to int8 with one scale (and min) per block, and multiplies them with
// every 16 activation rows by `tdpbssd`, one block (and plane) per tile
// product. The int32 block sums are scaled by the weight and activation block
// scales and accumulated in f32. Activations keep ~15 bits per block, so
// prefill stays as close to exact as with f32 activations (8-bit ones alone
// moved the reference tests' logits measurably).
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
