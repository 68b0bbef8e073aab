// The split-KV merge shared by combine_kernel (cuda_attention.cu) and the
// tensor-core kernels' in-kernel combine (cuda_attention_mma.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

// Output row (token t, query head h) from the num_splits partials [acc,
// max, sum] (max in natural-log units), dims d0, d0 + d_step, ... . The
// partials are read through L2 (__ldcg): in the in-kernel combine they
// were written by other blocks of the same launch.
template <typename T>
__device__ __forceinline__ void combine_split_row(const AttentionLaunch& a, int64_t t, int h, int d0, int d_step) {
  const int heads_q = static_cast<int>(a.q.heads), dim = static_cast<int>(a.v.dim);
  const int64_t split_stride = a.q.n * heads_q * int64_t(dim + 2);
  const float* part = a.partial + (t * heads_q + h) * (dim + 2);
  float M = a.sinks ? a.sinks[h] : -INFINITY;
  for (int sp = 0; sp < a.num_splits; ++sp) M = fmaxf(M, __ldcg(part + sp * split_stride + dim));
  T* out = reinterpret_cast<T*>(a.out.base + t * a.out.stride0 + h * a.out.stride1);
  if (M == -INFINITY) {
    for (int d = d0; d < dim; d += d_step) out[d] = from_f<T>(0.0f);
    return;
  }
  float denom = a.sinks ? expf(a.sinks[h] - M) : 0.0f;
  for (int sp = 0; sp < a.num_splits; ++sp) {
    const float* p = part + sp * split_stride;
    denom += __ldcg(p + dim + 1) * expf(__ldcg(p + dim) - M);
  }
  for (int d = d0; d < dim; d += d_step) {
    float o = 0.0f;
    for (int sp = 0; sp < a.num_splits; ++sp) {
      const float* p = part + sp * split_stride;
      o += __ldcg(p + d) * expf(__ldcg(p + dim) - M);
    }
    out[d] = from_f<T>(denom > 0.0f ? o / denom : 0.0f);
  }
}

}  // namespace deepinfer::cuda
