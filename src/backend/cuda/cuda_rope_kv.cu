// RoPE and KV-cache writes of the CUDA backend: rotary embedding of q and k,
// the store of k and v into the paged cache (bf16/f16 or e4m3), and the fused
// decode kernels that do both per (token, head), with Qwen3's per-head q/k
// RMSNorm and MLA's latent variant.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s); }

// One rotary pair, every product and sum rounded separately so that the
// kernels that rotate (rope, the fused rope + store) agree bit for bit
// whatever the compiler contracts.
__device__ __forceinline__ float2 rotate_pair(float x0, float x1, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
}

// Rotates token t's q and k heads in place; table: 2 * half floats of shared memory (cos, sin).
template <typename T>
__device__ void rotate_token(int64_t t, const HeadView& q, const HeadView& k, const int32_t* positions,
                             const float* inv_freq, int half, bool neox, float factor, float* table) {
  float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    table[i] = c * factor;
    table[half + i] = s * factor;
  }
  __syncthreads();
  int64_t heads_q = q.heads, heads = heads_q + (k.base ? k.heads : 0);
  for (int64_t item = threadIdx.x; item < heads * half; item += blockDim.x) {
    int64_t h = item / half;
    int i = static_cast<int>(item % half);
    T* v = h < heads_q ? reinterpret_cast<T*>(q.base + t * q.stride0 + h * q.stride1)
                       : reinterpret_cast<T*>(k.base + t * k.stride0 + (h - heads_q) * k.stride1);
    int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float2 y = rotate_pair(to_f(v[a]), to_f(v[b]), table[i], table[half + i]);
    v[a] = from_f<T>(y.x);
    v[b] = from_f<T>(y.y);
  }
}

template <typename T>
__global__ void rope_kernel(HeadView q, HeadView k, const int32_t* positions, const float* inv_freq, int half,
                            bool neox, float factor) {
  wait_for_prior_kernel();
  release_next_kernel();
  extern __shared__ float table[];  // cos[half], sin[half]
  rotate_token<T>(blockIdx.x, q, k, positions, inv_freq, half, neox, factor, table);
}

// Token t's cache slot as (page, offset); false when nothing is to be
// stored: a padding token, or a slot past the cache (which sets the error bit).
__device__ __forceinline__ bool token_slot(int64_t t, const int32_t* slots, const CacheView& ck, uint32_t* err,
                                           int64_t& page, int64_t& offset) {
  const int64_t slot = slots[t];
  if (slot < 0) return false;  // padding token
  if (slot >= ck.pages * ck.page_size) {
    if (threadIdx.x == 0) atomicOr(err, kErrStoreKvSlot);
    return false;
  }
  page = slot / ck.page_size;
  offset = slot % ck.page_size;
  return true;
}

// Writes token t's K and V heads into its cache slot, as cache elements C
// (T itself, or FP8 e4m3).
template <typename T, typename C>
__device__ void store_token_kv(int64_t t, const HeadView& k, const HeadView& v, const int32_t* slots,
                               const CacheView& ck, const CacheView& cv, uint32_t* err) {
  int64_t page = 0, offset = 0;
  if (!token_slot(t, slots, ck, err, page, offset)) return;
  for (int64_t item = threadIdx.x; item < k.heads * k.dim; item += blockDim.x) {
    const int64_t h = item / k.dim, d = item % k.dim;
    const T* ks = reinterpret_cast<const T*>(k.base + t * k.stride0 + h * k.stride1);
    const T* vs = reinterpret_cast<const T*>(v.base + t * v.stride0 + h * v.stride1);
    C* kd = reinterpret_cast<C*>(ck.base + page * ck.stride0 + offset * ck.stride1 + h * ck.stride2);
    C* vd = reinterpret_cast<C*>(cv.base + page * cv.stride0 + offset * cv.stride1 + h * cv.stride2);
    kd[d] = from_f<C>(to_f(ks[d]));  // exact when C is T
    if (d < v.dim) vd[d] = from_f<C>(to_f(vs[d]));
  }
}

template <typename T, typename C>
__global__ void store_kv_kernel(HeadView k, HeadView v, const int32_t* slots, CacheView ck, CacheView cv,
                                uint32_t* err) {
  wait_for_prior_kernel();
  release_next_kernel();
  store_token_kv<T, C>(blockIdx.x, k, v, slots, ck, cv, err);
}

// RMSNorm in place of one head row by one warp, with rms_norm_rows_kernel's
// arithmetic for a one-warp row (lane l takes 16-byte chunks l, l + 32, ...;
// squares summed in element order, then warp_sum), so the fused paths match
// separate rms_norm calls.
template <typename T>
__device__ void norm_head_row(uint4* row, int64_t dim, const float* weight_f, const QkNormArgs& norm) {
  const int lane = threadIdx.x % 32;
  const int chunks = static_cast<int>(dim / 8);
  const float4* weight = reinterpret_cast<const float4*>(weight_f);
  float v[kNormMaxChunks][8];
  float ss = 0.0f;
#pragma unroll
  for (int c4 = 0; c4 < kNormMaxChunks; ++c4) {
    const int c = lane + c4 * 32;
    if (c >= chunks) continue;
    const uint4 a = row[c];
    const T* av = reinterpret_cast<const T*>(&a);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[c4][e] = to_f(av[e]);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[c4][e] * v[c4][e];
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + norm.eps);
#pragma unroll
  for (int c4 = 0; c4 < kNormMaxChunks; ++c4) {
    const int c = lane + c4 * 32;
    if (c >= chunks) continue;
    const float4 w0 = weight[2 * c], w1 = weight[2 * c + 1];
    const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    uint4 packed;
    T* pv = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int e = 0; e < 8; ++e) pv[e] = from_f<T>(v[c4][e] * inv * (ws[e] + norm.offset));
    row[c] = packed;
  }
}

// [Per-head q/k RMSNorm,] RoPE on q and k, then k (as rotated) and v into
// the cache: one launch instead of two to four in each decode layer. One
// block per (token, head), one thread per rotated pair: a thread computes its
// own angle, rotates its pair and, for a KV head, writes it (and its V
// elements) straight into the cache. With q/k norms the block's first warp
// normalises the head row in place first; the barrier after it makes those
// writes visible to the block. (A block per token walking all heads with 256
// threads took 8.6 us per decode layer of the 8B shape, each step a dependent
// round trip to L2; H200 run 26.) Grid (tokens, heads_q + heads_kv); block:
// half rounded up to a warp.
template <typename T, typename C>
__global__ void rope_store_kv_heads_kernel(HeadView q, HeadView k, HeadView v, const int32_t* positions,
                                           const float* inv_freq, int half, bool neox, float factor,
                                           const int32_t* slots, CacheView ck, CacheView cv, uint32_t* err,
                                           QkNormArgs norm) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int64_t t = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int i = threadIdx.x;
  const bool is_q = head < q.heads;
  const int64_t h = is_q ? head : head - q.heads;
  T* x = is_q ? reinterpret_cast<T*>(q.base + t * q.stride0 + h * q.stride1)
              : reinterpret_cast<T*>(k.base + t * k.stride0 + h * k.stride1);
  if (norm.q_weight) {
    if (i < 32) {
      norm_head_row<T>(reinterpret_cast<uint4*>(x), is_q ? q.dim : k.dim, is_q ? norm.q_weight : norm.k_weight, norm);
    }
    __syncthreads();
  }
  const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
  float r0 = 0.0f, r1 = 0.0f;
  if (i < half) {
    float sn, cs;
    sincosf(static_cast<float>(positions[t]) * inv_freq[i], &sn, &cs);
    const float2 y = rotate_pair(to_f(x[a]), to_f(x[b]), cs * factor, sn * factor);
    const T y0 = from_f<T>(y.x), y1 = from_f<T>(y.y);
    x[a] = y0;
    x[b] = y1;
    r0 = to_f(y0);
    r1 = to_f(y1);
  }
  int64_t page = 0, offset = 0;
  if (is_q || !token_slot(t, slots, ck, err, page, offset)) return;
  C* kd = reinterpret_cast<C*>(ck.base + page * ck.stride0 + offset * ck.stride1 + h * ck.stride2);
  C* vd = reinterpret_cast<C*>(cv.base + page * cv.stride0 + offset * cv.stride1 + h * cv.stride2);
  const T* vs = reinterpret_cast<const T*>(v.base + t * v.stride0 + h * v.stride1);
  if (i < half) {
    kd[a] = from_f<C>(r0);  // exact when C is T
    kd[b] = from_f<C>(r1);
  }
  // Dims past the rotary part keep their values.
  for (int d = 2 * half + i; d < k.dim; d += blockDim.x) kd[d] = from_f<C>(to_f(x[d]));
  for (int d = i; d < v.dim; d += blockDim.x) vd[d] = from_f<C>(to_f(vs[d]));
}

// Multi-head latent attention's norm + RoPE + latent-cache store
// (mla_rope_store_kv) in one launch instead of four per decode layer. Grid
// (tokens, heads + 1), one thread per rotated pair. Blocks y < heads rotate
// head y's q_pe into q_rot. Block `heads` takes the token's [latent | k_pe]
// row: its first warp normalises the latent part in place (rms_norm's
// one-warp-row arithmetic), then the block rotates k_pe in place and, after a
// barrier that makes the row's writes visible, stores the row in the token's
// cache slot (latent caches keep V inside K's row, so nothing else is stored).
template <typename T, typename C>
__global__ void mla_rope_store_kv_kernel(HeadView q_pe, HeadView q_rot, HeadView kv, int lora, QkNormArgs norm,
                                         const int32_t* positions, const float* inv_freq, int half, bool neox,
                                         float factor, const int32_t* slots, CacheView ck, uint32_t* err) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int64_t t = blockIdx.x, head = blockIdx.y;
  const int i = threadIdx.x;
  const bool is_q = head < q_pe.heads;
  T* row = reinterpret_cast<T*>(kv.base + t * kv.stride0);
  if (!is_q) {
    if (i < 32) norm_head_row<T>(reinterpret_cast<uint4*>(row), lora, norm.k_weight, norm);
    __syncthreads();
  }
  const T* src = is_q ? reinterpret_cast<const T*>(q_pe.base + t * q_pe.stride0 + head * q_pe.stride1) : row + lora;
  T* dst = is_q ? reinterpret_cast<T*>(q_rot.base + t * q_rot.stride0 + head * q_rot.stride1) : row + lora;
  if (i < half) {
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float sn, cs;
    sincosf(static_cast<float>(positions[t]) * inv_freq[i], &sn, &cs);
    const float2 y = rotate_pair(to_f(src[a]), to_f(src[b]), cs * factor, sn * factor);
    dst[a] = from_f<T>(y.x);
    dst[b] = from_f<T>(y.y);
  }
  // Dims past the rotary part keep their values.
  if (is_q) {
    for (int64_t d = 2 * half + i; d < q_pe.dim; d += blockDim.x) dst[d] = src[d];
    return;
  }
  __syncthreads();
  int64_t page = 0, offset = 0;
  if (!token_slot(t, slots, ck, err, page, offset)) return;
  C* kd = reinterpret_cast<C*>(ck.base + page * ck.stride0 + offset * ck.stride1);
  for (int64_t d = i; d < kv.dim; d += blockDim.x) kd[d] = from_f<C>(to_f(row[d]));  // exact when C is T
}

}  // namespace

void launch_rope(ElemType type, HeadView q, HeadView k, const int32_t* positions, const float* inv_freq,
                 int rotary_dim, bool neox, float attention_factor, Stream stream) {
  if (q.n == 0) return;
  int half = rotary_dim / 2;
  size_t smem = 2 * static_cast<size_t>(half) * sizeof(float);
  DI_DISPATCH_ELEM(type, T, (launch_chained(rope_kernel<T>, static_cast<unsigned>(q.n), 256, smem, as_stream(stream),
                                q, k, positions, inv_freq, half, neox, attention_factor)));
}

void launch_rope_store_kv(ElemType type, HeadView q, HeadView k, HeadView v, const int32_t* positions,
                          const float* inv_freq, int rotary_dim, bool neox, float attention_factor,
                          const int32_t* slots, CacheView ck, CacheView cv, uint32_t* err, const QkNormArgs& norm,
                          Stream stream) {
  if (q.n == 0) return;
  const int half = rotary_dim / 2;
  const dim3 grid(static_cast<unsigned>(q.n), static_cast<unsigned>(q.heads + k.heads));
  const unsigned threads = static_cast<unsigned>(std::max(32, (half + 31) / 32 * 32));
  auto launch = [&](auto* kernel) {
    launch_chained(kernel, grid, threads, 0, as_stream(stream), q, k, v, positions, inv_freq, half, neox,
                   attention_factor, slots, ck, cv, err, norm);
  };
  if (ck.fp8) {
    DI_DISPATCH_ELEM(type, T, launch(rope_store_kv_heads_kernel<T, __nv_fp8_e4m3>));
  } else {
    DI_DISPATCH_ELEM(type, T, launch(rope_store_kv_heads_kernel<T, T>));
  }
}

void launch_mla_rope_store_kv(ElemType type, HeadView q_pe, HeadView q_rot, HeadView kv, int lora,
                              const QkNormArgs& norm, const int32_t* positions, const float* inv_freq, int rotary_dim,
                              bool neox, float attention_factor, const int32_t* slots, CacheView ck, uint32_t* err,
                              Stream stream) {
  if (kv.n == 0) return;
  const int half = rotary_dim / 2;
  const dim3 grid(static_cast<unsigned>(kv.n), static_cast<unsigned>(q_pe.heads + 1));
  const unsigned threads = static_cast<unsigned>(std::max(32, (half + 31) / 32 * 32));
  auto launch = [&](auto* kernel) {
    launch_chained(kernel, grid, threads, 0, as_stream(stream), q_pe, q_rot, kv, lora, norm, positions, inv_freq, half,
                   neox, attention_factor, slots, ck, err);
  };
  if (ck.fp8) {
    DI_DISPATCH_ELEM(type, T, launch(mla_rope_store_kv_kernel<T, __nv_fp8_e4m3>));
  } else {
    DI_DISPATCH_ELEM(type, T, launch(mla_rope_store_kv_kernel<T, T>));
  }
}

void launch_store_kv(ElemType type, HeadView k, HeadView v, const int32_t* slots, CacheView ck, CacheView cv,
                     uint32_t* err, Stream stream) {
  if (k.n == 0) return;
  auto launch = [&](auto* kernel) {
    launch_chained(kernel, static_cast<unsigned>(k.n), 256, 0, as_stream(stream), k, v, slots, ck, cv, err);
  };
  if (ck.fp8) {
    DI_DISPATCH_ELEM(type, T, launch(store_kv_kernel<T, __nv_fp8_e4m3>));
  } else {
    DI_DISPATCH_ELEM(type, T, launch(store_kv_kernel<T, T>));
  }
}

}  // namespace deepinfer::cuda
