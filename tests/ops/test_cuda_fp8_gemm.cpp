// The FP8 x FP8 tensor-core GEMM (cuda_gemm_fp8.cu) against a host model of
// what it computes: each 64-element block of an activation row rounded to
// e4m3 after scaling by 448 / max|x| (round to nearest even, as the device
// converts), the codes' products summed per block and scaled by activation
// scale x weight scale. The tolerance covers the f32 sums (2e-3 of sum |a w|);
// a wrong block, scale, row or column is off by O(1). Every tile
// configuration gives the same bits. Then the distance to
// the exact product of the unquantised activations, the price of e4m3
// activations, bounded at 2^-4 of sum |x w| (the per-element rounding bound).
// Skipped without a CUDA device.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "op_test_util.h"
#ifdef DEEPINFER_HAS_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#endif
#include "core/fp8.h"
#include "core/fp8_blocks.h"
#include "core/half.h"

namespace deepinfer::testing {
namespace {

#ifdef DEEPINFER_HAS_CUDA
class CudaFp8GemmTest : public CudaVsCpuTest {};

struct QuantisedRows {
  std::vector<uint8_t> codes;  // n * k
  std::vector<float> scales;   // n * k / 64
};

// The host model of the device's activation quantiser.
QuantisedRows quantise_rows(const std::vector<float>& x, int64_t n, int64_t k) {
  QuantisedRows q{std::vector<uint8_t>(static_cast<size_t>(n * k)), std::vector<float>(static_cast<size_t>(n * k / 64))};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < k / 64; ++b) {
      const float* v = x.data() + i * k + b * 64;
      float amax = 0.0f;
      for (int e = 0; e < 64; ++e) amax = std::max(amax, std::fabs(v[e]));
      const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
      q.scales[static_cast<size_t>(i * (k / 64) + b)] = amax / 448.0f;
      for (int e = 0; e < 64; ++e) q.codes[static_cast<size_t>(i * k + b * 64 + e)] = f32_to_f8e4m3(v[e] * inv);
    }
  }
  return q;
}

TEST_F(CudaFp8GemmTest, MatchesBlockScaledE4m3Products) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major < 9) GTEST_SKIP() << "the FP8 GEMM needs Hopper's wgmma";
  Rng rng(211);
  struct Case {
    int64_t n, k, m;
    bool bias;
  };
  void* stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  // Partial row tiles (n = 65, 200, 257), partial column tiles (m = 136, 264),
  // a single k tile and long k; zero rows (a block of zeros gets scale 0).
  for (const Case& c : std::vector<Case>{{65, 256, 128, false}, {200, 1280, 136, true}, {257, 512, 64, true},
                                         {130, 4096, 264, false}, {1, 256, 8, true}}) {
    for (DType out_type : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(fmt::format("n={} k={} m={} bias={} out={}", c.n, c.k, c.m, c.bias, dtype_name(out_type)));
      HostWeights w = random_weights(rng, DType::F8E4M3_B64, c.m, c.k);
      std::vector<float> x(static_cast<size_t>(c.n * c.k));
      for (auto& v : x) v = bf16_to_f32(f32_to_bf16(rng.uniform(-2.0f, 2.0f)));
      std::fill(x.begin(), x.begin() + c.k, 0.0f);  // row 0: zeros
      const std::vector<float> bias = rng.floats(static_cast<size_t>(c.m));
      DeviceTensor gw = upload(gpu(), DType::F8E4M3_B64, {c.m, c.k}, w.bytes.data());
      DeviceTensor gx = upload_bf16(gpu(), {c.n, c.k}, x);
      DeviceTensor gb = upload_f32(gpu(), {c.m}, bias);
      DeviceTensor gout = zeros(gpu(), out_type, {c.n, c.m});
      DeviceTensor scratch = zeros(gpu(), DType::F32, {static_cast<int64_t>(cuda::gemm_f8_scratch_bytes(c.n, c.k) / 4 + 1)});
      const auto* xp = static_cast<const char*>(gx.t.data());
      const auto* wp = static_cast<const char*>(gw.t.data());
      auto* op = static_cast<char*>(gout.t.data());
      ASSERT_TRUE(cuda::gemm_f8_fits(c.k, c.m, xp, gx.t.stride_bytes(0), wp, gw.t.stride_bytes(0), op,
                                     gout.t.stride_bytes(0)));
      // Every tile configuration: the same operations per output in the same order, so the same bits.
      std::vector<float> got;
      for (int tiles = 0; tiles < 4; ++tiles) {
        cuda::launch_gemm_f8(cuda::ElemType::BF16, c.n, xp, gx.t.stride_bytes(0), wp, gw.t.stride_bytes(0), c.m,
                             c.k, c.bias ? static_cast<const float*>(gb.t.data()) : nullptr, out_type == DType::F32,
                             op, gout.t.stride_bytes(0), static_cast<char*>(scratch.t.data()), stream, tiles);
        const std::vector<float> out = download_any(gpu(), gout.t);
        if (tiles == 0) got = out;
        ASSERT_EQ(out, got) << "tile configuration " << tiles;
      }

      const QuantisedRows q = quantise_rows(x, c.n, c.k);
      const auto* blocks = reinterpret_cast<const F8Block*>(w.bytes.data());
      const int64_t nb = c.k / 64;
      const double out_rounding = out_type == DType::BF16 ? 4e-3 : 0.0;
      double worst_vs_exact = 0.0;
      for (int64_t i = 0; i < c.n; ++i) {
        for (int64_t j = 0; j < c.m; ++j) {
          double model = c.bias ? bias[j] : 0.0, exact = model, mag = 0.0, mag_exact = 0.0;
          for (int64_t b = 0; b < nb; ++b) {
            const F8Block& wb = blocks[j * nb + b];
            const double sa = q.scales[static_cast<size_t>(i * nb + b)];
            double sum = 0.0, abs_sum = 0.0;
            for (int e = 0; e < 64; ++e) {
              const double p = double(f8e4m3_to_f32(q.codes[static_cast<size_t>(i * c.k + b * 64 + e)])) *
                               f8e4m3_to_f32(wb.codes[e]);
              sum += p;
              abs_sum += std::abs(p);
              const double pe = double(x[static_cast<size_t>(i * c.k + b * 64 + e)]) * w.values[j * c.k + b * 64 + e];
              exact += pe;
              mag_exact += std::abs(pe);
            }
            model += sum * sa * wb.scale;
            mag += abs_sum * sa * std::abs(wb.scale);
          }
          const double v = got[static_cast<size_t>(i * c.m + j)];
          ASSERT_NEAR(v, model, (2e-3 + out_rounding) * (std::abs(model) + mag) + 1e-5) << "row " << i << " col " << j;
          ASSERT_NEAR(v, exact, (0.0625 + out_rounding) * (std::abs(exact) + mag_exact) + 1e-5)
              << "row " << i << " col " << j;
          if (mag_exact > 0.0) worst_vs_exact = std::max(worst_vs_exact, std::abs(v - exact) / mag_exact);
        }
      }
      fmt::print("[fp8 gemm] n={} k={} m={} out={}: largest |out - exact| / sum|x w| = {:.2e}\n", c.n, c.k, c.m,
                 dtype_name(out_type), worst_vs_exact);
    }
  }
}

// Split rows are 68 bytes a block: rows of k % 256 != 0 are not 16-byte
// aligned, which the GEMM's copies need; the backend then dequantises.
TEST_F(CudaFp8GemmTest, RejectsRowsItCannotCopy) {
  alignas(16) static char buf[64];
  EXPECT_FALSE(cuda::gemm_f8_fits(576, 64, buf, 1152, buf, 612, buf, 256));
  EXPECT_FALSE(cuda::gemm_f8_fits(512, 62, buf, 1024, buf, 544, buf, 248));  // odd column pairs
  EXPECT_TRUE(cuda::gemm_f8_fits(512, 64, buf, 1024, buf, 544, buf, 256));
}
#endif

}  // namespace
}  // namespace deepinfer::testing
