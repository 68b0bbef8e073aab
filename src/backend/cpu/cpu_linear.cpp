// linear on the CPU: out[n, m] = x[n, k] * W[m, k]^T (+ bias).
//
// Two strategies, picked by the number of activation rows n:
//  - gemv (decode: n <= 16 rows, 2 where AMX tiles take the rest): each activation row is converted
//    once to the weight kernels' activation format, then threads split the
//    weight rows and call `dot`, so the weights are read exactly once in their
//    compact form: decode is bound by weight bandwidth.
//    With batch invariance on, every batch takes this path.
//  - gemm (prefill): on CPUs with AMX, block-quantised weights go to the int8
//    tile GEMM (gemm_amx.h). Elsewhere threads take tiles of weight rows,
//    dequantise a tile into per-thread f32 scratch and multiply it with all of
//    x through OpenBLAS sgemm; f32 weights go to sgemm directly. The
//    dequantisation is amortised over the n rows and sgemm supplies the
//    compute efficiency.
#include <cblas.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_amx.h"
#include "backend/cpu/weight_kernels.h"

namespace deepinfer::cpu {

namespace {

constexpr int64_t kGemvRowGrain = 16;
constexpr int64_t kMinTile = 16;
constexpr int64_t kMaxTile = 256;

// Enough tiles for every thread to get several (load balance), never tiny ones.
int64_t tile_rows(int64_t m, int threads) {
  int64_t want = (m + 4 * threads - 1) / (4 * threads);
  want = (want + kMinTile - 1) / kMinTile * kMinTile;
  return std::clamp(want, kMinTile, kMaxTile);
}

}  // namespace

void CpuBackend::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  if (x.size(0) == 0 || weight.size(0) == 0) return;
  if (batch_invariant_ || x.size(0) <= linear_gemv_max_rows(weight.dtype())) {
    linear_gemv(x, weight, bias, out);
  } else if (use_amx_ && amx::supports(weight.dtype())) {
    amx::linear(pool_, act_scratch_, thread_scratch_, x, weight, bias, out);
  } else {
    linear_gemm(x, weight, bias, out);
  }
}

int64_t CpuBackend::linear_gemv_max_rows(DType weight) const {
  return use_amx_ && amx::supports(weight) ? kLinearGemvMaxRowsAmx : kLinearGemvMaxRows;
}

void CpuBackend::linear_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const QuantKernels& kernels = weight_kernels(weight.dtype());
  int64_t n = x.size(0), k = x.size(1), m = weight.size(0);
  const char* xb = static_cast<const char*>(x.data());
  int64_t x_stride = x.stride_bytes(0);

  // Activation rows in the format `dot` expects, n of them, act_stride bytes apart.
  const char* act = xb;
  int64_t act_stride = x_stride;
  if (kernels.act != DType::F32) {
    act_stride = static_cast<int64_t>(row_bytes(kernels.act, k));
    char* buf = act_scratch_.get<char>(static_cast<size_t>(n * act_stride));
    for (int64_t i = 0; i < n; ++i) {
      kernels.quantize_act(reinterpret_cast<const float*>(xb + i * x_stride), buf + i * act_stride, k);
    }
    act = buf;
  }

  const char* wb = static_cast<const char*>(weight.data());
  int64_t w_stride = weight.stride_bytes(0);
  char* ob = static_cast<char*>(out.data());
  int64_t o_stride = out.stride_bytes(0);
  const float* bias_data = bias.defined() ? bias.data_as<float>() : nullptr;
  auto dot = kernels.dot;

  pool_.parallel_for(m, [&](int64_t begin, int64_t end, int) {
    for (int64_t j = begin; j < end; ++j) {
      const char* w = wb + j * w_stride;
      float b = bias_data ? bias_data[j] : 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        reinterpret_cast<float*>(ob + i * o_stride)[j] = dot(w, act + i * act_stride, k) + b;
      }
    }
  }, kGemvRowGrain);
}

void CpuBackend::linear_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const QuantKernels& kernels = weight_kernels(weight.dtype());
  int64_t n = x.size(0), k = x.size(1), m = weight.size(0);
  const float* xd = x.data_as<float>();
  // BLAS insists on leading dimensions >= the row length even where a
  // single-row view carries an arbitrary stride.
  int64_t lda = std::max(k, x.stride_bytes(0) / static_cast<int64_t>(sizeof(float)));
  float* od = out.data_as<float>();
  int64_t ldc = std::max(m, out.stride_bytes(0) / static_cast<int64_t>(sizeof(float)));
  const char* wb = static_cast<const char*>(weight.data());
  int64_t w_stride = weight.stride_bytes(0);
  const float* bias_data = bias.defined() ? bias.data_as<float>() : nullptr;
  bool direct = weight.dtype() == DType::F32;

  int64_t tile = tile_rows(m, pool_.num_threads());
  int64_t num_tiles = (m + tile - 1) / tile;
  pool_.parallel_for(num_tiles, [&](int64_t begin, int64_t end, int thread) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t j0 = t * tile;
      int64_t rows = std::min(tile, m - j0);
      const float* b;
      int64_t ldb;
      if (direct) {
        b = reinterpret_cast<const float*>(wb + j0 * w_stride);
        ldb = std::max(k, w_stride / static_cast<int64_t>(sizeof(float)));
      } else {
        float* deq = thread_scratch_[static_cast<size_t>(thread)].get<float>(
            static_cast<size_t>(tile * k) * sizeof(float));
        for (int64_t r = 0; r < rows; ++r) kernels.dequantize_row(wb + (j0 + r) * w_stride, deq + r * k, k);
        b = deq;
        ldb = k;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
                  static_cast<int>(k), 1.0f, xd, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f,
                  od + j0, static_cast<int>(ldc));
      if (bias_data) {
        for (int64_t i = 0; i < n; ++i) {
          float* o = od + i * ldc + j0;
          for (int64_t r = 0; r < rows; ++r) o[r] += bias_data[j0 + r];
        }
      }
    }
  }, 1, 1);
}

}  // namespace deepinfer::cpu
