// Matrix-vector products for decode (a few activation rows): out[n, m] =
// x[n, k] * W[m, k]^T with bf16/f16 x and W of the same type, f32 accumulation.
//
// Why our own kernel: at batch 1 decode is bound by reading the weights once,
// and this kernel streams each weight row exactly once with 16-byte loads
// (one warp per row, several loads in flight per lane) while the few x rows
// stay in L1/L2. Larger n goes to cuBLAS.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kGemvWarps = 8;

template <typename T>
__device__ __forceinline__ void dot8(const uint4& w, const uint4& x, float& acc) {
  const T* wv = reinterpret_cast<const T*>(&w);
  const T* xv = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(to_f(wv[e]), to_f(xv[e]), acc);
}

// `wpr` warps share one output (split along k, summed through shared
// memory) so that small m still puts enough loads in flight to fill HBM.
// kGlu: output j of the gated MLP, act(x . W[j]) * (x . W[j + m]) over a
// stacked [2m, k] gate-up weight, with the two products rounded to the
// activation type first exactly as separate linear + gated_activation ops
// would, so fusing does not change the result.
template <typename T, typename TO, int N, int kUnroll, bool kGlu>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const char* x, int64_t x_stride, const char* w,
                                                               int64_t w_stride, int64_t m, int64_t k,
                                                               const float* bias, char* out, int64_t out_stride,
                                                               int wpr, bool gelu, GemvBatch batch) {
  constexpr int R = kGlu ? 2 : 1;  // weight rows per output
  x += blockIdx.y * batch.x_stride;
  w += blockIdx.y * batch.w_stride;
  out += blockIdx.y * batch.out_stride;
  __shared__ float part[kGemvWarps][R * N];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = warp % wpr;
  const int64_t j = blockIdx.x * int64_t{kGemvWarps / wpr} + warp / wpr;
  const int64_t chunks = k / 8, stride = 32 * int64_t{wpr};
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[r][i] = 0.0f;
  }
  // Loading weights before the wait (into registers or L2) was tried: the
  // extra registers or the duplicate L2 requests cost more (~10%) than the
  // overlap gained.
  wait_for_prior_kernel();
  release_next_kernel();
  if (j < m) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* wr = reinterpret_cast<const uint4*>(w + (j + r * m) * w_stride);
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
            if (c < chunks) dot8<T>(wv[u], __ldg(xr + c), acc[r][i]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float v = warp_sum(acc[r][i]);
      if (lane == 0) part[warp][r * N + i] = v;
    }
  }
  __syncthreads();
  if (sub == 0 && lane < N && j < m) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      v[r] = 0.0f;
      for (int s2 = 0; s2 < wpr; ++s2) v[r] += part[warp + s2][r * N + lane];
    }
    if constexpr (kGlu) {
      const float g = to_f(from_f<T>(v[0])), u = to_f(from_f<T>(v[1]));
      reinterpret_cast<TO*>(out + lane * out_stride)[j] = from_f<TO>((gelu ? gelu_tanh(g) : silu(g)) * u);
    } else {
      if (bias) v[0] += bias[j];
      reinterpret_cast<TO*>(out + lane * out_stride)[j] = from_f<TO>(v[0]);
    }
  }
}

template <typename T, typename TO, int U, bool G>
void launch_n(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k, const float* bias,
              char* out, int64_t os, int wpr, bool gelu, const GemvBatch& b, cudaStream_t s) {
  const dim3 blocks(static_cast<unsigned>((m + kGemvWarps / wpr - 1) / (kGemvWarps / wpr)),
                    static_cast<unsigned>(b.count));
  const dim3 threads(kGemvWarps * 32);
  switch (n) {
    case 1: launch_chained(gemv_kernel<T, TO, 1, U, G>, blocks, threads, 0, s, x, xs, w, ws, m, k, bias, out, os, wpr, gelu, b); break;
    case 2: launch_chained(gemv_kernel<T, TO, 2, U, G>, blocks, threads, 0, s, x, xs, w, ws, m, k, bias, out, os, wpr, gelu, b); break;
    case 3: launch_chained(gemv_kernel<T, TO, 3, U, G>, blocks, threads, 0, s, x, xs, w, ws, m, k, bias, out, os, wpr, gelu, b); break;
    default: launch_chained(gemv_kernel<T, TO, 4, U, G>, blocks, threads, 0, s, x, xs, w, ws, m, k, bias, out, os, wpr, gelu, b); break;
  }
}

template <typename T, typename TO, bool G = false>
void launch_u(int n, const char* x, int64_t xs, const char* w, int64_t ws, int64_t m, int64_t k, const float* bias,
              char* out, int64_t os, int wpr, int unroll, cudaStream_t s, bool gelu = false,
              const GemvBatch& b = {}) {
  if (unroll >= 8) launch_n<T, TO, 8, G>(n, x, xs, w, ws, m, k, bias, out, os, wpr, gelu, b, s);
  else launch_n<T, TO, 4, G>(n, x, xs, w, ws, m, k, bias, out, os, wpr, gelu, b, s);
}

}  // namespace

GemvConfig gemv_config(int64_t m, int64_t k) {
  // Measured on the H200 (bench_gemv_cuda, Llama-3-8B projection shapes): 4
  // warps per row beat the one-wave heuristic everywhere (+10-20% on the
  // q/k/v, gate/up and LM-head shapes; the extra blocks shorten the last
  // wave), and 8 warps per row win for long rows (down projection, k = 14336).
  // Rows of 2,048 (the MoE models' hidden size; tests/data/gpu/gemv_run13.txt)
  // are short: one or two warps per row, as long as blocks of 8 rows still
  // make two waves; LM heads 3.0 -> 4.2 TB/s with two, [5120, 2048] +16%
  // with one.
  GemvConfig c;
  c.warps_per_row = k >= 8192 ? 8 : 4;
  constexpr int64_t kTwoWaves = 2 * 132;  // blocks: two per SM of the H200
  if (k <= 2048) {
    if (m >= 65536) c.warps_per_row = 2;
    else if (m / kGemvWarps >= kTwoWaves) c.warps_per_row = 1;
  }
  // Short rows (MLA's absorbed per-head products, k = 128 or 512) have fewer
  // 16-byte chunks than the warps of a row have lanes: extra warps would
  // only idle and add the shared-memory sum (run 46: 10.5 us for W_UK's
  // 2 MB at k = 128 with four warps per row).
  // A power of two: a block's 8 warps must split evenly into whole rows (3
  // warps per row, from k in [768, 1024), left two warps of a block on the
  // next block's first output).
  while (c.warps_per_row > 1 && k < int64_t{c.warps_per_row} * 8 * 32) c.warps_per_row /= 2;
  c.unroll = 4;
  return c;
}

void launch_gemv(ElemType type, int n, const char* x, int64_t x_stride, const char* w, int64_t w_stride, int64_t m,
                 int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride, Stream stream,
                 GemvConfig config, GemvBatch batch) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (config.warps_per_row <= 0) config = gemv_config(m, k);
  const int wpr = config.warps_per_row, u = config.unroll;
  if (type == ElemType::F16) {
    if (out_f32) launch_u<__half, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, u, s, false, batch);
    else launch_u<__half, __half>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, u, s, false, batch);
  } else {
    if (out_f32) {
      launch_u<__nv_bfloat16, float>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, u, s, false, batch);
    } else {
      launch_u<__nv_bfloat16, __nv_bfloat16>(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride, wpr, u, s,
                                             false, batch);
    }
  }
}

void launch_gemv_glu(ElemType type, int n, const char* x, int64_t x_stride, const char* w_gate_up, int64_t w_stride,
                     int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride, Stream stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GemvConfig c = gemv_config(f, k);
  if (type == ElemType::F16) {
    launch_u<__half, __half, true>(n, x, x_stride, w_gate_up, w_stride, f, k, nullptr, out, out_stride,
                                   c.warps_per_row, c.unroll, s, gelu);
  } else {
    launch_u<__nv_bfloat16, __nv_bfloat16, true>(n, x, x_stride, w_gate_up, w_stride, f, k, nullptr, out, out_stride,
                                                 c.warps_per_row, c.unroll, s, gelu);
  }
}

}  // namespace deepinfer::cuda
