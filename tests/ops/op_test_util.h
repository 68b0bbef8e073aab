// Shared harness for the op tests: every test runs on each available backend
// (the CPU backend at several thread counts; CUDA once it is built) through the
// backend-neutral ops:: entry points, and compares against naive scalar
// reference code written in the test itself (double accumulation).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"

namespace deepinfer::testing {

struct BackendCase {
  DeviceType type = DeviceType::CPU;
  int num_threads = 1;
  std::string name() const;
};

// The backends this build can create, each with the thread counts worth testing.
std::vector<BackendCase> available_backends();

// Host data placed on a backend: owns the device memory, exposes a view.
struct DeviceTensor {
  Buffer buffer;
  Tensor t;
};

DeviceTensor upload(Backend& backend, DType dtype, std::initializer_list<int64_t> shape,
                    const void* host);
DeviceTensor upload_f32(Backend& backend, std::initializer_list<int64_t> shape,
                        const std::vector<float>& host);
DeviceTensor upload_i32(Backend& backend, const std::vector<int32_t>& host);
// A zero-filled tensor.
DeviceTensor zeros(Backend& backend, DType dtype, std::initializer_list<int64_t> shape);

// The elements of an f32 view (any strides), row-major and contiguous on the host.
std::vector<float> download_f32(Backend& backend, const Tensor& t);
// The same for f32, bf16, f16 or f8_e4m3 views, widened to f32.
std::vector<float> download_any(Backend& backend, const Tensor& t);
// Values rounded to FP8 e4m3 (and back to f32), as an FP8 KV cache holds them.
std::vector<float> round_to_fp8(const std::vector<float>& values);
// Values rounded to FP8 e4m3 and placed on the backend as an f8_e4m3 tensor.
DeviceTensor upload_fp8(Backend& backend, std::initializer_list<int64_t> shape, const std::vector<float>& values);
// The raw bytes of a contiguous tensor.
std::vector<uint8_t> download_bytes(Backend& backend, const Tensor& t);
// Values rounded to bf16 and placed on the backend as a bf16 tensor.
DeviceTensor upload_bf16(Backend& backend, std::initializer_list<int64_t> shape, const std::vector<float>& values);

class Rng {
 public:
  explicit Rng(uint32_t seed) : gen_(seed) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }
  std::vector<float> floats(size_t n, float lo = -1.0f, float hi = 1.0f);
  std::mt19937& gen() { return gen_; }

 private:
  std::mt19937 gen_;
};

// Weight rows of dtype `dtype` with m rows of k elements, and their f32 values.
// Block-quantised rows hold random codes with small finite scales.
struct HostWeights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // m * k, as the dtype represents them
};
HostWeights random_weights(Rng& rng, DType dtype, int64_t m, int64_t k);

// Whether the backend has kernels for GGUF block-quantised weights (the CPU
// does; CUDA rejects them with a clear error for now).
// Sequences (anything with q_len and kv_len) laid out on randomly shuffled
// pages of page_size, with two spare pages: the attention metadata arrays and
// the cache slot of every key, keys of all sequences in order.
struct PagedLayout {
  int64_t num_pages = 0, kv_total = 0, n = 0;  // n: query rows
  int max_q = 0, max_kv = 0;
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, pages, last, slots;
};

template <class Seqs>
PagedLayout random_paged_layout(Rng& rng, const Seqs& seqs, int page_size) {
  PagedLayout l;
  int64_t pages_needed = 0;
  for (const auto& s : seqs) {
    pages_needed += (s.kv_len + page_size - 1) / page_size;
    l.kv_total += s.kv_len;
  }
  l.num_pages = pages_needed + 2;
  std::vector<int32_t> pool(static_cast<size_t>(l.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng.gen());
  for (const auto& s : seqs) {
    const int n_pages = (s.kv_len + page_size - 1) / page_size;
    const size_t first_page = l.pages.size();
    for (int p = 0; p < n_pages; ++p) l.pages.push_back(pool[l.pages.size()]);
    for (int j = 0; j < s.kv_len; ++j) {
      l.slots.push_back(l.pages[first_page + static_cast<size_t>(j / page_size)] * page_size + j % page_size);
    }
    l.q_indptr.push_back(l.q_indptr.back() + s.q_len);
    l.kv_indptr.push_back(static_cast<int32_t>(l.pages.size()));
    l.last.push_back(s.kv_len - (n_pages - 1) * page_size);
    l.max_q = std::max(l.max_q, s.q_len);
    l.max_kv = std::max(l.max_kv, s.kv_len);
  }
  l.n = l.q_indptr.back();
  return l;
}

// A PagedLayout's metadata arrays placed on a backend, and the
// AttentionMetadata viewing them (valid while this object lives).
struct DeviceMetadata {
  DeviceTensor q_indptr, kv_indptr, pages, last;
  AttentionMetadata meta;
};
DeviceMetadata upload_metadata(Backend& backend, const PagedLayout& layout);

// top_k distinct expert ids per token for n tokens, drawn from the first
// n_experts; `skew` sends about half the tokens to experts 0..top_k-1 (so
// some experts get many rows and others none).
std::vector<int32_t> draw_expert_ids(Rng& rng, int64_t n, int64_t n_experts, int top_k, bool skew = false);

inline bool backend_supports_quantised(const Backend& b) { return b.device().type == DeviceType::CPU; }

// Fixture base for CUDA-vs-CPU comparisons in the GPU's production
// precision: skipped when no CUDA device is present.
class CudaVsCpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
  Backend& gpu() { return *gpu_; }
  Backend& cpu() { return *cpu_; }

 private:
  std::unique_ptr<Backend> gpu_, cpu_;
};

// Fixture base: one backend per test parameter.
class BackendTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override;
  Backend& backend() { return *backend_; }

 private:
  std::unique_ptr<Backend> backend_;
};

// max |a - b| / (atol + rtol * |b|) <= 1 over all elements, with a failure message
// that names the first offending index.
::testing::AssertionResult all_close(const std::vector<float>& actual, const std::vector<double>& expected,
                                     double atol, double rtol);

}  // namespace deepinfer::testing

#define DEEPINFER_INSTANTIATE_BACKEND_TESTS(Fixture)                                            \
  INSTANTIATE_TEST_SUITE_P(Backends, Fixture,                                                   \
                           ::testing::ValuesIn(::deepinfer::testing::available_backends()),      \
                           [](const ::testing::TestParamInfo<::deepinfer::testing::BackendCase>& i) { \
                             return i.param.name();                                             \
                           })
