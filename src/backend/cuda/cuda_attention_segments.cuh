// Key segments for batch-invariant attention (AttentionLaunch::segment_keys).
//
// In the batch-invariant mode a row's keys are cut at fixed multiples of
// segment_keys. Each segment's softmax runs from a fresh state, and the
// segments' (max, sum, unnormalised output) fold into the row's result in key
// order, always with the functions below. The tensor-core prefill kernel folds
// them in registers as its key loop crosses a boundary; a split-KV launch gives
// each block one segment and combine_segments_kernel folds the partials. Both
// run the same float operations in the same order, so a row has the same bits
// whether its keys were split over blocks or not. Whether to split can then
// follow the batch (split-KV fills the GPU at batch 1) without changing a bit.
//
// All values are in log2 units (scores scaled by log2(e)). Explicit _rn
// intrinsics keep the compiler from contracting the two paths differently.
#pragma once

#include <cmath>

#include "backend/cuda/cuda_mma.cuh"

namespace deepinfer::cuda {

// A fold's weights: folded = running * a + segment * b.
struct SegmentFold {
  float a, b;
};

// Folds a segment's max and sum into a row's running (m, l). An empty segment
// (no key of the row, m_s = -inf) changes nothing and a first non-empty one is
// taken as it is, so segments that one path visits and the other skips (empty
// blocks of a split launch, tiles before a sliding window) cannot change bits.
__device__ __forceinline__ SegmentFold fold_segment_stats(float& m, float& l, float m_s, float l_s) {
  if (m_s == -INFINITY) return {1.0f, 0.0f};
  if (m == -INFINITY) {
    m = m_s;
    l = l_s;
    return {0.0f, 1.0f};
  }
  const float m_new = fmaxf(m, m_s);
  const SegmentFold w{fast_exp2(m - m_new), fast_exp2(m_s - m_new)};
  l = __fmaf_rn(l_s, w.b, __fmul_rn(l, w.a));
  m = m_new;
  return w;
}

// One output element of the fold whose weights fold_segment_stats returned.
__device__ __forceinline__ float fold_segment_value(float o, float o_s, SegmentFold w) {
  if (w.b == 0.0f) return o;
  if (w.a == 0.0f) return o_s;
  return __fmaf_rn(o_s, w.b, __fmul_rn(o, w.a));
}

// The factor that turns a row's folded output into attention's output: the
// softmax denominator, with the attention sink's mass (log2 units, -inf for
// none) added last.
__device__ __forceinline__ float segment_output_scale(float m, float l, float sink) {
  const float m_all = fmaxf(m, sink);
  if (m_all == -INFINITY) return 0.0f;
  const float a = fast_exp2(m - m_all);
  const float denom = __fmaf_rn(l, a, sink == -INFINITY ? 0.0f : fast_exp2(sink - m_all));
  return denom > 0.0f ? __fdiv_rn(a, denom) : 0.0f;
}

}  // namespace deepinfer::cuda
