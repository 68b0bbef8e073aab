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

template <typename T, typename TO, int N>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const char* x, int64_t x_stride, const char* w,
                                                               int64_t w_stride, int64_t m, int64_t k,
                                                               const float* bias, char* out, int64_t out_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t chunks = k / 8;
  for (int64_t j = blockIdx.x * int64_t{kGemvWarps} + threadIdx.x / 32; j < m; j += int64_t{gridDim.x} * kGemvWarps) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + j * w_stride);
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.0f;
    int64_t c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[u] = __ldg(wr + c + 32 * u);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + i * x_stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) dot8<T>(wv[u], __ldg(xr + c + 32 * u), acc[i]);
      }
    }
    for (; c < chunks; c += 32) {
      uint4 wv = __ldg(wr + c);
#pragma unroll
      for (int i = 0; i < N; ++i) dot8<T>(wv, __ldg(reinterpret_cast<const uint4*>(x + i * x_stride) + c), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float v = warp_sum(acc[i]);
      if (lane == 0) {
        if (bias) v += bias[j];
        reinterpret_cast<TO*>(out + i * out_stride)[j] = from_f<TO>(v);
      }
    }
  }
}

template <typename T, typename TO>
void launch_n(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k, const float* bias,
              char* out, int64_t os, cudaStream_t s) {
  unsigned blocks = static_cast<unsigned>((m + kGemvWarps - 1) / kGemvWarps);
  dim3 threads(kGemvWarps * 32);
  switch (n) {
    case 1: gemv_kernel<T, TO, 1><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os); break;
    case 2: gemv_kernel<T, TO, 2><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os); break;
    case 3: gemv_kernel<T, TO, 3><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os); break;
    default: gemv_kernel<T, TO, 4><<<blocks, threads, 0, s>>>(x, xs, w, ws, m, k, bias, out, os); break;
  }
}

}  // namespace

void launch_gemv(ElemType type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride, int64_t m,
                 int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride, Stream stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (type == ElemType::F16) {
    if (out_f32) launch_n<__half, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, s);
    else launch_n<__half, __half>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, s);
  } else {
    if (out_f32) launch_n<__nv_bfloat16, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, s);
    else launch_n<__nv_bfloat16, __nv_bfloat16>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, s);
  }
}

}  // namespace deepinfer::cuda
