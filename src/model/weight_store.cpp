#include "model/weight_store.h"

#include <vector>

#include "backend/cpu/quants.h"
#include "core/error.h"
#include "core/half.h"

namespace deepinfer {

namespace {

// Appends the innermost rows of a strided host view to `out`, in order.
void gather_rows_to(const Tensor& t, std::vector<char>& out) {
  if (t.ndim() <= 1) {
    const auto* p = static_cast<const char*>(t.data());
    out.insert(out.end(), p, p + row_bytes(t.dtype(), t.ndim() == 1 ? t.size(0) : 1));
    return;
  }
  for (int64_t i = 0; i < t.size(0); ++i) gather_rows_to(t.row(i), out);
}

}  // namespace

std::vector<char> dequantize_rows(const Tensor& host, DType to) {
  DI_CHECK(is_quantized(host.dtype()) && host.is_contiguous() && host.ndim() >= 1,
           "dequantize_rows: {} is not a contiguous quantised tensor", host.describe());
  DI_CHECK(to == DType::F32 || to == DType::F16 || to == DType::BF16, "dequantize_rows: cannot round to {}",
           dtype_name(to));
  const cpu::QuantKernels& k = cpu::quant_kernels(host.dtype());
  const int64_t cols = host.size(host.ndim() - 1), rows = cols == 0 ? 0 : host.numel() / cols;
  const size_t in_row = row_bytes(host.dtype(), cols), out_row = row_bytes(to, cols);
  std::vector<char> out(static_cast<size_t>(rows) * out_row);
  std::vector<float> values(static_cast<size_t>(cols));
  const auto* src = static_cast<const char*>(host.data());
  for (int64_t r = 0; r < rows; ++r) {
    k.dequantize_row(src + r * in_row, values.data(), cols);
    char* dst = out.data() + r * out_row;
    for (int64_t i = 0; i < cols; ++i) {
      const float v = values[static_cast<size_t>(i)];
      if (to == DType::F32) {
        reinterpret_cast<float*>(dst)[i] = v;
      } else {
        reinterpret_cast<uint16_t*>(dst)[i] = to == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      }
    }
  }
  return out;
}

size_t WeightStore::stored_bytes(const Tensor& host) const {
  if (backend_.reads_host_weights() || !is_quantized(host.dtype())) return host.nbytes();
  if (host.dtype() == DType::F8E4M3_B64 && backend_.stores_fp8_weights()) return host.nbytes();  // linear weights
  const int64_t cols = host.size(host.ndim() - 1);  // quantised tensors have rows
  return cols == 0 ? 0 : static_cast<size_t>(host.numel() / cols) * row_bytes(backend_.activation_dtype(), cols);
}

Tensor WeightStore::dequantized_view(const Tensor& host, std::vector<char>& scratch) const {
  if (!is_quantized(host.dtype()) || !host.is_contiguous()) return host;
  const DType to = backend_.activation_dtype();
  scratch = dequantize_rows(host, to);
  return Tensor(scratch.data(), to, host.shape());
}

Tensor WeightStore::matrix(const Tensor& host) {
  if (backend_.reads_host_weights()) {
    DI_CHECK(host.is_contiguous(), "weight {} is not contiguous", host.describe());
    bytes_mapped_ += host.nbytes();
    return host;
  }
  // Views of the file with strides (halves of a stacked gate-up, transposed
  // or per-head slices) are packed on the host once before the upload;
  // quantised blocks are dequantised there.
  std::vector<char> packed;
  Tensor src = host;
  if (!host.is_contiguous()) {
    DI_CHECK(!is_quantized(host.dtype()), "weight {} is a strided view of quantised blocks", host.describe());
    gather_rows_to(host, packed);
    src = Tensor(packed.data(), host.dtype(), host.shape());
  } else {
    src = dequantized_view(host, packed);
  }
  Buffer& buf = owned_.emplace_back(backend_, src.nbytes());
  bytes_owned_ += buf.size();
  Tensor dev(buf.data(), src.dtype(), src.shape(), backend_.device());
  backend_.copy(dev, src);
  return dev;
}

Tensor WeightStore::linear_weight(const Tensor& host) {
  if (backend_.reads_host_weights() || host.dtype() != DType::F8E4M3_B64 || !backend_.stores_fp8_weights() ||
      !host.is_contiguous()) {
    return matrix(host);
  }
  Buffer& buf = owned_.emplace_back(backend_, host.nbytes());
  bytes_owned_ += buf.size();
  Tensor dev(buf.data(), host.dtype(), host.shape(), backend_.device());
  backend_.copy(dev, host);
  return dev;
}

Tensor WeightStore::fused_matrix(std::initializer_list<Tensor> parts) {
  if (!backend_.stacks_projections() || parts.size() < 2) return Tensor();
  // FP8 parts the backend keeps as FP8 stack as FP8 rows (a row of blocks
  // does not depend on its neighbours); mixed with other types, each part is
  // stored on its own (linear_weight).
  const auto kept_fp8 = [&](const Tensor& t) {
    return t.dtype() == DType::F8E4M3_B64 && backend_.stores_fp8_weights();
  };
  const bool fp8 = kept_fp8(*parts.begin());
  for (const Tensor& t : parts) {
    if (kept_fp8(t) != fp8) return Tensor();
  }
  // Otherwise quantised parts are dequantised first, as matrix() would store them.
  std::vector<std::vector<char>> dequantized(parts.size());
  std::vector<Tensor> ready;
  for (const Tensor& t : parts) ready.push_back(fp8 ? t : dequantized_view(t, dequantized[ready.size()]));
  const Tensor& first = ready.front();
  int64_t rows = 0;
  for (const Tensor& t : ready) {
    if (t.ndim() != 2 || t.dtype() != first.dtype() || t.size(1) != first.size(1) ||
        (is_quantized(t.dtype()) && !fp8) || !t.is_contiguous()) {
      return Tensor();
    }
    rows += t.size(0);
  }
  const size_t bytes = static_cast<size_t>(rows) * row_bytes(first.dtype(), first.size(1));
  Buffer& buf = owned_.emplace_back(backend_, bytes);
  bytes_owned_ += buf.size();
  Tensor fused = buf.view(first.dtype(), {rows, first.size(1)});
  int64_t at = 0;
  for (const Tensor& t : ready) {
    backend_.copy(fused.slice_rows(at, t.size(0)), t);
    at += t.size(0);
  }
  return fused;
}

Tensor WeightStore::expert_stack(const Tensor& host) {
  if (backend_.reads_host_weights()) {
    bytes_mapped_ += host.nbytes();
    return host;
  }
  return matrix(host);
}

namespace {

void append_f32(const Tensor& host, std::vector<float>& out) {
  const int64_t n = host.numel();
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(n));
  float* values = out.data() + at;
  DI_CHECK(host.is_contiguous(), "weight {} is not contiguous", host.describe());
  switch (host.dtype()) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) values[i] = host.data_as<const float>()[i];
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) values[i] = f16_to_f32(host.data_as<const uint16_t>()[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) values[i] = bf16_to_f32(host.data_as<const uint16_t>()[i]);
      break;
    default:
      fail("expected a float vector, got {}", host.describe());
  }
}

}  // namespace

Tensor WeightStore::f32_vector(const Tensor& host) {
  std::vector<float> values;
  append_f32(host, values);
  return f32_vector(values);
}

Tensor WeightStore::f32_concat(std::initializer_list<Tensor> parts) {
  std::vector<float> values;
  for (const Tensor& t : parts) append_f32(t, values);
  return f32_vector(values);
}

Tensor WeightStore::f32_vector(const std::vector<float>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  Buffer& buf = owned_.emplace_back(backend_, values.size() * sizeof(float));
  bytes_owned_ += buf.size();
  Tensor dev = buf.view(DType::F32, {n});
  Tensor src(const_cast<float*>(values.data()), DType::F32, {n});
  backend_.copy(dev, src);
  return dev;
}

}  // namespace deepinfer
