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

// The fused gated product's row limit (launch_gated_linear_mma).
constexpr int64_t kFusedGatedMaxRows = 256;

bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

template <typename T, class C, mma_gemm::GemmOut kOut>
void launch_dense(const mma_gemm::GemmArgs& g, cudaStream_t s) {
  mma_gemm::launch_mma_gemm<T, C, kOut, false, true>(g, (g.n_rows + C::kBM - 1) / C::kBM, s);
}

// Tile shapes follow the row count; they change what is staged together,
// never a row's order of accumulation.
template <typename T, mma_gemm::GemmOut kOut>
void launch_by_rows(const mma_gemm::GemmArgs& g, cudaStream_t s) {
  if (g.n_rows <= mma_gemm::DecodeTiles::kBM) {
    launch_dense<T, mma_gemm::DecodeTiles, kOut>(g, s);
  } else if (g.n_rows <= 2 * mma_gemm::MidTiles::kBM) {
    launch_dense<T, mma_gemm::MidTiles, kOut>(g, s);
  } else if (kOut == mma_gemm::GemmOut::GatedAct || g.n_rows <= 256) {
    launch_dense<T, mma_gemm::PrefillTiles, kOut>(g, s);
  } else if constexpr (kOut != mma_gemm::GemmOut::GatedAct) {
    launch_dense<T, mma_gemm::LargeTiles, kOut>(g, s);
  }
}

template <mma_gemm::GemmOut kOut>
void launch_typed(ElemType type, const mma_gemm::GemmArgs& g, Stream stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElemType::BF16) {
    launch_by_rows<__nv_bfloat16, kOut>(g, s);
  } else {
    launch_by_rows<__half, kOut>(g, s);
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
  if (out_f32) {
    launch_typed<mma_gemm::GemmOut::F32>(type, g, stream);
  } else {
    launch_typed<mma_gemm::GemmOut::Elem>(type, g, stream);
  }
}

bool launch_gated_linear_mma(ElemType type, int64_t n, const char* x, int64_t x_stride, const char* w_gate_up,
                             int64_t w_stride, int64_t f, int64_t k, bool gelu, char* out, int64_t out_stride,
                             Stream stream) {
  // Long prompts: the unfused product's 128 x 128 tiles (LargeTiles) beat
  // fused 64 x 64 ones, and a fused 128 x 128 tile would hold 128 sums a
  // thread; the caller runs linear + gated_activation (the same bits).
  if (n > kFusedGatedMaxRows || !linear_mma_fits(x, x_stride, w_gate_up, w_stride, f, k, out, out_stride)) {
    return false;
  }
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
  launch_typed<mma_gemm::GemmOut::GatedAct>(type, g, stream);
  return true;
}

}  // namespace deepinfer::cuda
