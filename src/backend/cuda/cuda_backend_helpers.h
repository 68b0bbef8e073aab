// Small helpers shared by the CUDA backend's translation units
// (cuda_backend.cpp, cuda_backend_linear.cpp, cuda_backend_fp8.cpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer::cuda::backend_helpers {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA backend: {} failed: {}", what, cudaGetErrorString(e));
}

inline cudaStream_t cu(CUstream_st* s) { return s; }

inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("CUDA backend: {} failed: {}", what, cublasGetStatusString(s));
}

inline RowView rows_of(const Tensor& t) {
  RowView v;
  v.base = static_cast<char*>(t.data());
  v.cols = t.size(-1);
  v.nouter = t.ndim() - 1;
  DI_CHECK(v.nouter <= 3, "CUDA backend: tensor {} has too many dimensions", t.describe());
  v.rows = 1;
  for (int d = 0; d < v.nouter; ++d) {
    v.shape[d] = t.size(d);
    v.stride[d] = t.stride_bytes(d);
    v.rows *= v.shape[d];
  }
  return v;
}

inline bool aligned16(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 16 == 0;
}

inline bool on_host(const Tensor& t) { return t.device().type == DeviceType::CPU; }

// The kernels' element type of a float tensor; a clear error for others.
inline ElemType elem_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return ElemType::F32;
    case DType::F16: return ElemType::F16;
    case DType::BF16: return ElemType::BF16;
    default: break;
  }
  if (is_quantized(t)) {
    fail("{}: no CUDA kernels for GGUF block-quantised {} tensors (model weights are dequantised at load)", op,
         dtype_name(t));
  }
  fail("{}: dtype {} is not supported by the CUDA backend", op, dtype_name(t));
}

}  // namespace deepinfer::cuda::backend_helpers
