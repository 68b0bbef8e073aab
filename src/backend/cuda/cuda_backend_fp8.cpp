// The CUDA backend's FP8 row-block weights (DType::F8E4M3_B64): their device
// layout (split rows, converted by copy) and the linear product on them
// (cuda_gemv_fp8.cu; for larger batches the FP8 GEMM of cuda_gemm_fp8.cu,
// opted in, or dequantised chunks through the 16-bit path).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_helpers.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"
#include "core/fp8_blocks.h"

namespace deepinfer::cuda {

using namespace backend_helpers;

// FP8 row blocks live on the device in split rows (core/fp8_blocks.h:
// codes, then scales), converted on the way in and out.
void CudaBackend::copy_fp8_rows(Tensor dst, const Tensor& src) {
  DI_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous(),
           "copy: FP8 row blocks move between host and device as whole contiguous tensors, got {} -> {}",
           src.describe(), dst.describe());
  const int64_t k = src.size(-1), rows = src.numel() / k;
  std::vector<uint8_t> staged(src.nbytes());
  cudaStream_t s = cu(stream_);
  if (on_host(src)) {
    split_f8_rows(src.data_as<const F8Block>(), rows, k, staged.data());
    check_cuda(cudaMemcpyAsync(dst.data(), staged.data(), staged.size(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");  // `staged` is read until then
  } else {
    check_cuda(cudaMemcpyAsync(staged.data(), src.data(), staged.size(), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    join_f8_rows(staged.data(), rows, k, dst.data_as<F8Block>());
  }
}

void CudaBackend::linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const int64_t n = x.size(0), k = x.size(1), m = weight.size(0);
  DI_CHECK(x.dtype() == DType::BF16 || x.dtype() == DType::F16,
           "linear: FP8 weights {} need bf16 or f16 activations on CUDA, got {}", weight.describe(), x.describe());
  DI_CHECK(out.dtype() == DType::F32 || out.dtype() == x.dtype(), "linear: output {} for FP8 weights and {} x",
           out.describe(), x.describe());
  const float* bias_data = bias.defined() ? bias.data_as<const float>() : nullptr;
  const bool x_aligned = aligned16(x.data(), x.stride_bytes(0));
  DI_CHECK(weight.is_contiguous(), "linear: FP8 weight {} is not a contiguous stack of rows", weight.describe());
  if (n <= kGemvF8MaxRows && x_aligned && !batch_invariant_) {
    launch_gemv_f8(elem_type(x.dtype(), "linear"), static_cast<int>(n), static_cast<const char*>(x.data()),
                   x.stride_bytes(0), static_cast<const char*>(weight.data()), weight.stride_bytes(0), m, k,
                   bias_data, out.dtype() == DType::F32, static_cast<char*>(out.data()), out.stride_bytes(0),
                   stream_);
    check_launch("linear(gemv fp8)");
    return;
  }
  if (fp8_gemm_ && !batch_invariant_ && n <= kFp8GemmMaxRows &&
      gemm_f8_fits(k, m, static_cast<const char*>(x.data()), x.stride_bytes(0),
                   static_cast<const char*>(weight.data()), weight.stride_bytes(0),
                   static_cast<const char*>(out.data()), out.stride_bytes(0))) {
    // Decode batches past the gemv on FP8 tensor cores, activations quantised
    // per 64 elements. A graph being captured cannot grow the codes' buffer
    // (sized at start-up for kFp8GemmMaxRows rows of 32,768): such a step
    // takes the dequantising path below.
    const size_t need = gemm_f8_scratch_bytes(n, k);
    if (!capturing_ || need <= fp8_gemm_scratch_bytes_) {
      grow_buffer(fp8_gemm_scratch_, fp8_gemm_scratch_bytes_, need, "FP8 GEMM activation codes");
      // Tiles from bench_fp8_gemm (H100, run 72): 128 x 128 for the wide
      // gate-up rows, 128 x 64 with both k blocks in flight for the others.
      const int tiles = m >= 16384 ? 0 : 2;
      launch_gemm_f8(elem_type(x.dtype(), "linear"), n, static_cast<const char*>(x.data()), x.stride_bytes(0),
                     static_cast<const char*>(weight.data()), weight.stride_bytes(0), m, k, bias_data,
                     out.dtype() == DType::F32, static_cast<char*>(out.data()), out.stride_bytes(0),
                     static_cast<char*>(fp8_gemm_scratch_), stream_, tiles);
      check_launch("linear(gemm fp8)");
      return;
    }
  }
  // Larger batches: weight rows dequantised to x's type a chunk at a time
  // (at most kFp8DequantChunkBytes), then the 16-bit path (cuBLAS, or the batch-invariant
  // GEMM) on each chunk of output columns.
  const int64_t row_bytes_16 = k * 2;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(m, kFp8DequantChunkBytes / row_bytes_16));
  grow_buffer(fp8_dequant_, fp8_dequant_bytes_, static_cast<size_t>(chunk * row_bytes_16), "FP8 dequantisation buffer");
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int64_t rows = std::min(chunk, m - r0);
    launch_dequant_f8(static_cast<const char*>(weight.data()) + r0 * weight.stride_bytes(0), weight.stride_bytes(0),
                      rows, k, elem_type(x.dtype(), "linear"), static_cast<char*>(fp8_dequant_), row_bytes_16,
                      stream_);
    check_launch("linear(dequantise fp8)");
    const Tensor w16(fp8_dequant_, x.dtype(), {rows, k}, device());
    linear(x, w16, bias.defined() ? bias.narrow(0, r0, rows) : Tensor(), out.narrow(1, r0, rows));
  }
}

}  // namespace deepinfer::cuda
