#include "op_test_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <span>

#include "backend/cpu/quants.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/fp8_blocks.h"

namespace deepinfer::testing {

std::string BackendCase::name() const {
  if (type == DeviceType::CUDA) return "cuda";
  return fmt::format("cpu_{}threads", num_threads);
}

std::vector<BackendCase> available_backends() {
  // 1 thread runs every loop inline; 3 threads on a small machine exercise
  // uneven splits and oversubscription.
  std::vector<BackendCase> cases = {{DeviceType::CPU, 1}, {DeviceType::CPU, 3}};
  try {
    create_backend(DeviceType::CUDA);
    cases.push_back({DeviceType::CUDA, 0});
  } catch (const Error&) {
    // Not built or no device: CPU only.
  }
  return cases;
}

void BackendTest::SetUp() {
  BackendOptions options;
  options.num_threads = GetParam().num_threads;
  backend_ = create_backend(GetParam().type, options);
}

DeviceTensor upload(Backend& backend, DType dtype, std::initializer_list<int64_t> shape,
                    const void* host) {
  Tensor host_view(const_cast<void*>(host), dtype, shape);
  DeviceTensor d{Buffer(backend, host_view.nbytes()), {}};
  d.t = d.buffer.view(dtype, shape);
  backend.copy(d.t, host_view);
  return d;
}

DeviceTensor upload_f32(Backend& backend, std::initializer_list<int64_t> shape,
                        const std::vector<float>& host) {
  DeviceTensor d = upload(backend, DType::F32, shape, host.data());
  EXPECT_EQ(static_cast<size_t>(d.t.numel()), host.size());
  return d;
}

DeviceTensor upload_i32(Backend& backend, const std::vector<int32_t>& host) {
  return upload(backend, DType::I32, {static_cast<int64_t>(host.size())}, host.data());
}

DeviceTensor zeros(Backend& backend, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, dtype, shape);
  std::vector<uint8_t> host(probe.nbytes(), 0);
  return upload(backend, dtype, shape, host.data());
}

std::vector<float> download_f32(Backend& backend, const Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  std::vector<int64_t> shape;
  for (int d = 0; d < t.ndim(); ++d) shape.push_back(t.size(d));
  Tensor host_view(host.data(), DType::F32, std::span<const int64_t>(shape));
  backend.copy(host_view, t);
  backend.synchronize();
  return host;
}

std::vector<float> round_to_fp8(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = f8e4m3_to_f32(f32_to_f8e4m3(values[i]));
  return out;
}

DeviceTensor upload_fp8(Backend& backend, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
  std::vector<uint8_t> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = f32_to_f8e4m3(values[i]);
  return upload(backend, DType::F8E4M3, shape, h.data());
}

std::vector<uint8_t> download_bytes(Backend& backend, const Tensor& t) {
  std::vector<uint8_t> h(t.nbytes());
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  backend.copy(Tensor(h.data(), t.dtype(), std::span<const int64_t>(shape)), t);
  backend.synchronize();
  return h;
}

std::vector<float> download_any(Backend& backend, const Tensor& t) {
  if (t.dtype() == DType::F32) return download_f32(backend, t);
  if (t.dtype() == DType::F8E4M3) {
    const std::vector<uint8_t> bytes = download_bytes(backend, t);
    std::vector<float> out(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) out[i] = f8e4m3_to_f32(bytes[i]);
    return out;
  }
  std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  backend.copy(Tensor(h.data(), t.dtype(), std::span<const int64_t>(shape)), t);
  backend.synchronize();
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = t.dtype() == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  return out;
}

DeviceTensor upload_bf16(Backend& backend, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
  std::vector<uint16_t> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = f32_to_bf16(values[i]);
  return upload(backend, DType::BF16, shape, h.data());
}

DeviceMetadata upload_metadata(Backend& backend, const PagedLayout& layout) {
  DeviceMetadata m{upload_i32(backend, layout.q_indptr), upload_i32(backend, layout.kv_indptr),
                   upload_i32(backend, layout.pages), upload_i32(backend, layout.last), {}};
  m.meta.num_seqs = static_cast<int>(layout.q_indptr.size()) - 1;
  m.meta.max_q_len = layout.max_q;
  m.meta.max_kv_len = layout.max_kv;
  m.meta.q_indptr = m.q_indptr.t;
  m.meta.kv_indptr = m.kv_indptr.t;
  m.meta.kv_page_indices = m.pages.t;
  m.meta.kv_last_page_len = m.last.t;
  return m;
}

void CudaVsCpuTest::SetUp() {
  try {
    gpu_ = create_backend(DeviceType::CUDA);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend: " << e.what();
  }
  BackendOptions o;
  o.num_threads = 2;
  cpu_ = create_backend(DeviceType::CPU, o);
}

std::vector<float> Rng::floats(size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (auto& x : v) x = uniform(lo, hi);
  return v;
}

namespace {

// Byte offsets of the f16 scale fields inside one block of each quantised weight
// format (ggml layouts); random bytes elsewhere are valid codes.
std::vector<int> scale_offsets(DType dtype) {
  switch (dtype) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: return {0};
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q6_K: return {208};
    default: break;
  }
  ADD_FAILURE() << "no test weight generator for " << dtype_name(dtype);
  return {};
}

}  // namespace

std::vector<int32_t> draw_expert_ids(Rng& rng, int64_t n, int64_t n_experts, int top_k, bool skew) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(n_experts));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng.gen());
    if (skew && rng.uniform() > 0.0f) std::iota(perm.begin(), perm.begin() + top_k, 0);
    ids.insert(ids.end(), perm.begin(), perm.begin() + top_k);
  }
  return ids;
}

HostWeights random_weights(Rng& rng, DType dtype, int64_t m, int64_t k) {
  HostWeights w;
  size_t row = row_bytes(dtype, k);
  w.bytes.resize(row * static_cast<size_t>(m));
  w.values.resize(static_cast<size_t>(m * k));
  if (dtype == DType::F32) {
    auto v = rng.floats(w.values.size());
    std::memcpy(w.bytes.data(), v.data(), w.bytes.size());
    w.values = v;
    return w;
  }
  if (dtype == DType::F16 || dtype == DType::BF16) {
    auto* h = reinterpret_cast<uint16_t*>(w.bytes.data());
    for (size_t i = 0; i < w.values.size(); ++i) {
      float x = rng.uniform();
      h[i] = dtype == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
      w.values[i] = dtype == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
    }
    return w;
  }
  if (dtype == DType::F8E4M3_B64) {  // quantised from random floats: no NaN codes, real scales
    const std::vector<float> v = rng.floats(w.values.size());
    for (int64_t r = 0; r < m; ++r) {
      auto* blocks = reinterpret_cast<F8Block*>(w.bytes.data() + static_cast<size_t>(r) * row);
      quantize_f8_blocks(v.data() + r * k, blocks, k);
      dequantize_f8_blocks(blocks, w.values.data() + r * k, k);
    }
    return w;
  }
  for (auto& b : w.bytes) b = static_cast<uint8_t>(rng.uniform_int(0, 255));
  const DTypeInfo& info = dtype_info(dtype);
  std::vector<int> offsets = scale_offsets(dtype);
  for (size_t block = 0; block < w.bytes.size() / static_cast<size_t>(info.block_bytes); ++block) {
    for (int off : offsets) {
      uint16_t h = f32_to_f16(rng.uniform(0.002f, 0.02f) * (rng.uniform_int(0, 1) ? 1.0f : -1.0f));
      std::memcpy(w.bytes.data() + block * static_cast<size_t>(info.block_bytes) + static_cast<size_t>(off), &h, 2);
    }
  }
  const cpu::QuantKernels& kernels = cpu::quant_kernels(dtype);
  for (int64_t r = 0; r < m; ++r) kernels.dequantize_row(w.bytes.data() + static_cast<size_t>(r) * row, w.values.data() + r * k, k);
  return w;
}

::testing::AssertionResult all_close(const std::vector<float>& actual, const std::vector<double>& expected,
                                     double atol, double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << " != expected " << expected.size();
  }
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double diff = std::abs(static_cast<double>(actual[i]) - expected[i]);
    double err = diff == 0.0 ? 0.0 : diff / (atol + rtol * std::abs(expected[i]));
    if (!(err <= worst) || std::isnan(actual[i])) {  // NaN compares false: always reported
      worst = std::isnan(actual[i]) ? INFINITY : err;
      worst_i = i;
    }
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst_i << ": got " << actual[worst_i] << ", expected "
                                       << expected[worst_i] << " (atol " << atol << ", rtol " << rtol
                                       << ", error ratio " << worst << ")";
}

}  // namespace deepinfer::testing
