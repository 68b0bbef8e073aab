// The batch-invariant dense linear (DEEPINFER_BATCH_INVARIANT=1): every
// product through the tensor-core GEMM of cuda_mma_gemm.cuh, whose rows'
// results do not depend on how many rows there are, where the default path
// picks the gemv for one row and cuBLAS (whose kernel, tiling and split-K
// change with the shape) for more; and the gated MLP's gate-up product with
// its activation in the same kernel (one pass over the weights, no
// intermediate rows).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma_gemm.cuh"
#include "backend/cuda/cuda_wgmma_gemm.cuh"

#include <cstring>
#include <vector>

namespace deepinfer::cuda {

namespace {

using mma_gemm::GemmOut;
using mma_gemm::TileConfig;

bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

template <typename T, class C, GemmOut kOut>
void launch_dense(const mma_gemm::GemmArgs& g, cudaStream_t s) {
  mma_gemm::launch_mma_gemm<T, C, kOut, false, true>(g, (g.n_rows + C::kBM - 1) / C::kBM, s);
}

// Tile shapes follow the row count; they change what is staged together,
// never a row's order of accumulation. Each is the fastest of twelve
// configurations at its row counts on the Llama-3-8B projections
// (bench/bench_bi_linear.cu, H100, docs/benchmarks.md): few rows want narrow
// column tiles (many blocks streaming the weights), many rows want large
// tiles (more math per staged byte).
using Rows16 = mma_gemm::DecodeTiles;           // 16 x 32 x 128
using Rows32 = mma_gemm::MidTiles;              // 32 x 32 x 128
using Rows64 = TileConfig<32, 64, 128, 2, 2, 3>;
using Rows128 = TileConfig<64, 64, 64, 2, 2, 4>;
using Rows256 = TileConfig<64, 128, 64, 2, 4, 3>;
using RowsMany = TileConfig<128, 128, 64, 2, 4, 3>;  // 8 warps of 64 x 32
// The gated product holds two sums per output: at most 32 x 32 a warp.
using GatedRows128 = Rows256;                    // 64 x 128 x 64, warps of 32 x 32
using GatedRowsMany = TileConfig<128, 64, 32, 4, 2, 4>;

// Past 32 rows the wgmma GEMM (where it has the mma.sync bits: the start-up
// probe): it adds each output's k16 steps in the same order with the same
// rounding (bench_bi_bits: 0 differing outputs on every Llama-3-8B shape at
// 200-4,096 rows, H100) and runs 1.5-3x faster there (bench_bi_linear, run 71:
// at 256 rows a layer's four products take 303 us against 759 with mma.sync;
// cuBLAS 205). Its tiles by row count, from the same sweep: one warpgroup of
// 64 x 64 streams the weights for up to 128 rows (its time is flat from 1 to
// 128), larger tiles reuse them beyond.
constexpr int64_t kWgmmaMinRows = 33;
using WgmmaRows128 = wgmma_gemm::TileConfig<64, 1, 6>;   // 64 x 64, six stages
using WgmmaRows256 = wgmma_gemm::TileConfig<64, 2, 4>;   // 128 x 64
using WgmmaRowsMany = wgmma_gemm::TileConfig<128, 2, 3>;  // 128 x 128, three stages (two blocks an SM)
using WgmmaGatedRows = wgmma_gemm::TileConfig<64, 2, 3>;  // 128 x 64 of gate and of up

template <typename T, GemmOut kOut>
void launch_by_rows(const mma_gemm::GemmArgs& g, bool wgmma, cudaStream_t s) {
  const int64_t n = g.n_rows;
  if (wgmma && n >= kWgmmaMinRows) {
    if constexpr (kOut == GemmOut::GatedAct) {
      wgmma_gemm::launch_wgmma_gemm<T, WgmmaGatedRows, kOut>(g, s);
    } else if (n <= 128) {
      wgmma_gemm::launch_wgmma_gemm<T, WgmmaRows128, kOut>(g, s);
    } else if (n <= 256) {
      wgmma_gemm::launch_wgmma_gemm<T, WgmmaRows256, kOut>(g, s);
    } else {
      wgmma_gemm::launch_wgmma_gemm<T, WgmmaRowsMany, kOut>(g, s);
    }
    return;
  }
  if constexpr (kOut == GemmOut::GatedAct) {
    if (n <= 32) launch_dense<T, Rows32, kOut>(g, s);
    else if (n <= 128) launch_dense<T, GatedRows128, kOut>(g, s);
    else launch_dense<T, GatedRowsMany, kOut>(g, s);
  } else {
    if (n <= 16) launch_dense<T, Rows16, kOut>(g, s);
    else if (n <= 32) launch_dense<T, Rows32, kOut>(g, s);
    else if (n <= 64) launch_dense<T, Rows64, kOut>(g, s);
    else if (n <= 128) launch_dense<T, Rows128, kOut>(g, s);
    else if (n <= 256) launch_dense<T, Rows256, kOut>(g, s);
    else launch_dense<T, RowsMany, kOut>(g, s);
  }
}

template <mma_gemm::GemmOut kOut>
void launch_typed(ElemType type, const mma_gemm::GemmArgs& g, bool wgmma, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElemType::BF16) {
    launch_by_rows<__nv_bfloat16, kOut>(g, wgmma, s);
  } else {
    launch_by_rows<__half, kOut>(g, wgmma, s);
  }
}

}  // namespace

bool linear_mma_fits(const char* x, int64_t x_stride, const char* w, int64_t w_stride, int64_t m, int64_t k,
                     const char* out, int64_t out_stride) {
  // Rows of 16-byte chunks; pairs of output columns written together.
  return k % 8 == 0 && m % 8 == 0 && aligned16(x, x_stride) && aligned16(w, w_stride) &&
         reinterpret_cast<uintptr_t>(out) % 8 == 0 && out_stride % 8 == 0;
}

void launch_linear_mma(ElemType type, int64_t n, const char* x, int64_t x_stride, const char* w, int64_t w_stride,
                       int64_t m, int64_t k, const float* bias, bool out_f32, char* out, int64_t out_stride,
                       bool wgmma, Stream stream) {
  const mma_gemm::GemmArgs g = mma_gemm::dense_args(n, x, x_stride, w, w_stride, m, k, bias, out, out_stride);
  if (out_f32) {
    launch_typed<mma_gemm::GemmOut::F32>(type, g, wgmma, stream);
  } else {
    launch_typed<mma_gemm::GemmOut::Elem>(type, g, wgmma, stream);
  }
}

bool launch_gated_linear_mma(ElemType type, int64_t n, const char* x, int64_t x_stride, const char* w_gate_up,
                             int64_t w_stride, int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride,
                             bool wgmma, Stream stream) {
  // Rows the GEMM cannot read: the caller runs linear + gated_activation
  // (the same bits where the linear fits).
  if (!linear_mma_fits(x, x_stride, w_gate_up, w_stride, f, k, out, out_stride)) {
    return false;
  }
  mma_gemm::GemmArgs g = mma_gemm::dense_args(n, x, x_stride, w_gate_up, w_stride, f, k, nullptr, out, out_stride);
  g.w1 = MoeWeightView{w_gate_up + f * w_stride, 0, w_stride};
  g.glu = gelu ? MoeGlu::GeluTanh : MoeGlu::Silu;
  launch_typed<mma_gemm::GemmOut::GatedAct>(type, g, wgmma, stream);
  return true;
}

bool linear_mma_probe(Stream stream, int64_t n, int64_t m, int64_t k, const ProbeGemm& candidate) {
  std::vector<__nv_bfloat16> hx(n * k), hw(m * k);
  uint32_t state = 12345;  // a fixed LCG: the same operands every start
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / float(1 << 23);
  };
  for (auto& v : hx) v = __float2bfloat16(next());
  for (auto& v : hw) v = __float2bfloat16(0.05f * next());
  auto s = static_cast<cudaStream_t>(stream);
  char *x = nullptr, *w = nullptr, *out = nullptr;
  bool same = false;
  const size_t out_bytes = size_t(n) * m * sizeof(float);
  if (cudaMalloc(&x, hx.size() * 2) == cudaSuccess && cudaMalloc(&w, hw.size() * 2) == cudaSuccess &&
      cudaMalloc(&out, 2 * out_bytes) == cudaSuccess) {
    cudaMemcpyAsync(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice, s);
    launch_dense<__nv_bfloat16, RowsMany, GemmOut::F32>(
        mma_gemm::dense_args(n, x, k * 2, w, k * 2, m, k, nullptr, out, m * int64_t{sizeof(float)}), s);
    cudaMemsetAsync(out + out_bytes, 0xff, out_bytes, s);
    std::vector<char> both(2 * out_bytes);
    if (candidate(x, w, out + out_bytes, n, m, k) &&
        cudaMemcpyAsync(both.data(), out, both.size(), cudaMemcpyDeviceToHost, s) == cudaSuccess &&
        cudaStreamSynchronize(s) == cudaSuccess) {
      same = std::memcmp(both.data(), both.data() + out_bytes, out_bytes) == 0;
    }
  }
  cudaStreamSynchronize(s);
  cudaGetLastError();  // a failed launch or copy means "no": clear it
  cudaFree(x);
  cudaFree(w);
  cudaFree(out);
  return same;
}

bool linear_mma_probe_wgmma(Stream stream) {
  // 256 rows of k = 1,040 (16 full 64-wide k tiles and a partial one) against
  // 136 weight rows (a partial column tile).
  return linear_mma_probe(stream, 256, 136, 1040,
                          [stream](const char* x, const char* w, char* out, int64_t n, int64_t m, int64_t k) {
                            wgmma_gemm::launch_wgmma_gemm<__nv_bfloat16, WgmmaRowsMany, GemmOut::F32>(
                                mma_gemm::dense_args(n, x, k * 2, w, k * 2, m, k, nullptr, out,
                                                     m * int64_t{sizeof(float)}),
                                static_cast<cudaStream_t>(stream));
                            return true;
                          });
}

}  // namespace deepinfer::cuda
