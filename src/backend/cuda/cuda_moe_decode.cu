// The decode path of moe_experts: a few (token, choice) slots, each read as a
// gemv, so that a batch-1 MoE layer streams its chosen experts' weights at
// close to HBM bandwidth. Two kernels, no index pass and no row padding:
//  1. gate/up: a warp takes (slot, ffn column j), reads the slot's expert id,
//     dots x[token] with the expert's gate row j and up row j and writes
//     act(gate) * up rounded to the activation dtype into h[slot][j] (the
//     workspace), as the tensor-core path's epilogue does.
//  2. down + combine: a warp takes (token, hidden column i), dots down row i
//     of each of the token's experts with h[slot], adds the bias and sums
//     route weight * result over the slots in slot order, starting from the
//     output when accumulating: the grouped path's combine, operation for
//     operation, so both paths give the same kind of result.
// Weights stream with 16-byte non-caching loads, several in flight per lane;
// consecutive warps take the same column of different slots, so slots that
// share an expert (several tokens choosing it) read its rows at about the same
// time and all but the first are served by L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_moe_common.cuh"

namespace deepinfer::cuda {

namespace {

using moe_detail::bias_at;
using moe_detail::expert_at;
using moe_detail::glu;

constexpr int kWarps = 8;  // per block
constexpr int kThreads = 32 * kWarps;
// Work partition, from a sweep on the H200 at the Qwen3-30B-A3B shape (1-8
// tokens at top 8): 16-byte loads per lane in flight per gate/up weight row
// (2 rows) and blocks per SM the register cap must allow; the slots of a
// token whose down rows are loaded together (top 8 in one pass: 8 weight + 8
// h loads per lane in flight). Unroll 2 at 6 blocks (the 1-token grid in one
// wave) and 4 down slots at 3 blocks measured the same at 1 token and up to
// 4% slower at 4-8 tokens.
constexpr int kUpUnroll = 4, kUpMinBlocks = 4;
constexpr int kDownSlots = 8, kDownMinBlocks = 2;

__device__ __forceinline__ float2 to_f2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_f2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

// acc + the dot product of 8 elements of type T packed in each of a and b.
template <typename T>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const T2* pa = reinterpret_cast<const T2*>(&a);
  const T2* pb = reinterpret_cast<const T2*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = to_f2(pa[i]), fb = to_f2(pb[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

template <typename T, int kUpUnroll, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_decode_up_kernel(MoeExpertsLaunch m, T* h) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int lane = threadIdx.x & 31;
  const int64_t slots = m.n * m.top_k;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t slot = warp % slots, j = warp / slots;
  if (j >= m.ffn) return;
  const int64_t t = slot / m.top_k;
  const int e = expert_at(m.ids, t, static_cast<int>(slot % m.top_k), m.n_experts, j == 0 && lane == 0, m.err);
  const auto* x = reinterpret_cast<const uint4*>(row_ptr(m.x, t));
  const auto* g = reinterpret_cast<const uint4*>(m.gate.base + e * m.gate.expert_stride + j * m.gate.row_stride);
  const auto* u = reinterpret_cast<const uint4*>(m.up.base + e * m.up.expert_stride + j * m.up.row_stride);
  const int64_t chunks = m.hidden / 8;
  float ga = 0.0f, ua = 0.0f;
  int64_t k = lane;
  for (; k + 32 * (kUpUnroll - 1) < chunks; k += 32 * kUpUnroll) {
    uint4 xv[kUpUnroll], gv[kUpUnroll], uv[kUpUnroll];
#pragma unroll
    for (int i = 0; i < kUpUnroll; ++i) {
      gv[i] = load_stream(g + k + 32 * i);
      uv[i] = load_stream(u + k + 32 * i);
      xv[i] = __ldg(x + k + 32 * i);
    }
#pragma unroll
    for (int i = 0; i < kUpUnroll; ++i) {
      ga = dot8<T>(xv[i], gv[i], ga);
      ua = dot8<T>(xv[i], uv[i], ua);
    }
  }
  for (; k < chunks; k += 32) {
    const uint4 xv = __ldg(x + k);
    ga = dot8<T>(xv, load_stream(g + k), ga);
    ua = dot8<T>(xv, load_stream(u + k), ua);
  }
  ga = warp_sum(ga) + bias_at(m.gate_bias, m.bias_type, e * m.ffn + j);
  ua = warp_sum(ua) + bias_at(m.up_bias, m.bias_type, e * m.ffn + j);
  if (lane == 0) h[slot * m.ffn + j] = from_f<T>(glu(m.glu, ga, ua));
}

template <typename T, int kDownSlots, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) moe_decode_down_kernel(MoeExpertsLaunch m, const T* h) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t t = warp % m.n, i = warp / m.n;
  if (i >= m.hidden) return;
  const float* route_w = row_as<const float>(m.weights, t);
  T* o = row_as<T>(m.out, t);
  float acc = m.accumulate ? to_f(o[i]) : 0.0f;
  const int64_t chunks = m.ffn / 8;
  for (int c0 = 0; c0 < m.top_k; c0 += kDownSlots) {
    const int used = min(kDownSlots, m.top_k - c0);
    int e[kDownSlots];
    const uint4* hr[kDownSlots];
    const uint4* w[kDownSlots];
#pragma unroll
    for (int s = 0; s < kDownSlots; ++s) {
      const int c = c0 + min(s, used - 1);
      e[s] = expert_at(m.ids, t, c, m.n_experts, false, m.err);
      hr[s] = reinterpret_cast<const uint4*>(h + (t * m.top_k + c) * m.ffn);
      w[s] = reinterpret_cast<const uint4*>(m.down.base + e[s] * m.down.expert_stride + i * m.down.row_stride);
    }
    float part[kDownSlots] = {};
    for (int64_t k = lane; k < chunks; k += 32) {
      uint4 hv[kDownSlots], wv[kDownSlots];
#pragma unroll
      for (int s = 0; s < kDownSlots; ++s) {
        if (s < used) {
          wv[s] = load_stream(w[s] + k);
          hv[s] = __ldg(hr[s] + k);
        }
      }
#pragma unroll
      for (int s = 0; s < kDownSlots; ++s) {
        if (s < used) part[s] = dot8<T>(hv[s], wv[s], part[s]);
      }
    }
#pragma unroll
    for (int s = 0; s < kDownSlots; ++s) {
      if (s < used) {
        const float y = warp_sum(part[s]) + bias_at(m.down_bias, m.bias_type, e[s] * m.hidden + i);
        acc += route_w[c0 + s] * y;
      }
    }
  }
  if (lane == 0) o[i] = from_f<T>(acc);
}

bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

template <typename T>
void launch_decode(const MoeExpertsLaunch& m, cudaStream_t s) {
  const int64_t up_warps = m.n * m.top_k * m.ffn, down_warps = m.n * m.hidden;
  T* h = reinterpret_cast<T*>(m.workspace);
  launch_chained(moe_decode_up_kernel<T, kUpUnroll, kUpMinBlocks>,
                 static_cast<unsigned>((up_warps + kWarps - 1) / kWarps), kThreads, 0, s, m, h);
  launch_chained(moe_decode_down_kernel<T, kDownSlots, kDownMinBlocks>,
                 static_cast<unsigned>((down_warps + kWarps - 1) / kWarps), kThreads, 0, s, m,
                 static_cast<const T*>(h));
}

}  // namespace

size_t moe_decode_workspace_bytes(int64_t n, int top_k, int64_t ffn) {
  return static_cast<size_t>(n * top_k) * static_cast<size_t>(ffn) * 2;
}

bool moe_decode_applies(const MoeExpertsLaunch& m) {
  if (m.n * m.top_k > kMoeDecodeMaxSlots || m.x_type != m.w_type || m.w_type == ElemType::F32) return false;
  if (m.hidden % 8 != 0 || m.ffn % 8 != 0 || !aligned16(m.workspace, 0)) return false;
  if (!aligned16(m.x.base, 0)) return false;
  for (int d = 0; d < m.x.nouter; ++d) {
    if (m.x.stride[d] % 16 != 0) return false;
  }
  for (const MoeWeightView* w : {&m.gate, &m.up, &m.down}) {
    if (!aligned16(w->base, w->expert_stride) || w->row_stride % 16 != 0) return false;
  }
  return true;
}

void launch_moe_experts_decode(const MoeExpertsLaunch& m, Stream stream) {
  if (m.w_type == ElemType::BF16) {
    launch_decode<__nv_bfloat16>(m, static_cast<cudaStream_t>(stream));
  } else {
    launch_decode<__half>(m, static_cast<cudaStream_t>(stream));
  }
}

}  // namespace deepinfer::cuda
