// Matrix-vector products for decode (a few activation rows): out[n, m] =
// x[n, k] * W[m, k]^T with bf16/f16 x and W of the same type, f32 accumulation.
//
// Why our own kernel: at batch 1 decode is bound by reading the weights once,
// and this kernel streams each weight row exactly once with 16-byte loads
// (one warp per row, several loads in flight per lane) while the few x rows
// stay in L1/L2. Larger n goes to cuBLAS.
#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kGemvWarps = 8;
constexpr int kUnroll = 4;

template <typename T>
__device__ __forceinline__ void dot8(const uint4& w, const uint4& x, float& acc) {
  const T* wv = reinterpret_cast<const T*>(&w);
  const T* xv = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(to_f(wv[e]), to_f(xv[e]), acc);
}

// `wpr` warps share one weight row (split along k, summed through shared
// memory) so that small m still puts enough loads in flight to fill HBM.
template <typename T, typename TO, int N>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const char* x, int64_t x_stride, const char* w,
                                                               int64_t w_stride, int64_t m, int64_t k,
                                                               const float* bias, char* out, int64_t out_stride,
                                                               int wpr) {
  __shared__ float part[kGemvWarps][N];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = warp % wpr;
  const int64_t j = blockIdx.x * int64_t{kGemvWarps / wpr} + warp / wpr;
  const int64_t chunks = k / 8, stride = 32 * int64_t{wpr};
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
  if (j < m) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + j * w_stride);
    for (int64_t c0 = sub * 32 + lane; c0 < chunks; c0 += stride * kUnroll) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t c = c0 + stride * u;
        wv[u] = c < chunks ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + i * x_stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          int64_t c = c0 + stride * u;
          if (c < chunks) dot8<T>(wv[u], __ldg(xr + c), acc[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float v = warp_sum(acc[i]);
    if (lane == 0) part[warp][i] = v;
  }
  __syncthreads();
  if (sub == 0 && lane < N && j < m) {
    float v = 0.0f;
    for (int s2 = 0; s2 < wpr; ++s2) v += part[warp + s2][lane];
    if (bias) v += bias[j];
    reinterpret_cast<TO*>(out + lane * out_stride)[j] = from_f<TO>(v);
  }
}

template <typename T, typename TO>
void launch_n(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k, const float* bias,
              char* out, int64_t os, int wpr, cudaStream_t s) {
  unsigned blocks = static_cast<unsigned>((m + kGemvWarps / wpr - 1) / (kGemvWarps / wpr));
  dim3 threads(kGemvWarps * 32);
  switch (n) {
    case 1: gemv_kernel<T, TO, 1><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os, wpr); break;
    case 2: gemv_kernel<T, TO, 2><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os, wpr); break;
    case 3: gemv_kernel<T, TO, 3><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os, wpr); break;
    default: gemv_kernel<T, TO, 4><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os, wpr); break;
  }
}

}  // namespace

void launch_gemv(ElemType type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride, int64_t m,
                 int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride, Stream stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // About two waves of warps on a 132-SM part: 8448 / m warps per row, a power of two in [1, 8].
  int wpr = 1;
  while (wpr < kGemvWarps && int64_t{wpr} * 2 * m <= 8448) wpr *= 2;
  if (type == ElemType::F16) {
    if (out_f32) launch_n<__half, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
    else launch_n<__half, __half>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
  } else {
    if (out_f32) launch_n<__nv_bfloat16, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
    else launch_n<__nv_bfloat16, __nv_bfloat16>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, s);
  }
}

}  // namespace deepinfer::cuda
