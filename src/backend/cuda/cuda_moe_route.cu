// Routing of mixture-of-experts layers: per token, softmax or sigmoid scores
// over the router logits, an optional correction bias for the choice,
// optional group-limited selection, the top-k experts and their weights
// (renormalised and scaled), as the CPU backend computes them. One warp per
// token; rows without expert groups or NaN take a register-only path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe.h"

namespace deepinfer::cuda {

namespace {

// The lowest-index untaken entry if it is NaN, else the largest non-NaN
// untaken value with ties to the lower index: the CPU's take_best. Marks it taken.
__device__ int warp_take_best(const float* v, uint8_t* taken, int n) {
  const int lane = threadIdx.x & 31;
  int first = INT_MAX, best = -1;
  float bv = 0.0f;
  for (int i = lane; i < n; i += 32) {
    if (taken[i]) continue;
    first = min(first, i);
    const float x = v[i];
    if (x != x) continue;
    if (best < 0 || x > bv) {
      best = i;
      bv = x;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    const int ob = __shfl_xor_sync(0xffffffffu, best, o);
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
      best = ob;
      bv = ov;
    }
  }
  const int r = (first != INT_MAX && v[first] != v[first]) ? first : best;
  __syncwarp();
  if (lane == 0 && r >= 0) taken[r] = 1;
  __syncwarp();
  return r;
}

struct RouteSmem {
  size_t scores, choice, group_rank, taken, group_taken, per_warp;
  RouteSmem(int e, int g) {
    scores = 0;
    choice = scores + 4 * static_cast<size_t>(e);
    group_rank = choice + 4 * static_cast<size_t>(e);
    taken = group_rank + 4 * static_cast<size_t>(g);
    group_taken = taken + static_cast<size_t>(e);
    per_warp = (group_taken + static_cast<size_t>(g) + 15) / 16 * 16;
  }
};

// The top-k of one token in registers, for routes without expert groups
// and rows without NaN (the shared-memory path below handles those). Lane l
// holds experts l, l + 32, ...; each round is two warp reductions, the
// largest value (as an order-preserving integer, -0 folded into +0) then the
// lowest expert index holding it: the same choice as warp_take_best, whose
// scans of shared memory made routing a ~1,900-instruction serial chain
// (ncu, H200 run 47: 10.6 us at base clocks for one token, top 8 of 128).
// Scores, choices and weights use the same arithmetic in the same order as
// that path, so the two give identical results. Returns false, having
// written nothing, for a row it does not take. kPerLane: experts per lane
// (2, 4 or 8: the expert count over 32, rounded up to one of those).
constexpr int kFastRouteMaxPerLane = 8;  // up to 256 experts

// An unsigned key that orders non-NaN floats as their values (-0 and +0 alike).
__device__ __forceinline__ uint32_t orderable(float x) {
  const uint32_t b = __float_as_uint(x + 0.0f);  // -0 -> +0, which compare equal
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <typename T, int kPerLane>
__device__ bool route_token_in_registers(const MoeRouteLaunch& a, int64_t t) {
  const int lane = threadIdx.x & 31;
  const int E = a.n_experts;
  const T* l = row_as<const T>(a.logits, t);
  float score[kPerLane];
  uint32_t key[kPerLane];
  bool nan = false;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < E ? to_f(l[e]) : 0.0f;
    nan |= e < E && score[i] != score[i];
  }
  if (__any_sync(0xffffffffu, nan)) return false;
  if (a.sigmoid) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] = 1.0f / (1.0f + expf(-score[i]));
  } else {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i < E) mx = fmaxf(mx, score[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i < E) sum += score[i] = expf(score[i] - mx);
    }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] /= sum;
  }
  nan = false;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const float c = e < E && a.bias ? score[i] + a.bias[e] : score[i];
    nan |= e < E && c != c;  // e.g. exp overflow, or inf + -inf from a bias
    key[i] = e < E ? orderable(c) : 0u;  // 0: below every orderable non-NaN value
  }
  if (__any_sync(0xffffffffu, nan)) return false;

  int32_t my_id = 0;  // lane j < top_k keeps choice j
  float my_w = 0.0f, sum = 0.0f;
  for (int j = 0; j < a.top_k; ++j) {
    uint32_t best = 0;
    int best_i = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (key[i] > best) {  // strict: the lower index wins a tie within the lane
        best = key[i];
        best_i = i;
      }
    }
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const uint32_t e = __reduce_min_sync(0xffffffffu, best == top ? static_cast<uint32_t>(lane + 32 * best_i) : ~0u);
    const int owner = static_cast<int>(e & 31), slot = static_cast<int>(e >> 5);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i == slot) {
        s = score[i];
        if (lane == owner) key[i] = 0;  // taken
      }
    }
    s = __shfl_sync(0xffffffffu, s, owner);
    sum += s;
    if (lane == j) {
      my_id = static_cast<int32_t>(e);
      my_w = s;
    }
  }
  const float factor = a.renormalize && sum > 0.0f ? a.scaling / sum : a.scaling;
  if (lane < a.top_k) {
    row_as<int32_t>(a.ids, t)[lane] = my_id;
    row_as<float>(a.weights, t)[lane] = my_w * factor;
  }
  return true;
}

template <typename T>
__global__ void moe_route_kernel(MoeRouteLaunch a, RouteSmem lay, int64_t n) {
  wait_for_prior_kernel();
  release_next_kernel();
  extern __shared__ __align__(16) char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = int64_t{blockIdx.x} * (blockDim.x >> 5) + warp;
  if (t >= n) return;
  if (a.n_groups <= 1 && a.n_experts <= 32 * kFastRouteMaxPerLane && a.top_k <= 32) {
    const bool done = a.n_experts <= 64    ? route_token_in_registers<T, 2>(a, t)
                      : a.n_experts <= 128 ? route_token_in_registers<T, 4>(a, t)
                                           : route_token_in_registers<T, kFastRouteMaxPerLane>(a, t);
    if (done) return;
  }
  char* base = smem + warp * lay.per_warp;
  float* scores = reinterpret_cast<float*>(base + lay.scores);
  float* choice = reinterpret_cast<float*>(base + lay.choice);
  float* group_rank = reinterpret_cast<float*>(base + lay.group_rank);
  uint8_t* taken = reinterpret_cast<uint8_t*>(base + lay.taken);
  uint8_t* group_taken = reinterpret_cast<uint8_t*>(base + lay.group_taken);
  const int E = a.n_experts;
  const T* l = row_as<const T>(a.logits, t);

  if (a.sigmoid) {
    for (int e = lane; e < E; e += 32) scores[e] = 1.0f / (1.0f + expf(-to_f(l[e])));
  } else {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, to_f(l[e]));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += scores[e] = expf(to_f(l[e]) - mx);
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) scores[e] /= sum;
  }
  for (int e = lane; e < E; e += 32) {
    choice[e] = a.bias ? scores[e] + a.bias[e] : scores[e];
    taken[e] = 0;
  }
  __syncwarp();
  if (a.n_groups > 1) {
    const int size = E / a.n_groups;
    for (int g = 0; g < a.n_groups; ++g) {
      const float* c = choice + g * size;
      const int first = warp_take_best(c, taken + g * size, size);
      const float rank = a.group_max ? c[first] : c[first] + c[warp_take_best(c, taken + g * size, size)];
      if (lane == 0) group_rank[g] = rank;
    }
    for (int e = lane; e < E; e += 32) taken[e] = 1;
    for (int g = lane; g < a.n_groups; g += 32) group_taken[g] = 0;
    __syncwarp();
    for (int i = 0; i < a.top_k_groups; ++i) {
      const int g = warp_take_best(group_rank, group_taken, a.n_groups);
      for (int e = lane; e < size; e += 32) taken[g * size + e] = 0;
      __syncwarp();
    }
  }
  int32_t* ids = row_as<int32_t>(a.ids, t);
  float* w = row_as<float>(a.weights, t);
  float sum = 0.0f;
  for (int j = 0; j < a.top_k; ++j) {
    const int e = warp_take_best(choice, taken, E);
    if (lane == 0) {
      ids[j] = e;
      sum += w[j] = scores[e];
    }
  }
  if (lane == 0) {
    const float factor = a.renormalize && sum > 0.0f ? a.scaling / sum : a.scaling;
    for (int j = 0; j < a.top_k; ++j) w[j] *= factor;
  }
}


}  // namespace

size_t moe_route_smem_per_warp(int n_experts, int n_groups) { return RouteSmem(n_experts, n_groups).per_warp; }

void launch_moe_route(const MoeRouteLaunch& r, Stream stream) {
  const int64_t n = r.logits.rows;
  if (n == 0) return;
  const RouteSmem lay(r.n_experts, r.n_groups);
  const int warps = static_cast<int>(std::max<size_t>(1, std::min<size_t>(4, (48u << 10) / lay.per_warp)));
  const unsigned blocks = static_cast<unsigned>((n + warps - 1) / warps);
  auto s = static_cast<cudaStream_t>(stream);
  DI_DISPATCH_ELEM(r.logits_type, T,
                   (launch_chained(moe_route_kernel<T>, blocks, 32 * warps, warps * lay.per_warp, s, r, lay, n)));
}

}  // namespace deepinfer::cuda
