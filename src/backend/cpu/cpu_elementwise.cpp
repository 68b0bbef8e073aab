// Row-wise and element-wise ops of the CPU backend.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/rows.h"
#include "backend/cpu/vec.h"
#include "backend/cpu/vec_kernels.h"

namespace deepinfer::cpu {

namespace {

// Below this many elements a loop runs on the calling thread: waking the pool
// costs more than the work.
constexpr int64_t kParallelElems = 32768;

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kParallelElems / std::max<int64_t>(cols, 1)); }

void normalize_row(const float* x, const float* w, float eps, float offset, float* out, int64_t n) {
  float inv = 1.0f / std::sqrt(vec::sum_squares(x, n) / static_cast<float>(n) + eps);
  int64_t i = 0;
#if DEEPINFER_CPU_AVX2
  __m256 vinv = _mm256_set1_ps(inv), voff = _mm256_set1_ps(offset);
  for (; i + 8 <= n; i += 8) {
    __m256 vw = _mm256_add_ps(_mm256_loadu_ps(w + i), voff);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), vw));
  }
#endif
  for (; i < n; ++i) out[i] = x[i] * inv * (w[i] + offset);
}

// gpt-oss's expert activation, in transformers' order of operations.
inline float clamped_swiglu(float gate, float up) {
  const float g = std::min(gate, kClampedSwigluLimit);
  const float u = std::clamp(up, -kClampedSwigluLimit, kClampedSwigluLimit);
  return (u + 1.0f) * (g * (1.0f / (1.0f + std::exp(-g * kClampedSwigluAlpha))));
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset,
                          Tensor out) {
  Rows xr(x), orow(out);
  const float* w = weight.data_as<float>();
  int64_t n = xr.cols();
  pool_.parallel_for(xr.rows(), [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) normalize_row(xr.row(r), w, eps, weight_offset, orow.row(r), n);
  }, row_grain(n));
}

void CpuBackend::add_rms_norm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                              float weight_offset, Tensor out) {
  Rows rr(residual), xr(x), orow(out);
  const float* w = weight.data_as<float>();
  int64_t n = xr.cols();
  pool_.parallel_for(xr.rows(), [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      float* res = rr.row(r);
      vec::axpy(res, 1.0f, xr.row(r), n);
      normalize_row(res, w, eps, weight_offset, orow.row(r), n);
    }
  }, row_grain(n));
}

void CpuBackend::gated_activation(const Tensor& gate, const Tensor& up, Activation act, Tensor out) {
  Rows gr(gate), ur(up), orow(out);
  int64_t n = gr.cols();
  pool_.parallel_for(gr.rows(), [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = gr.row(r);
      const float* u = ur.row(r);
      float* o = orow.row(r);
      if (act == Activation::Silu) {
        vec_->silu_mul(o, g, u, n);
      } else if (act == Activation::ClampedSwiglu) {
        for (int64_t i = 0; i < n; ++i) o[i] = clamped_swiglu(g[i], u[i]);
      } else {
        vec_->gelu_tanh_mul(o, g, u, n);
      }
    }
  }, std::max<int64_t>(1, row_grain(n) / 8));
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor out) {
  Rows ar(a), br(b), orow(out);
  int64_t n = ar.cols();
  pool_.parallel_for(ar.rows(), [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = ar.row(r);
      const float* y = br.row(r);
      float* o = orow.row(r);
      for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
    }
  }, row_grain(n));
}

void CpuBackend::scale(const Tensor& x, float factor, Tensor out) {
  Rows xr(x), orow(out);
  int64_t n = xr.cols();
  pool_.parallel_for(xr.rows(), [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* v = xr.row(r);
      float* o = orow.row(r);
      for (int64_t i = 0; i < n; ++i) o[i] = v[i] * factor;
    }
  }, row_grain(n));
}

void CpuBackend::zero_rows_at_position(Tensor x, const Tensor& positions, int32_t position) {
  Rows xr(x);
  const int32_t* pos = positions.data_as<int32_t>();
  for (int64_t r = 0; r < xr.rows(); ++r) {
    if (pos[r] == position) std::fill_n(xr.row(r), xr.cols(), 0.0f);
  }
}

void CpuBackend::token_probs(const Tensor& logits, const Tensor& tokens, Tensor out) {
  Rows lr(logits);
  const int64_t vocab = lr.cols();
  const int32_t* tok = tokens.data_as<int32_t>();
  float* o = out.data_as<float>();
  pool_.parallel_for(lr.rows(), [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* l = lr.row(r);
      float max = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isfinite(l[i])) max = std::max(max, l[i]);
      }
      const int32_t t = tok[r];
      if (!std::isfinite(max) || t < 0 || t >= vocab || !std::isfinite(l[t])) {
        o[r] = 0.0f;
        continue;
      }
      double sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) {
        if (std::isfinite(l[i])) sum += std::exp(static_cast<double>(l[i] - max));
      }
      o[r] = static_cast<float>(std::exp(static_cast<double>(l[t] - max)) / sum);
    }
  }, std::max<int64_t>(1, row_grain(vocab)));
}

}  // namespace deepinfer::cpu
