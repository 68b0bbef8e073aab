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

namespace deepinfer::cuda {

namespace {

bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

template <typename T, class C, mma_gemm::GemmOut kOut>
void launch_dense(mma_gemm::GemmArgs g, const MmaSplitWorkspace& ws, cudaStream_t s) {
  constexpr int kB = kOut == mma_gemm::GemmOut::GatedAct ? 2 : 1;
  const int64_t tiles = (g.n_rows + C::kBM - 1) / C::kBM;
  const int64_t blocks = tiles * ((g.n_cols + C::kBN - 1) / C::kBN);
  const int64_t slices = (g.k + mma_gemm::kSliceK - 1) / mma_gemm::kSliceK;
  const auto partial_bytes = static_cast<size_t>(slices * kB * g.n_rows * g.n_cols) * sizeof(float);
  const bool split = slices > 1 && blocks < int64_t{ws.blocks_per_sm} * ws.num_sms && ws.data != nullptr &&
                     partial_bytes <= ws.bytes;
  g.partials = split ? ws.data : nullptr;
  mma_gemm::launch_mma_gemm<T, C, kOut, false, true>(g, tiles, s, static_cast<int>(slices));
}

// Tile shapes follow the row count; they change what is staged together,
// never a row's order of accumulation.
template <typename T, mma_gemm::GemmOut kOut>
void launch_by_rows(const mma_gemm::GemmArgs& g, const MmaSplitWorkspace& ws, cudaStream_t s) {
  if (g.n_rows <= mma_gemm::DecodeTiles::kBM) {
    launch_dense<T, mma_gemm::DecodeTiles, kOut>(g, ws, s);
  } else if (g.n_rows <= 2 * mma_gemm::MidTiles::kBM) {
    launch_dense<T, mma_gemm::MidTiles, kOut>(g, ws, s);
  } else if constexpr (kOut == mma_gemm::GemmOut::GatedAct) {
    // 128 x 128 tiles would hold 256 sums a thread here (gate and up, each
    // chained and totalled) and spill.
    launch_dense<T, mma_gemm::PrefillTiles, kOut>(g, ws, s);
  } else if (g.n_rows <= 256) {
    launch_dense<T, mma_gemm::PrefillTiles, kOut>(g, ws, s);
  } else {
    launch_dense<T, mma_gemm::LargeTiles, kOut>(g, ws, s);
  }
}

template <mma_gemm::GemmOut kOut>
void launch_typed(ElemType type, const mma_gemm::GemmArgs& g, const MmaSplitWorkspace& ws, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElemType::BF16) {
    launch_by_rows<__nv_bfloat16, kOut>(g, ws, s);
  } else {
    launch_by_rows<__half, kOut>(g, ws, s);
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
                       const MmaSplitWorkspace& ws, Stream stream) {
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
  if (out_f32) {
    launch_typed<mma_gemm::GemmOut::F32>(type, g, ws, stream);
  } else {
    launch_typed<mma_gemm::GemmOut::Elem>(type, g, ws, stream);
  }
}

bool launch_gated_linear_mma(ElemType type, int64_t n, const char* x, int64_t x_stride, const char* w_gate_up,
                             int64_t w_stride, int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride,
                             const MmaSplitWorkspace& ws, Stream stream) {
  if (!linear_mma_fits(x, x_stride, w_gate_up, w_stride, f, k, out, out_stride)) return false;
  mma_gemm::GemmArgs g;
  g.n_rows = n;
  g.a_base = x;
  g.a_stride = x_stride;
  g.w0 = MoeWeightView{w_gate_up, 0, w_stride};
  g.w1 = MoeWeightView{w_gate_up + f * w_stride, 0, w_stride};
  g.n_cols = f;
  g.k = k;
  g.out = out;
  g.out_stride = out_stride;
  g.glu = gelu ? MoeGlu::GeluTanh : MoeGlu::Silu;
  launch_typed<mma_gemm::GemmOut::GatedAct>(type, g, ws, stream);
  return true;
}

}  // namespace deepinfer::cuda
