// FP8 weights in 64-element row blocks (DType::F8E4M3_B64, core/fp8_blocks.h)
// on the GPU, in the host's byte layout: each block is 17 words, the f32
// scale then 64 e4m3 codes (4 per word).
//
// gemv_f8 (decode, a few activation rows): a warp reads a weight row as
// consecutive 32-bit words, 128 contiguous bytes per load instruction, so the
// weight stream is as coalesced as the bf16 gemv's. The lane holding a code
// word decodes its 4 codes with the hardware e4m3x2 -> f16x2 conversion,
// multiplies them with the 4 matching activations and adds the sum times the
// block's scale (a second load of the scale word, which the same or the
// previous instruction brought into L1). Lanes on a scale word (1 in 17) idle
// that turn. Rows are split over `wpr` warps as in the bf16 gemv.
//
// dequant_f8 (prefill): rows of blocks to bf16/f16 rows, for cuBLAS.
//
// Written without a GPU at hand: tests/ops/test_linear.cpp (Fp8RowBlockWeights)
// and bench_gemv_cuda check and measure it on the device.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kBlockWords = 17;    // 4-byte scale + 64 one-byte codes
constexpr int kBlockElems = 64;

__device__ __forceinline__ float2 codes_to_float2(uint32_t two_codes) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(raw));
}

// 4 consecutive activations of type T (8 bytes, 8-byte aligned) as floats.
template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  const T* e = reinterpret_cast<const T*>(&v);
  return make_float4(to_f(e[0]), to_f(e[1]), to_f(e[2]), to_f(e[3]));
}

// n <= N activation rows.
template <typename T, typename TO, int N, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) gemv_f8_kernel(int n, const char* x, int64_t x_stride, const char* w,
                                                              int64_t w_stride, int64_t m, int64_t k,
                                                              const float* bias, char* out, int64_t out_stride,
                                                              int wpr) {
  __shared__ float part[kWarps][N];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = warp % wpr;
  const int64_t j = blockIdx.x * int64_t{kWarps / wpr} + warp / wpr;
  const int words = static_cast<int>(k / kBlockElems) * kBlockWords;
  const int stride = 32 * wpr;
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
  wait_for_prior_kernel();
  release_next_kernel();
  if (j < m) {
    const uint32_t* wr = reinterpret_cast<const uint32_t*>(w + j * w_stride);
    for (int w0 = sub * 32 + lane; w0 < words; w0 += stride * kUnroll) {
      uint32_t v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int idx = w0 + stride * u;
        v[u] = idx < words ? __ldg(wr + idx) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int idx = w0 + stride * u;
        const int b = idx / kBlockWords, t = idx - b * kBlockWords;
        if (idx >= words || t == 0) continue;
        const float scale = __uint_as_float(__ldg(wr + b * kBlockWords));
        const float2 c01 = codes_to_float2(v[u]), c23 = codes_to_float2(v[u] >> 16);
        const int64_t e = int64_t{b} * kBlockElems + (t - 1) * 4;
#pragma unroll
        for (int i = 0; i < N; ++i) {
          if (i >= n) break;
          const float4 xv = load4(reinterpret_cast<const T*>(x + i * x_stride) + e);
          const float s = fmaf(c01.x, xv.x, fmaf(c01.y, xv.y, fmaf(c23.x, xv.z, c23.y * xv.w)));
          acc[i] = fmaf(scale, s, acc[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float s = warp_sum(acc[i]);
    if (lane == 0) part[warp][i] = s;
  }
  __syncthreads();
  if (sub == 0 && lane < n && j < m) {
    float s = 0.0f;
    for (int s2 = 0; s2 < wpr; ++s2) s += part[warp + s2][lane];
    if (bias) s += bias[j];
    reinterpret_cast<TO*>(out + lane * out_stride)[j] = from_f<TO>(s);
  }
}

template <typename T, typename TO, int N>
void launch_rows(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k, const float* bias,
                 char* out, int64_t os, int wpr, cudaStream_t s) {
  const dim3 blocks(static_cast<unsigned>((m + kWarps / wpr - 1) / (kWarps / wpr)));
  launch_chained(gemv_f8_kernel<T, TO, N, 8>, blocks, dim3(kWarps * 32), 0, s, n, x, xs, w, ws, m, k, bias, out,
                 os, wpr);
}

template <typename T, typename TO>
void launch_typed(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k,
                  const float* bias, char* out, int64_t os, int wpr, cudaStream_t s) {
  switch (n) {
    case 1: launch_rows<T, TO, 1>(n, x, xs, w, ws, m, k, bias, out, os, wpr, s); break;
    case 2: launch_rows<T, TO, 2>(n, x, xs, w, ws, m, k, bias, out, os, wpr, s); break;
    case 3: launch_rows<T, TO, 3>(n, x, xs, w, ws, m, k, bias, out, os, wpr, s); break;
    case 4: launch_rows<T, TO, 4>(n, x, xs, w, ws, m, k, bias, out, os, wpr, s); break;
    default: launch_rows<T, TO, 8>(n, x, xs, w, ws, m, k, bias, out, os, wpr, s); break;
  }
}

template <typename TO>
__global__ void dequant_f8_kernel(const char* w, int64_t w_stride, int64_t rows, int64_t k, char* out,
                                  int64_t out_stride) {
  const int words = static_cast<int>(k / kBlockElems) * kBlockWords;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint32_t* wr = reinterpret_cast<const uint32_t*>(w + r * w_stride);
    TO* o = reinterpret_cast<TO*>(out + r * out_stride);
    for (int idx = threadIdx.x; idx < words; idx += blockDim.x) {
      const int b = idx / kBlockWords, t = idx - b * kBlockWords;
      if (t == 0) continue;
      const uint32_t v = __ldg(wr + idx);
      const float scale = __uint_as_float(__ldg(wr + b * kBlockWords));
      const float2 c01 = codes_to_float2(v), c23 = codes_to_float2(v >> 16);
      TO* dst = o + int64_t{b} * kBlockElems + (t - 1) * 4;
      dst[0] = from_f<TO>(c01.x * scale);
      dst[1] = from_f<TO>(c01.y * scale);
      dst[2] = from_f<TO>(c23.x * scale);
      dst[3] = from_f<TO>(c23.y * scale);
    }
  }
}

}  // namespace

int gemv_f8_warps_per_row(int64_t m, int64_t k) {
  // The bf16 gemv's measured choice (gemv_config) on rows of the same
  // element count: an FP8 row is about half the bytes, so fewer lanes have
  // a load to issue; measure with bench_gemv_cuda before tuning further.
  // A power of two (a block's 8 warps split evenly into whole rows), and no
  // more warps than have a few words each.
  (void)m;
  const int64_t words = k / kBlockElems * kBlockWords;
  int wpr = k >= 8192 ? 8 : 4;
  while (wpr > 1 && words < int64_t{wpr} * 8 * 32) wpr /= 2;
  return wpr;
}

void launch_gemv_f8(ElemType x_type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                    int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                    Stream stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int wpr = gemv_f8_warps_per_row(m, k);
  if (x_type == ElemType::F16) {
    if (out_f32) launch_typed<__half, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
    else launch_typed<__half, __half>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
  } else {
    if (out_f32) {
      launch_typed<__nv_bfloat16, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
    } else {
      launch_typed<__nv_bfloat16, __nv_bfloat16>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
    }
  }
}

void launch_dequant_f8(const char* w, int64_t w_stride, int64_t rows, int64_t k, ElemType out_type, char* out,
                       int64_t out_stride, Stream stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  if (out_type == ElemType::F16) {
    dequant_f8_kernel<__half><<<blocks, 256, 0, s>>>(w, w_stride, rows, k, out, out_stride);
  } else {
    dequant_f8_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(w, w_stride, rows, k, out, out_stride);
  }
}

}  // namespace deepinfer::cuda
