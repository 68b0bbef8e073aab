// Device helpers shared by the CUDA backend's kernels: element conversion,
// strided row addressing and dtype dispatch. All arithmetic is f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
// FP8 e4m3 KV-cache elements (exact widening).
__device__ __forceinline__ float to_f(__nv_fp8_e4m3 x) { return static_cast<float>(x); }

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// Round to nearest even, saturating at +-448 (core/fp8.h's host rule).
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_f<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return r;
}

__host__ __device__ __forceinline__ char* row_ptr(const RowView& v, int64_t r) {
  if (v.nouter <= 1) return v.base + r * v.stride[0];
  int64_t offset = 0;
  for (int d = v.nouter - 1; d >= 0; --d) {
    offset += (r % v.shape[d]) * v.stride[d];
    r /= v.shape[d];
  }
  return v.base + offset;
}

template <typename T>
__device__ __forceinline__ T* row_as(const RowView& v, int64_t r) {
  return reinterpret_cast<T*>(row_ptr(v, r));
}

// Gate activations of gated MLPs (SwiGLU, GeGLU with the tanh approximation).
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
__device__ __forceinline__ float gelu_tanh(float g) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}

// 16 bytes of weights read once: past L1, which keeps what is reused.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// 16-byte chunks a lane holds of a row in the RMSNorm kernels (rows up to
// 2,048 elements a warp), shared by the fused q/k-norm kernels that must sum
// in the same order.
constexpr int kNormMaxChunks = 8;

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

inline unsigned blocks_for(int64_t items, int threads, int64_t cap = 65535LL * 16) {
  int64_t b = (items + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

// ---------------------------------------------------------------- programmatic dependent launch
// A decode step is a chain of short kernels; between two of them the GPU
// otherwise drains and refills. Kernels launched with launch_chained may be
// scheduled while the kernel before them in the stream still runs: each calls
// wait_for_prior_kernel() before it touches memory an earlier kernel reads or
// writes (only read-only data such as weights may be read before), then
// release_next_kernel() so the kernel after it can get on the SMs in turn.
// Both are no-ops for a kernel launched normally.
__device__ __forceinline__ void wait_for_prior_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void release_next_kernel() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Whether launch_chained asks for early scheduling (DEEPINFER_PDL=0 turns it off).
bool chained_launch_enabled();

template <typename... Params, typename... Args>
void launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                    Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = chained_launch_enabled() ? 1 : 0;
  // A failure is left in cudaGetLastError for the backend's check_launch.
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace deepinfer::cuda

#define DI_DISPATCH_ELEM(type, T, ...)        \
  switch (type) {                             \
    case ::deepinfer::cuda::ElemType::F32: {  \
      using T = float;                        \
      __VA_ARGS__;                            \
      break;                                  \
    }                                         \
    case ::deepinfer::cuda::ElemType::F16: {  \
      using T = __half;                       \
      __VA_ARGS__;                            \
      break;                                  \
    }                                         \
    case ::deepinfer::cuda::ElemType::BF16: { \
      using T = __nv_bfloat16;                \
      __VA_ARGS__;                            \
      break;                                  \
    }                                         \
  }
