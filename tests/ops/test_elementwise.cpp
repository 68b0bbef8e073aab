// rms_norm, add_rms_norm, gated_activation, add, scale, gather_rows and copy
// against double-precision references, on contiguous and strided views.
#include <fmt/format.h>

#include <cstring>

#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

class ElementwiseTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(ElementwiseTest);

// A [rows, cols] view into a [rows, cols + pad] buffer at column offset pad,
// with the host values of the whole buffer.
struct StridedInput {
  DeviceTensor storage;
  Tensor view;
  std::vector<float> host;
  int64_t cols, pad;
  float at(int64_t r, int64_t c) const { return host[static_cast<size_t>(r * (cols + pad) + pad + c)]; }
};

StridedInput strided_input(Backend& backend, Rng& rng, int64_t rows, int64_t cols, int64_t pad) {
  StridedInput s{{}, {}, rng.floats(static_cast<size_t>(rows * (cols + pad)), -2.0f, 2.0f), cols, pad};
  s.storage = upload_f32(backend, {rows, cols + pad}, s.host);
  s.view = s.storage.t.narrow(1, pad, cols);
  return s;
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 64}, {3, 33}, {17, 576}, {2, 1}, {70, 640}};

TEST_P(ElementwiseTest, RmsNorm) {
  Rng rng(10);
  for (auto [rows, cols] : kShapes) {
    for (float offset : {0.0f, 1.0f}) {
      SCOPED_TRACE(fmt::format("rows={} cols={} offset={}", rows, cols, offset));
      StridedInput x = strided_input(backend(), rng, rows, cols, 3);
      std::vector<float> w = rng.floats(static_cast<size_t>(cols));
      DeviceTensor dw = upload_f32(backend(), {cols}, w);
      DeviceTensor out = zeros(backend(), DType::F32, {rows, cols});
      float eps = 1e-6f;
      ops::rms_norm(backend(), x.view, dw.t, eps, offset, out.t);
      std::vector<double> expected;
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(x.at(r, c)) * x.at(r, c);
        double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
        for (int64_t c = 0; c < cols; ++c) expected.push_back(x.at(r, c) * inv * (w[c] + offset));
      }
      EXPECT_TRUE(all_close(download_f32(backend(), out.t), expected, 1e-5, 1e-5));
      // In place: out aliases x.
      ops::rms_norm(backend(), x.view, dw.t, eps, offset, x.view);
      EXPECT_TRUE(all_close(download_f32(backend(), x.view), expected, 1e-5, 1e-5));
    }
  }
}

TEST_P(ElementwiseTest, AddRmsNorm) {
  Rng rng(11);
  for (auto [rows, cols] : kShapes) {
    SCOPED_TRACE(fmt::format("rows={} cols={}", rows, cols));
    StridedInput residual = strided_input(backend(), rng, rows, cols, 2);
    StridedInput x = strided_input(backend(), rng, rows, cols, 5);
    std::vector<float> w = rng.floats(static_cast<size_t>(cols));
    DeviceTensor dw = upload_f32(backend(), {cols}, w);
    DeviceTensor out = zeros(backend(), DType::F32, {rows, cols});
    ops::add_rms_norm(backend(), residual.view, x.view, dw.t, 1e-5f, 1.0f, out.t);
    std::vector<double> expected_sum, expected;
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < cols; ++c) {
        double s = static_cast<double>(residual.at(r, c)) + x.at(r, c);
        expected_sum.push_back(s);
        ss += s * s;
      }
      double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + 1e-5);
      for (int64_t c = 0; c < cols; ++c) expected.push_back(expected_sum[r * cols + c] * inv * (w[c] + 1.0));
    }
    EXPECT_TRUE(all_close(download_f32(backend(), residual.view), expected_sum, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(download_f32(backend(), out.t), expected, 1e-5, 1e-5));
  }
}

TEST_P(ElementwiseTest, GatedActivation) {
  Rng rng(12);
  for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
    for (auto [rows, cols] : kShapes) {
      SCOPED_TRACE(fmt::format("act={} rows={} cols={}", static_cast<int>(act), rows, cols));
      // gate and up as the two halves of one fused gate_up output, like the MLP produces.
      std::vector<float> fused = rng.floats(static_cast<size_t>(rows * 2 * cols), -6.0f, 6.0f);
      DeviceTensor dfused = upload_f32(backend(), {rows, 2 * cols}, fused);
      Tensor gate = dfused.t.narrow(1, 0, cols), up = dfused.t.narrow(1, cols, cols);
      DeviceTensor out = zeros(backend(), DType::F32, {rows, cols});
      ops::gated_activation(backend(), gate, up, act, out.t);
      std::vector<double> expected;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          double g = fused[r * 2 * cols + c], u = fused[r * 2 * cols + cols + c];
          double a = act == Activation::Silu
                         ? g / (1.0 + std::exp(-g))
                         : 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
          expected.push_back(a * u);
        }
      }
      EXPECT_TRUE(all_close(download_f32(backend(), out.t), expected, 1e-5, 1e-5));
    }
  }
}

TEST_P(ElementwiseTest, AddAndScale) {
  Rng rng(13);
  for (auto [rows, cols] : kShapes) {
    SCOPED_TRACE(fmt::format("rows={} cols={}", rows, cols));
    StridedInput a = strided_input(backend(), rng, rows, cols, 1);
    StridedInput b = strided_input(backend(), rng, rows, cols, 4);
    DeviceTensor out = zeros(backend(), DType::F32, {rows, cols});
    ops::add(backend(), a.view, b.view, out.t);
    std::vector<double> sum, scaled;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        sum.push_back(static_cast<double>(a.at(r, c)) + b.at(r, c));
        scaled.push_back(static_cast<double>(a.at(r, c)) * 0.37f);
      }
    }
    EXPECT_TRUE(all_close(download_f32(backend(), out.t), sum, 1e-6, 1e-6));
    ops::scale(backend(), a.view, 0.37f, a.view);
    EXPECT_TRUE(all_close(download_f32(backend(), a.view), scaled, 1e-6, 1e-6));
  }
}

TEST_P(ElementwiseTest, AddRank3) {
  Rng rng(14);
  std::vector<float> a = rng.floats(2 * 3 * 5), b = rng.floats(2 * 3 * 5);
  DeviceTensor da = upload_f32(backend(), {2, 3, 5}, a), db = upload_f32(backend(), {2, 3, 5}, b);
  DeviceTensor out = zeros(backend(), DType::F32, {2, 4, 5});
  Tensor view = out.t.narrow(1, 1, 3);
  ops::add(backend(), da.t, db.t, view);
  std::vector<double> expected;
  for (size_t i = 0; i < a.size(); ++i) expected.push_back(static_cast<double>(a[i]) + b[i]);
  EXPECT_TRUE(all_close(download_f32(backend(), view), expected, 1e-6, 1e-6));
}

TEST_P(ElementwiseTest, GatherRowsAndCopy) {
  Rng rng(15);
  std::vector<float> x = rng.floats(6 * 9);
  DeviceTensor dx = upload_f32(backend(), {6, 9}, x);
  Tensor view = dx.t.narrow(1, 2, 7);
  std::vector<int32_t> rows = {5, 0, 0, 3};
  DeviceTensor drows = upload_i32(backend(), rows);
  DeviceTensor out = zeros(backend(), DType::F32, {4, 7});
  ops::gather_rows(backend(), view, drows.t, out.t);
  std::vector<double> expected;
  for (int32_t r : rows) {
    for (int c = 0; c < 7; ++c) expected.push_back(x[r * 9 + 2 + c]);
  }
  EXPECT_TRUE(all_close(download_f32(backend(), out.t), expected, 0.0, 0.0));

  // Strided device-to-device copy into another strided view.
  DeviceTensor dst = zeros(backend(), DType::F32, {6, 10});
  ops::copy(backend(), dst.t.narrow(1, 3, 7), view);
  std::vector<float> got = download_f32(backend(), dst.t);
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 10; ++c) {
      float want = c >= 3 ? x[r * 9 + 2 + (c - 3)] : 0.0f;
      ASSERT_EQ(got[r * 10 + c], want) << r << "," << c;
    }
  }
  DeviceTensor bad = upload_i32(backend(), {6});
  DeviceTensor one_row = zeros(backend(), DType::F32, {1, 7});
  EXPECT_THROW(
      {
        ops::gather_rows(backend(), view, bad.t, one_row.t);
        backend().synchronize();
      },
      Error);
}

TEST_P(ElementwiseTest, ZeroRowsAtPosition) {
  Rng rng(31);
  for (DType dtype : {DType::F32, backend().activation_dtype()}) {
    const int64_t rows = 7, cols = 136;
    std::vector<float> x = rng.floats(static_cast<size_t>(rows * cols));
    DeviceTensor dx = dtype == DType::F32 ? upload_f32(backend(), {rows, cols}, x) : upload_bf16(backend(), {rows, cols}, x);
    const std::vector<float> before = download_any(backend(), dx.t);
    const std::vector<int32_t> positions = {0, 5, 0, 1, 2, 0, 9};
    DeviceTensor dp = upload_i32(backend(), positions);
    ops::zero_rows_at_position(backend(), dx.t, dp.t, 0);
    const std::vector<float> after = download_any(backend(), dx.t);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        EXPECT_EQ(after[i], positions[static_cast<size_t>(r)] == 0 ? 0.0f : before[i]) << r << "," << c;
      }
    }
  }
  DeviceTensor dx = zeros(backend(), DType::F32, {3, 4});
  DeviceTensor short_positions = upload_i32(backend(), {0, 1});
  EXPECT_THROW(ops::zero_rows_at_position(backend(), dx.t, short_positions.t, 0), Error);
}

// copy_blocks_async: rows of several blocks between device addresses, as a
// decode engine loads KV blocks from a prefill engine's shared pool (one
// launch on CUDA; more blocks than one launch takes, to cross its limit).
TEST_P(ElementwiseTest, CopyBlocksMovesEveryRowOfEveryBlock) {
  constexpr int64_t kBlocks = 300, kRows = 6, kWidth = 96, kSrcPitch = kRows * kWidth, kDstPitch = 500 * kWidth;
  std::vector<int32_t> src_host(static_cast<size_t>(kBlocks * kSrcPitch / 4));
  for (size_t i = 0; i < src_host.size(); ++i) src_host[i] = static_cast<int32_t>(i * 7 + 3);
  DeviceTensor src = upload_i32(backend(), src_host);
  // The destination: kRows rows kDstPitch apart; block b lands at offset (b * 3 % 500) * kWidth.
  DeviceTensor dst = zeros(backend(), DType::I32, {kRows * kDstPitch / 4});
  std::vector<Backend::BlockCopy> copies;
  for (int64_t b = 0; b < kBlocks; ++b) {
    copies.push_back({static_cast<char*>(dst.t.data()) + (b * 3 % 500) * kWidth,
                      static_cast<const char*>(src.t.data()) + b * kSrcPitch});
  }
  backend().copy_blocks_async(copies, kDstPitch, kWidth, kWidth, kRows);
  backend().synchronize();
  const std::vector<uint8_t> got = download_bytes(backend(), dst.t);
  const auto* want = reinterpret_cast<const uint8_t*>(src_host.data());
  for (int64_t b = 0; b < kBlocks; ++b) {
    for (int64_t r = 0; r < kRows; ++r) {
      const uint8_t* from = want + b * kSrcPitch + r * kWidth;
      const uint8_t* to = got.data() + r * kDstPitch + (b * 3 % 500) * kWidth;
      ASSERT_EQ(std::memcmp(from, to, kWidth), 0) << "block " << b << " row " << r;
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
