// The batch-invariant dense linear (DEEPINFER_BATCH_INVARIANT=1): every
// product through the tensor-core GEMM of cuda_mma_gemm.cuh, whose rows'
// results do not depend on how many rows there are, where the default path
// picks the gemv for one row and cuBLAS (whose kernel, tiling and split-K
// change with the shape) for more. Tile shapes still follow the row count
// (decode-sized, mid, prefill): they change what is staged together, never
// a row's order of accumulation.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma_gemm.cuh"

namespace deepinfer::cuda {

namespace {

bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

template <typename T, class C>
void launch_dense(const mma_gemm::GemmArgs& g, bool out_f32, cudaStream_t s) {
  const int64_t tiles = (g.n_rows + C::kBM - 1) / C::kBM;
  if (out_f32) {
    mma_gemm::launch_mma_gemm<T, C, mma_gemm::GemmOut::F32, false, true>(g, tiles, s);
  } else {
    mma_gemm::launch_mma_gemm<T, C, mma_gemm::GemmOut::Elem, false, true>(g, tiles, s);
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
                       Stream stream) {
  mma_gemm::GemmArgs g;
  g.n_rows = n;
  g.a_base = x;
  g.a_stride = x_stride;
  g.w0 = MoeWeightView{w, 0, w_stride};
  g.w1 = g.w0;
  g.bias0 = reinterpret_cast<const char*>(bias);
  g.bias_type = ElemType::F32;
  g.n_cols = m;
  g.k = k;
  g.out = out;
  g.out_stride = out_stride;
  auto s = static_cast<cudaStream_t>(stream);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (n <= mma_gemm::DecodeTiles::kBM) {
      launch_dense<T, mma_gemm::DecodeTiles>(g, out_f32, s);
    } else if (n <= 2 * mma_gemm::MidTiles::kBM) {
      launch_dense<T, mma_gemm::MidTiles>(g, out_f32, s);
    } else if (n <= 256) {
      launch_dense<T, mma_gemm::PrefillTiles>(g, out_f32, s);
    } else {
      launch_dense<T, mma_gemm::LargeTiles>(g, out_f32, s);
    }
  };
  if (type == ElemType::BF16) {
    run(__nv_bfloat16{});
  } else {
    run(__half{});
  }
}

}  // namespace deepinfer::cuda
