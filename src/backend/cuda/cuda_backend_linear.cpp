// The CUDA backend's dense products: linear (the decode gemv, cuBLAS, or the
// batch-invariant GEMM of cuda_linear_mma.cu; FP8 weights in
// cuda_backend_fp8.cpp), the batched linear of MLA's absorbed heads, and
// the gated MLP's fused gate-up product.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_helpers.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_unsplit_gemm.h"
#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::cuda {

using namespace backend_helpers;

namespace {

cudaDataType_t cublas_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    default: return CUDA_R_16BF;
  }
}

size_t elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Rows up to which a dense linear takes the gemv. Measured on the H200 at the
// Llama-3-8B shape (docs/benchmarks.md, the verify-cost curve): one row 4.62
// ms per step with the gemv, but 2, 3 and 4 rows 5.82, 7.26 and 8.78 ms
// against 5.31 ms for 5 rows through cuBLAS — past one row the kernel's f32
// dot products, not the weight stream, bound it. (The MoE experts' batched
// products keep kGemvMaxRows: not measured there.)
constexpr int64_t kDenseGemvMaxRows = 1;

// Whether x [n, k] times weight [m, k]^T takes the decode gemv: a few rows,
// one 16-bit type, 16-byte aligned rows.
bool gemv_fits(const Tensor& x, const Tensor& weight) {
  const int64_t n = x.size(0), k = x.size(1);
  return n >= 1 && n <= kDenseGemvMaxRows && x.dtype() == weight.dtype() && x.dtype() != DType::F32 && k % 8 == 0 &&
         aligned16(x.data(), x.stride_bytes(0)) && aligned16(weight.data(), weight.stride_bytes(0));
}

// Leading dimension in elements of a row-major matrix view, as cuBLAS wants it.
int ld_of(const Tensor& t, int64_t min_ld) {
  int64_t es = static_cast<int64_t>(elem_bytes(t.dtype()));
  DI_CHECK(t.stride_bytes(0) % es == 0, "CUDA linear: row stride of {} is not a whole number of elements",
           t.describe());
  int64_t ld = t.size(0) > 1 ? t.stride_bytes(0) / es : min_ld;
  return static_cast<int>(std::max(ld, min_ld));
}

}  // namespace

void CudaBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const int64_t n = x.size(0), k = x.size(1), m = weight.size(0);
  if (n == 0 || m == 0) return;
  if (weight.dtype() == DType::F8E4M3_B64) {
    linear_fp8(x, weight, bias, out);
    return;
  }
  elem_type(weight.dtype(), "linear");  // rejects quantised weights with a clear message
  const float* bias_data = bias.defined() ? bias.data_as<const float>() : nullptr;

  DI_CHECK(x.dtype() != DType::F32 || out.dtype() == DType::F32,
           "linear: f32 activations {} need an f32 output on CUDA, got {}", x.describe(), out.describe());
  if (x.dtype() == DType::F32 && weight.dtype() != DType::F32) {
    launch_linear_f32x(rows_of(x), elem_type(weight.dtype(), "linear"), static_cast<const char*>(weight.data()),
                       weight.stride_bytes(0), m, bias_data, rows_of(out), stream_);
    check_launch("linear");
    return;
  }
  DI_CHECK(x.dtype() == DType::F32 || weight.dtype() != DType::F32,
           "linear: f32 weight {} with {} activations is not supported on CUDA; use a bf16 checkpoint",
           weight.describe(), dtype_name(x.dtype()));

  const bool out_ok = out.dtype() == DType::F32 || out.dtype() == x.dtype();
  if (batch_invariant_) {
    // The invariant GEMMs take 16-bit operands of one type.
    const bool fits_16bit = x.dtype() == weight.dtype() && x.dtype() != DType::F32 && out_ok;
    if (bi_cublas_ && n >= kBiCublasMinRows && bias_data == nullptr && fits_16bit &&
        unsplit_gemm_->run(cublas_type(x.dtype()), cublas_type(out.dtype()), n, m, k, x.data(), ld_of(x, k),
                           weight.data(), ld_of(weight, k), out.data(), ld_of(out, m), cu(stream_))) {
      return;
    }
    if (fits_16bit &&
        linear_mma_fits(static_cast<const char*>(x.data()), x.stride_bytes(0), static_cast<const char*>(weight.data()),
                        weight.stride_bytes(0), m, k, static_cast<const char*>(out.data()), out.stride_bytes(0))) {
      launch_linear_mma(elem_type(x.dtype(), "linear"), n, static_cast<const char*>(x.data()), x.stride_bytes(0),
                        static_cast<const char*>(weight.data()), weight.stride_bytes(0), m, k, bias_data,
                        out.dtype() == DType::F32, static_cast<char*>(out.data()), out.stride_bytes(0), bi_wgmma_,
                        stream_);
      check_launch("linear(batch-invariant)");
      return;
    }
    if (!warned_variant_linear_) {
      warned_variant_linear_ = true;
      log_warn("CUDA backend: a linear of x {} and weight {} does not fit the batch-invariant GEMM (same 16-bit "
               "dtype, dimensions multiples of 8, aligned rows); it runs through cuBLAS, whose results may depend "
               "on the batch",
               x.describe(), weight.describe());
    }
  }
  if (gemv_fits(x, weight) && out_ok && !batch_invariant_) {
    launch_gemv(elem_type(x.dtype(), "linear"), static_cast<int>(n), static_cast<const char*>(x.data()),
                x.stride_bytes(0), static_cast<const char*>(weight.data()), weight.stride_bytes(0), m, k, bias_data,
                out.dtype() == DType::F32, static_cast<char*>(out.data()), out.stride_bytes(0), stream_);
    check_launch("linear(gemv)");
    return;
  }
  // cuBLAS is column-major: out^T[m, n] = W[m, k] (read transposed from its
  // row-major [m, k]) times x^T[k, n].
  const void* xp = x.data();
  int ldx = ld_of(x, k);
  DType x_type = x.dtype();
  if (x_type != weight.dtype()) {
    // bf16 activations with f16 weights: convert x once to the weights' dtype.
    char* buf = static_cast<char*>(scratch(static_cast<size_t>(n * k) * 2 + static_cast<size_t>(n * m) * 4));
    launch_convert(elem_type(x_type, "linear"), rows_of(x), elem_type(weight.dtype(), "linear"), buf, stream_);
    check_launch("linear(convert)");
    xp = buf;
    ldx = static_cast<int>(k);
    x_type = weight.dtype();
  }
  // cuBLAS has no (f16, f16) -> bf16 product: go through an f32 buffer then.
  bool via_f32 = out.dtype() != DType::F32 && out.dtype() != x_type;
  void* op = out.data();
  int ldo = ld_of(out, m);
  if (via_f32) {
    op = static_cast<char*>(scratch(static_cast<size_t>(n * k) * 2 + static_cast<size_t>(n * m) * 4)) +
         static_cast<size_t>(n * k) * 2;
    ldo = static_cast<int>(m);
  }
  const float alpha = 1.0f, beta = 0.0f;
  const int ldw = ld_of(weight, k);
  check_cublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                            static_cast<int>(k), &alpha, weight.data(), cublas_type(weight.dtype()), ldw, xp,
                            cublas_type(x_type), ldx, &beta, op, via_f32 ? CUDA_R_32F : cublas_type(out.dtype()),
                            ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  if (via_f32) {
    RowView tmp;
    tmp.base = static_cast<char*>(op);
    tmp.cols = m;
    tmp.rows = n;
    tmp.nouter = 1;
    tmp.shape[0] = n;
    tmp.stride[0] = m * 4;
    // Convert row by row into the strided output.
    Tensor out_rows = out;
    RowView ov = rows_of(out_rows);
    if (ov.stride[0] == m * static_cast<int64_t>(elem_bytes(out.dtype()))) {
      launch_convert(ElemType::F32, tmp, elem_type(out.dtype(), "linear"), ov.base, stream_);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        RowView one = tmp;
        one.base = tmp.base + i * tmp.stride[0];
        one.rows = 1;
        one.shape[0] = 1;
        launch_convert(ElemType::F32, one, elem_type(out.dtype(), "linear"), ov.base + i * ov.stride[0], stream_);
      }
    }
    check_launch("linear(convert out)");
  }
  if (bias_data) {
    launch_add_bias(elem_type(out.dtype(), "linear"), rows_of(out), bias_data, stream_);
    check_launch("linear(bias)");
  }
}

void CudaBackend::linear_batched(const Tensor& x, const Tensor& weight, Tensor out) {
  const int64_t n = x.size(0), batch = weight.size(0), m = weight.size(1), k = weight.size(2);
  if (n == 0 || batch == 0 || m == 0) return;
  if (batch_invariant_ && x.dtype() == weight.dtype() && x.dtype() != DType::F32 && out.dtype() == x.dtype()) {
    // One batch-invariant product per b (x[:, b], W[b], out[:, b]).
    bool fits = x.stride_bytes(1) % 16 == 0 && weight.stride_bytes(0) % 16 == 0 && out.stride_bytes(1) % 8 == 0;
    fits = fits && linear_mma_fits(static_cast<const char*>(x.data()), x.stride_bytes(0),
                                   static_cast<const char*>(weight.data()), weight.stride_bytes(1), m, k,
                                   static_cast<const char*>(out.data()), out.stride_bytes(0));
    if (fits) {
      for (int64_t b = 0; b < batch; ++b) {
        launch_linear_mma(elem_type(x.dtype(), "linear_batched"), n,
                          static_cast<const char*>(x.data()) + b * x.stride_bytes(1), x.stride_bytes(0),
                          static_cast<const char*>(weight.data()) + b * weight.stride_bytes(0),
                          weight.stride_bytes(1), m, k, nullptr, false,
                          static_cast<char*>(out.data()) + b * out.stride_bytes(1), out.stride_bytes(0), bi_wgmma_,
                          stream_);
      }
      check_launch("linear_batched(batch-invariant)");
      return;
    }
  }
  // Decode: all B products in one gemv launch (grid y = b). Otherwise one
  // linear per b (cuBLAS at these row counts).
  if (n <= kGemvMaxRows && x.dtype() == weight.dtype() && x.dtype() != DType::F32 && out.dtype() == x.dtype() &&
      k % 8 == 0 && aligned16(x.data(), x.stride_bytes(0)) && aligned16(x.data(), x.stride_bytes(1)) &&
      aligned16(weight.data(), weight.stride_bytes(0)) && aligned16(weight.data(), weight.stride_bytes(1))) {
    launch_gemv(elem_type(x.dtype(), "linear_batched"), static_cast<int>(n), static_cast<const char*>(x.data()),
                x.stride_bytes(0), static_cast<const char*>(weight.data()), weight.stride_bytes(1), m, k, nullptr,
                false, static_cast<char*>(out.data()), out.stride_bytes(0), stream_, GemvConfig{0, 4},
                GemvBatch{batch, x.stride_bytes(1), weight.stride_bytes(0), out.stride_bytes(1)});
    check_launch("linear_batched(gemv)");
    return;
  }
  // Larger n: one strided-batched cuBLAS product (column-major, as in linear)
  // when every operand has one dtype and element-aligned strides.
  const int64_t es = static_cast<int64_t>(elem_bytes(x.dtype()));
  auto in_elems = [es](int64_t bytes) { return bytes % es == 0; };
  if (x.dtype() == weight.dtype() && out.dtype() == x.dtype() && in_elems(x.stride_bytes(0)) &&
      in_elems(x.stride_bytes(1)) && in_elems(weight.stride_bytes(0)) && in_elems(weight.stride_bytes(1)) &&
      in_elems(out.stride_bytes(0)) && in_elems(out.stride_bytes(1))) {
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType t = cublas_type(x.dtype());
    check_cublas(cublasGemmStridedBatchedEx(
                     cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                     &alpha, weight.data(), t, static_cast<int>(weight.stride_bytes(1) / es), weight.stride_bytes(0) / es,
                     x.data(), t, static_cast<int>(x.stride_bytes(0) / es), x.stride_bytes(1) / es, &beta, out.data(), t,
                     static_cast<int>(out.stride_bytes(0) / es), out.stride_bytes(1) / es, static_cast<int>(batch),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
    return;
  }
  Backend::linear_batched(x, weight, out);
}

bool CudaBackend::gated_linear(const Tensor& x, const Tensor& w_gate_up, Activation act, Tensor out) {
  if (act != Activation::Silu && act != Activation::GeluTanh) return false;
  // Batch-invariant: every row count through the tensor-core GEMM with the
  // activation in its epilogue, the bits of the mode's linear + activation
  // (which runs where the rows do not fit the GEMM). Otherwise the
  // decode-sized product only; larger batches are compute-bound GEMMs.
  if (batch_invariant_) {
    if (w_gate_up.dtype() != x.dtype() || x.dtype() == DType::F32) return false;
    // Batches the mode's linear hands to cuBLASLt: linear + activation (the same bits).
    if (bi_cublas_ && x.size(0) >= kBiCublasMinRows) return false;
    const bool launched = launch_gated_linear_mma(
        elem_type(x.dtype(), "gated_linear"), x.size(0), static_cast<const char*>(x.data()), x.stride_bytes(0),
        static_cast<const char*>(w_gate_up.data()), w_gate_up.stride_bytes(0), out.size(1), x.size(1),
        act == Activation::GeluTanh, static_cast<char*>(out.data()), out.stride_bytes(0), bi_wgmma_, stream_);
    if (launched) check_launch("gated_linear(batch-invariant)");
    return launched;
  }
  if (w_gate_up.dtype() == DType::F8E4M3_B64) {
    if ((x.dtype() != DType::BF16 && x.dtype() != DType::F16) || !aligned16(x.data(), x.stride_bytes(0)) ||
        !w_gate_up.is_contiguous()) {
      return false;
    }
    const bool launched = launch_gemv_f8_glu(elem_type(x.dtype(), "gated_linear"), static_cast<int>(x.size(0)),
                                             static_cast<const char*>(x.data()), x.stride_bytes(0),
                                             static_cast<const char*>(w_gate_up.data()), w_gate_up.stride_bytes(0),
                                             out.size(1), x.size(1), act == Activation::GeluTanh,
                                             static_cast<char*>(out.data()), out.stride_bytes(0), stream_);
    if (launched) check_launch("gated_linear(fp8)");
    return launched;
  }
  if (!gemv_fits(x, w_gate_up)) return false;
  launch_gemv_glu(elem_type(x.dtype(), "gated_linear"), static_cast<int>(x.size(0)),
                  static_cast<const char*>(x.data()), x.stride_bytes(0), static_cast<const char*>(w_gate_up.data()),
                  w_gate_up.stride_bytes(0), out.size(1), x.size(1), act == Activation::GeluTanh,
                  static_cast<char*>(out.data()), out.stride_bytes(0), stream_);
  check_launch("gated_linear");
  return true;
}

bool CudaBackend::probe_unsplit_gemm() {
  // Two row counts, for which cuBLASLt picks different kernels.
  for (int64_t n : {48, 256}) {
    const bool same = linear_mma_probe(
        stream_, n, 136, 1040, [this](const char* x, const char* w, char* out, int64_t rows, int64_t m, int64_t k) {
          return unsplit_gemm_->run(CUDA_R_16BF, CUDA_R_32F, rows, m, k, x, k, w, k, out, m, cu(stream_));
        });
    if (!same) return false;
  }
  return true;
}

}  // namespace deepinfer::cuda
