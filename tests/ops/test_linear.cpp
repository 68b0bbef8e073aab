// linear and embedding against double-precision references, for every weight
// dtype with CPU kernels, decode- and prefill-shaped inputs, and strided views.
#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/gemm_amx.h"
#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

class LinearTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(LinearTest);

// Decode-shaped products of GGUF-quantised weights run on activations
// quantised to 8 bits, and on AMX machines so do the prefill-shaped ones (int8
// tiles); the reference keeps them in f32. FP8 row blocks read f32 activations.
bool activation_is_quantised(const Backend& backend, DType weight, int64_t n) {
  if (!is_quantized(weight) || weight == DType::F8E4M3_B64) return false;
  if (n <= cpu::CpuBackend::kLinearGemvMaxRows) return true;
  return backend.name() == "cpu" && cpu::active_isa() == cpu::CpuIsa::Amx && cpu::amx::supports(weight);
}

struct LinearCase {
  int64_t n, k, m;
  bool bias;
  bool strided;  // x and out are column slices of wider buffers
};

void run_linear(Backend& backend, Rng& rng, DType dtype, const LinearCase& c) {
  SCOPED_TRACE(fmt::format("{} n={} k={} m={} bias={} strided={}", dtype_name(dtype), c.n, c.k, c.m,
                           c.bias, c.strided));
  HostWeights w = random_weights(rng, dtype, c.m, c.k);
  int64_t x_pad = c.strided ? 7 : 0, o_pad = c.strided ? 5 : 0;
  std::vector<float> x_full = rng.floats(static_cast<size_t>(c.n * (c.k + x_pad)));
  std::vector<float> b = rng.floats(static_cast<size_t>(c.m));

  DeviceTensor dw = upload(backend, dtype, {c.m, c.k}, w.bytes.data());
  DeviceTensor dx = upload_f32(backend, {c.n, c.k + x_pad}, x_full);
  DeviceTensor db = upload_f32(backend, {c.m}, b);
  DeviceTensor dout = zeros(backend, DType::F32, {c.n, c.m + o_pad});
  Tensor x = dx.t.narrow(1, x_pad, c.k);
  Tensor out = dout.t.narrow(1, 0, c.m);
  ops::linear(backend, x, dw.t, c.bias ? db.t : Tensor(), out);

  std::vector<double> expected(static_cast<size_t>(c.n * c.m));
  std::vector<double> magnitude(expected.size());
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t j = 0; j < c.m; ++j) {
      double sum = c.bias ? b[j] : 0.0, mag = 0.0;
      for (int64_t l = 0; l < c.k; ++l) {
        double p = static_cast<double>(x_full[i * (c.k + x_pad) + x_pad + l]) * w.values[j * c.k + l];
        sum += p;
        mag += std::abs(p);
      }
      expected[i * c.m + j] = sum;
      magnitude[i * c.m + j] = mag;
    }
  }
  std::vector<float> actual = download_f32(backend, out);
  // Error bound relative to sum |x_l w_l|: f32 accumulation for float weights,
  // 8-bit activations (relative step 1/127) for quantised weights at decode size.
  bool act_q = activation_is_quantised(backend, dtype, c.n);
  double rel = act_q ? 1.0 / 127 : 2e-5;
  for (size_t i = 0; i < actual.size(); ++i) {
    double err = std::abs(actual[i] - expected[i]);
    ASSERT_LE(err, rel * magnitude[i] + 1e-5) << "element " << i << ": got " << actual[i] << ", expected "
                                               << expected[i];
  }
  // The padding columns next to the output slice stay untouched.
  std::vector<float> full = download_f32(backend, dout.t);
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t j = c.m; j < c.m + o_pad; ++j) ASSERT_EQ(full[i * (c.m + o_pad) + j], 0.0f);
  }
}

const std::vector<LinearCase> kFloatCases = {
    {1, 64, 96, false, false},  {1, 33, 17, true, true},    {3, 64, 130, true, true},
    {4, 96, 64, false, false},  {5, 64, 96, true, false},   {17, 96, 300, false, true},
    {64, 160, 70, true, true},
};

TEST_P(LinearTest, FloatWeights) {
  Rng rng(1);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const auto& c : kFloatCases) run_linear(backend(), rng, dtype, c);
  }
}

TEST_P(LinearTest, QuantisedWeights) {
  Rng rng(2);
  if (!backend_supports_quantised(backend())) {
    HostWeights w = random_weights(rng, DType::Q4_0, 8, 64);
    DeviceTensor dw = upload(backend(), DType::Q4_0, {8, 64}, w.bytes.data());
    DeviceTensor dx = zeros(backend(), DType::F32, {1, 64});
    DeviceTensor dout = zeros(backend(), DType::F32, {1, 8});
    EXPECT_THROW(ops::linear(backend(), dx.t, dw.t, Tensor(), dout.t), Error);
    GTEST_SKIP() << backend().name() << " has no quantised-weight kernels";
  }
  const std::vector<DType> block32 = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0};
  const std::vector<DType> block256 = {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType dtype : block32) {
    for (const auto& c : std::vector<LinearCase>{{1, 64, 35, false, false}, {2, 96, 70, true, true},
                                                 {4, 32, 16, false, true}, {9, 128, 130, true, true},
                                                 {33, 64, 40, false, false}, {70, 96, 50, true, true}}) {
      run_linear(backend(), rng, dtype, c);
    }
  }
  for (DType dtype : block256) {
    for (const auto& c : std::vector<LinearCase>{{1, 256, 35, false, false}, {3, 512, 20, true, true},
                                                 {12, 256, 66, true, false},
                                                 {20, 256, 33, false, true}, {49, 512, 17, true, true}}) {
      run_linear(backend(), rng, dtype, c);
    }
  }
}

// FP8 row blocks (64 elements, one f32 scale): decode (gemv) and prefill
// (dequantised tiles) shapes, row widths of whole blocks only, strided views;
// exact against the dequantised weights up to f32 accumulation.
TEST_P(LinearTest, Fp8RowBlockWeights) {
  Rng rng(6);
  if (!backend_supports_quantised(backend())) GTEST_SKIP() << backend().name() << " has no FP8 weight kernels";
  for (const auto& c : std::vector<LinearCase>{{1, 64, 35, false, false}, {2, 576, 70, true, true},
                                               {4, 128, 16, false, true}, {9, 1024, 130, true, true},
                                               {33, 64, 40, false, false}, {70, 192, 50, true, true}}) {
    run_linear(backend(), rng, DType::F8E4M3_B64, c);
  }
}

// On AMX machines prefill-shaped products of block-quantised weights run as
// int8 tile products on activations carried in two 8-bit planes (value and
// rounding residual): x is represented to within d / 256 per 32-element block,
// d = max|x| / 127 rounded up. Checked against the exact product with that
// bound, 128 times tighter than one 8-bit plane allows, so a lost residual,
// a wrong scale or a misplaced block fails.
TEST(AmxGemm, MatchesExactProductsToTheResidualPrecision) {
  if (cpu::active_isa() != cpu::CpuIsa::Amx) {
    GTEST_SKIP() << "this CPU runs " << cpu::isa_name(cpu::active_isa()) << " kernels, not AMX";
  }
  cpu::CpuBackend backend;
  Rng rng(5);
  const int64_t n = 37, k = 512, m = 45;
  for (DType dtype : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                      DType::Q6_K}) {
    ASSERT_TRUE(cpu::amx::supports(dtype)) << dtype_name(dtype);
    SCOPED_TRACE(dtype_name(dtype));
    HostWeights w = random_weights(rng, dtype, m, k);
    DeviceTensor dw = upload(backend, dtype, {m, k}, w.bytes.data());
    std::vector<float> x = rng.floats(static_cast<size_t>(n * k));
    for (int64_t l = 0; l < k; l += 97) x[static_cast<size_t>(l)] *= 40.0f;  // uneven blocks
    DeviceTensor dx = upload_f32(backend, {n, k}, x);
    DeviceTensor out = zeros(backend, DType::F32, {n, m});
    ops::linear(backend, dx.t, dw.t, Tensor(), out.t);
    const std::vector<float> got = download_f32(backend, out.t);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double exact = 0.0, mag = 0.0, act_err = 0.0;
        for (int64_t b = 0; b < k; b += 32) {
          double amax = 0.0;
          for (int64_t l = b; l < b + 32; ++l) amax = std::max(amax, std::abs(static_cast<double>(x[i * k + l])));
          for (int64_t l = b; l < b + 32; ++l) {
            const double p = static_cast<double>(x[i * k + l]) * w.values[j * k + l];
            exact += p;
            mag += std::abs(p);
            act_err += std::abs(w.values[j * k + l]) * amax * 1.01 / (127.0 * 256.0);
          }
        }
        ASSERT_NEAR(got[i * m + j], exact, act_err + 2e-6 * mag) << "row " << i << " column " << j;
      }
    }
  }
}

TEST_P(LinearTest, WeightRowSliceAndEmptyBatch) {
  // A slice of weight rows (as a fused QKV weight split at load) multiplies like a matrix of its own.
  Rng rng(3);
  HostWeights w = random_weights(rng, DType::F32, 40, 64);
  DeviceTensor dw = upload(backend(), DType::F32, {40, 64}, w.bytes.data());
  std::vector<float> x = rng.floats(2 * 64);
  DeviceTensor dx = upload_f32(backend(), {2, 64}, x);
  DeviceTensor dout = zeros(backend(), DType::F32, {2, 8});
  ops::linear(backend(), dx.t, dw.t.slice_rows(30, 8), Tensor(), dout.t);
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i) {
    for (int j = 30; j < 38; ++j) {
      double s = 0;
      for (int l = 0; l < 64; ++l) s += static_cast<double>(x[i * 64 + l]) * w.values[j * 64 + l];
      expected.push_back(s);
    }
  }
  EXPECT_TRUE(all_close(download_f32(backend(), dout.t), expected, 1e-5, 1e-5));
  ops::linear(backend(), dx.t.slice_rows(0, 0), dw.t, Tensor(), zeros(backend(), DType::F32, {1, 40}).t.slice_rows(0, 0));
}

class EmbeddingTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(EmbeddingTest);

TEST_P(EmbeddingTest, RowsOfEveryDtype) {
  Rng rng(4);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K,
                      DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(dtype));
    int64_t vocab = 50, hidden = is_quantized(dtype) ? 256 : 40;
    HostWeights w = random_weights(rng, dtype, vocab, hidden);
    DeviceTensor table = upload(backend(), dtype, {vocab, hidden}, w.bytes.data());
    std::vector<int32_t> ids = {0, 49, 7, 7, 23, 1, 48, 12, 3};
    DeviceTensor dids = upload_i32(backend(), ids);
    DeviceTensor out = zeros(backend(), DType::F32, {static_cast<int64_t>(ids.size()), hidden + 3});
    Tensor view = out.t.narrow(1, 3, hidden);
    if (is_quantized(dtype) && !backend_supports_quantised(backend())) {
      EXPECT_THROW(ops::embedding(backend(), table.t, dids.t, view), Error);
      continue;
    }
    ops::embedding(backend(), table.t, dids.t, view);
    std::vector<double> expected;
    for (int32_t id : ids) {
      for (int64_t h = 0; h < hidden; ++h) expected.push_back(w.values[id * hidden + h]);
    }
    EXPECT_TRUE(all_close(download_f32(backend(), view), expected, 0.0, 0.0));
  }
}

// A rank's slice of the vocabulary (tensor parallelism): ids of the slice
// give their rows, other ids of the vocabulary zero rows, so the ranks' rows
// add up to the whole table's.
TEST_P(EmbeddingTest, VocabularySliceGivesZeroRowsForOtherIds) {
  Rng rng(5);
  const int64_t vocab = 50, hidden = 40, first = 20, rows = 16;
  std::vector<float> t = rng.floats(static_cast<size_t>(rows * hidden));
  DeviceTensor table = upload_f32(backend(), {rows, hidden}, t);
  const std::vector<int32_t> ids = {0, 19, 20, 35, 36, 49, 27};
  DeviceTensor dids = upload_i32(backend(), ids);
  DeviceTensor out = zeros(backend(), DType::F32, {static_cast<int64_t>(ids.size()), hidden});
  ops::embedding_slice(backend(), table.t, dids.t, first, vocab, out.t);
  std::vector<double> expected;
  for (int32_t id : ids) {
    const bool mine = id >= first && id < first + rows;
    for (int64_t h = 0; h < hidden; ++h) expected.push_back(mine ? t[static_cast<size_t>((id - first) * hidden + h)] : 0.0);
  }
  EXPECT_TRUE(all_close(download_f32(backend(), out.t), expected, 0.0, 0.0));
  // An id outside the vocabulary is still an error, and a slice must lie inside it.
  DeviceTensor bad = upload_i32(backend(), {50});
  EXPECT_THROW(
      {
        ops::embedding_slice(backend(), table.t, bad.t, first, vocab, out.t.slice_rows(0, 1));
        backend().synchronize();
      },
      Error);
  EXPECT_THROW(ops::embedding_slice(backend(), table.t, dids.t, 40, vocab, out.t), Error);
}

TEST_P(EmbeddingTest, RejectsOutOfRangeIds) {
  std::vector<float> t(4 * 8, 1.0f);
  DeviceTensor table = upload_f32(backend(), {4, 8}, t);
  DeviceTensor ids = upload_i32(backend(), {1, 4});
  DeviceTensor out = zeros(backend(), DType::F32, {2, 8});
  EXPECT_THROW(
      {
        ops::embedding(backend(), table.t, ids.t, out.t);
        backend().synchronize();
      },
      Error);
}

// linear_batched: B products with their own weights over strided head views
// (as MLA's per-head projections use it) against a double-precision reference.
TEST_P(LinearTest, BatchedPerHeadWeights) {
  Rng rng(77);
  for (int64_t n : {1, 3, 9}) {
    const int64_t heads = 4, k = 24, m = 16, x_row = heads * (k + 8), out_row = heads * (m + 4);
    SCOPED_TRACE(fmt::format("n={}", n));
    std::vector<float> x = rng.floats(static_cast<size_t>(n * x_row));
    std::vector<float> w = rng.floats(static_cast<size_t>(heads * m * k));
    DeviceTensor dx = upload_f32(backend(), {n, x_row}, x);
    DeviceTensor dw = upload_f32(backend(), {heads, m, k}, w);
    DeviceTensor dout = zeros(backend(), DType::F32, {n, out_row});
    const Tensor xv = dx.t.split_last(heads, k + 8).narrow(2, 8, k);    // [n, heads, k], strided
    const Tensor ov = dout.t.split_last(heads, m + 4).narrow(2, 0, m);  // [n, heads, m], strided
    ops::linear_batched(backend(), xv, dw.t, ov);
    const std::vector<float> got = download_f32(backend(), dout.t);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < m; ++j) {
          double want = 0;
          for (int64_t l = 0; l < k; ++l) {
            want += double{x[i * x_row + h * (k + 8) + 8 + l]} * w[(h * m + j) * k + l];
          }
          EXPECT_NEAR(got[i * out_row + h * (m + 4) + j], want, 1e-4) << i << " " << h << " " << j;
        }
        for (int64_t j = m; j < m + 4; ++j) EXPECT_EQ(got[i * out_row + h * (m + 4) + j], 0.0f);  // padding kept
      }
    }
    DeviceTensor wrong = zeros(backend(), DType::F32, {heads + 1, m, k});
    EXPECT_THROW(ops::linear_batched(backend(), xv, wrong.t, ov), Error);
  }
}

}  // namespace
}  // namespace deepinfer::testing
