// The CUDA backend in its production precision (bf16 activations and KV cache,
// bf16 weights, f32 accumulation, f32 logits) against the CPU backend on the
// same bf16-rounded inputs in f32. The generic op tests cover every backend at
// f32; these cover the bf16 paths and model-sized shapes (long decode with
// split-KV, long prefill, GQA, sliding window, softcap, sinks).
//
// Tolerances: one bf16 rounding of an output is 2^-9 relative; rms_norm and
// rope outputs are checked at atol = rtol = 1e-2, attention at 2e-2 (bf16 q
// and an f32 online softmax), linear relative to sum |x_l w_l| (f32
// accumulation, 4e-3 for a bf16 output). Skipped when no CUDA device is present.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "op_test_util.h"
#ifdef DEEPINFER_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#endif
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

DeviceTensor upload_f16(Backend& b, std::initializer_list<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  return upload(b, DType::F16, shape, h.data());
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

class CudaBf16Test : public CudaVsCpuTest {};

TEST_F(CudaBf16Test, ActivationDtypeIsBf16) { EXPECT_EQ(gpu().activation_dtype(), DType::BF16); }

// The fused decode kernel for the gated MLP's input side gives bit for bit
// what linear over the stacked weight followed by gated_activation gives. It
// takes one row (batch-1 decode); more rows go to cuBLAS, which beats the
// gemv from two rows on (kDenseGemvMaxRows), so the op declines them.
TEST_F(CudaBf16Test, GatedLinearEqualsLinearThenGatedActivation) {
  Rng rng(101);
  // [200, 512] takes 2 warps per output row (64 chunks per row), [2200, 2048] one (gemv_config).
  for (auto [k, f] : std::vector<std::pair<int64_t, int64_t>>{{512, 200}, {2048, 2200}}) {
    for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
      for (int64_t n : {1, 3, 4}) {
        SCOPED_TRACE(fmt::format("k={} f={} n={} act={}", k, f, n, static_cast<int>(act)));
        HostWeights w = random_weights(rng, DType::BF16, 2 * f, k);
        DeviceTensor gw = upload(gpu(), DType::BF16, {2 * f, k}, w.bytes.data());
        DeviceTensor gx = upload_bf16(gpu(), {n, k}, round_bf16(rng.floats(static_cast<size_t>(n * k))));
        DeviceTensor fused = zeros(gpu(), DType::BF16, {n, f});
        if (n > 1) {
          EXPECT_FALSE(ops::gated_linear(gpu(), gx.t, gw.t, act, fused.t)) << "more than one row is not fused";
          continue;
        }
        ASSERT_TRUE(ops::gated_linear(gpu(), gx.t, gw.t, act, fused.t)) << "a one-row product must be fused";
        DeviceTensor gate_up = zeros(gpu(), DType::BF16, {n, 2 * f});
        DeviceTensor act_out = zeros(gpu(), DType::BF16, {n, f});
        ops::linear(gpu(), gx.t, gw.t, Tensor(), gate_up.t);
        ops::gated_activation(gpu(), gate_up.t.narrow(1, 0, f), gate_up.t.narrow(1, f, f), act, act_out.t);
        EXPECT_EQ(download_any(gpu(), fused.t), download_any(gpu(), act_out.t));
      }
    }
  }
  // Batches past the decode kernel are left to the caller.
  DeviceTensor big = zeros(gpu(), DType::BF16, {64, 512});
  DeviceTensor gw = zeros(gpu(), DType::BF16, {400, 512});
  DeviceTensor out = zeros(gpu(), DType::BF16, {64, 200});
  EXPECT_FALSE(ops::gated_linear(gpu(), big.t, gw.t, Activation::Silu, out.t));
}

#ifdef DEEPINFER_HAS_CUDA
// The same for FP8 row-block weights: the shared-memory gemv with 8 gate and
// 8 up rows a CTA (launch_gemv_f8_glu; the backend uses it when
// DEEPINFER_GEMV_F8 picks a shared-memory configuration: by default one
// token tile takes the register kernel, faster at batch 1) gives for up to 8
// rows of x bit for bit what linear and gated_activation give.
TEST_F(CudaBf16Test, Fp8GatedLinearEqualsLinearThenGatedActivation) {
  Rng rng(108);
  void* stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  for (auto [k, f] : std::vector<std::pair<int64_t, int64_t>>{{512, 200}, {2048, 2200}, {1280, 24}}) {
    for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
      for (int64_t n : {1, 3, 8}) {
        SCOPED_TRACE(fmt::format("k={} f={} n={} act={}", k, f, n, static_cast<int>(act)));
        HostWeights w = random_weights(rng, DType::F8E4M3_B64, 2 * f, k);
        DeviceTensor gw = upload(gpu(), DType::F8E4M3_B64, {2 * f, k}, w.bytes.data());
        DeviceTensor gx = upload_bf16(gpu(), {n, k}, round_bf16(rng.floats(static_cast<size_t>(n * k))));
        DeviceTensor fused = zeros(gpu(), DType::BF16, {n, f});
        for (cuda::GemvF8Config config : {cuda::GemvF8Config{4, 512}, cuda::GemvF8Config{6, 512},
                                          cuda::GemvF8Config{4, 1024}}) {
          ASSERT_TRUE(cuda::launch_gemv_f8_glu(cuda::ElemType::BF16, static_cast<int>(n),
                                               static_cast<const char*>(gx.t.data()), gx.t.stride_bytes(0),
                                               static_cast<const char*>(gw.t.data()), gw.t.stride_bytes(0), f, k,
                                               act == Activation::GeluTanh, static_cast<char*>(fused.t.data()),
                                               fused.t.stride_bytes(0), stream, config));
          DeviceTensor gate_up = zeros(gpu(), DType::BF16, {n, 2 * f});
          DeviceTensor act_out = zeros(gpu(), DType::BF16, {n, f});
          ops::linear(gpu(), gx.t, gw.t, Tensor(), gate_up.t);
          ops::gated_activation(gpu(), gate_up.t.narrow(1, 0, f), gate_up.t.narrow(1, f, f), act, act_out.t);
          EXPECT_EQ(download_any(gpu(), fused.t), download_any(gpu(), act_out.t)) << config.stages << " stages";
        }
      }
    }
  }
  // More rows than one token tile are left to the caller.
  HostWeights w = random_weights(rng, DType::F8E4M3_B64, 48, 512);
  DeviceTensor gw = upload(gpu(), DType::F8E4M3_B64, {48, 512}, w.bytes.data());
  DeviceTensor gx = upload_bf16(gpu(), {9, 512}, round_bf16(rng.floats(9 * 512)));
  DeviceTensor out = zeros(gpu(), DType::BF16, {9, 24});
  EXPECT_FALSE(ops::gated_linear(gpu(), gx.t, gw.t, Activation::Silu, out.t)) << "more than 8 rows are not fused";
}
#endif

TEST_F(CudaBf16Test, Linear) {
  Rng rng(100);
  struct Case {
    int64_t n, k, m;
    bool bias;
  };
  // Decode shapes cover each gemv partition: 4 warps per row, 1 ([2200, 2048])
  // and 2 (an LM-head-like 65,536 rows of 64). FP8 row-block weights
  // (cuda_gemv_fp8.cu): the tensor-core FP8 gemv up to 64 rows (1-4 token
  // tiles per CTA, two CTAs on one weight tile at 64), dequantised chunks
  // through cuBLAS beyond (or, DEEPINFER_FP8_GEMM=1, the FP8 GEMM up to 256
  // rows, within the e4m3 rounding of its activations); checked against the
  // exact dequantised values.
  for (const Case& c : std::vector<Case>{{1, 4096, 1024, false}, {3, 256, 300, true}, {64, 512, 128, false},
                                         {257, 1024, 96, true}, {2, 2048, 2200, true}, {1, 64, 65536, false},
                                         {11, 1024, 200, true}, {20, 192, 40, false}, {33, 640, 24, true},
                                         {8, 1280, 40, true}, {100, 512, 136, true}}) {
    for (auto [w_type, out_type] : std::vector<std::pair<DType, DType>>{{DType::BF16, DType::BF16},
                                                                         {DType::BF16, DType::F32},
                                                                         {DType::F8E4M3_B64, DType::BF16},
                                                                         {DType::F8E4M3_B64, DType::F32}}) {
      SCOPED_TRACE(fmt::format("n={} k={} m={} bias={} weight={} out={}", c.n, c.k, c.m, c.bias, dtype_name(w_type),
                               dtype_name(out_type)));
      HostWeights w = random_weights(rng, w_type, c.m, c.k);
      std::vector<float> x = round_bf16(rng.floats(static_cast<size_t>(c.n * c.k)));
      std::vector<float> bias = rng.floats(static_cast<size_t>(c.m));
      DeviceTensor gw = upload(gpu(), w_type, {c.m, c.k}, w.bytes.data());
      DeviceTensor gx = upload_bf16(gpu(), {c.n, c.k}, x);
      DeviceTensor gb = upload_f32(gpu(), {c.m}, bias);
      DeviceTensor gout = zeros(gpu(), out_type, {c.n, c.m});
      ops::linear(gpu(), gx.t, gw.t, c.bias ? gb.t : Tensor(), gout.t);
      std::vector<float> got = download_any(gpu(), gout.t);
      for (int64_t i = 0; i < c.n; ++i) {
        for (int64_t j = 0; j < c.m; ++j) {
          double sum = c.bias ? bias[j] : 0.0, mag = 0.0;
          for (int64_t l = 0; l < c.k; ++l) {
            double p = double(x[i * c.k + l]) * w.values[j * c.k + l];
            sum += p;
            mag += std::abs(p);
          }
          // Past the FP8 gemv's 64 rows: the weights rounded to bf16 for cuBLAS,
          // or with DEEPINFER_FP8_GEMM=1 up to 256 rows the FP8 GEMM
          // (activations rounded to e4m3: at most 2^-4 of each product).
          const bool fp8 = w_type == DType::F8E4M3_B64;
          const bool rounded = out_type == DType::BF16 || (fp8 && c.n > 64);
          double tol = (rounded ? 4e-3 : 1e-4) * (std::abs(sum) + mag) + 1e-4;
          const char* fp8_gemm = std::getenv("DEEPINFER_FP8_GEMM");
          if (fp8 && c.n > 64 && c.n <= 256 && fp8_gemm != nullptr && std::string(fp8_gemm) == "1") {
            tol += 0.0625 * mag;
          }
          ASSERT_NEAR(got[i * c.m + j], sum, tol) << "row " << i << " col " << j;
        }
      }
    }
  }
}

#ifdef DEEPINFER_HAS_CUDA
// The FP8 gemv's kernels (the register kernel and each shared-memory
// configuration) give warp w the blocks b with b % 8 == w in increasing
// order and sum the warps in one order: their outputs agree to the bit, and
// with the exact dequantised product. Shapes: partial last stages (k =
// 1,280, 256), rows past a 16-row tile, the down projection's k, one to four
// token tiles and two CTAs on one weight tile (n = 40).
TEST_F(CudaBf16Test, Fp8GemvConfigsAgreeBitwise) {
  Rng rng(107);
  struct Case {
    int n;
    int64_t k, m;
  };
  void* stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  for (const Case& c : std::vector<Case>{{1, 4096, 1040}, {8, 1280, 40}, {5, 256, 33}, {3, 14336, 64}, {16, 512, 48},
                                         {27, 768, 24}, {40, 1024, 32}}) {
    SCOPED_TRACE(fmt::format("n={} k={} m={}", c.n, c.k, c.m));
    HostWeights w = random_weights(rng, DType::F8E4M3_B64, c.m, c.k);
    std::vector<float> x = round_bf16(rng.floats(static_cast<size_t>(c.n * c.k)));
    DeviceTensor gw = upload(gpu(), DType::F8E4M3_B64, {c.m, c.k}, w.bytes.data());
    DeviceTensor gx = upload_bf16(gpu(), {c.n, c.k}, x);
    std::vector<std::vector<float>> outs;
    for (cuda::GemvF8Config config : {cuda::GemvF8Config{0, 512}, cuda::GemvF8Config{4, 512},
                                      cuda::GemvF8Config{6, 512}, cuda::GemvF8Config{4, 1024}}) {
      DeviceTensor out = zeros(gpu(), DType::F32, {c.n, c.m});
      cuda::launch_gemv_f8(cuda::ElemType::BF16, c.n, static_cast<const char*>(gx.t.data()), gx.t.stride_bytes(0),
                           static_cast<const char*>(gw.t.data()), gw.t.stride_bytes(0), c.m, c.k, nullptr, true,
                           static_cast<char*>(out.t.data()), out.t.stride_bytes(0), stream, config);
      outs.push_back(download_any(gpu(), out.t));
    }
    for (size_t v = 1; v < outs.size(); ++v) ASSERT_EQ(outs[v], outs[0]) << "configuration " << v;
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t j = 0; j < c.m; ++j) {
        double sum = 0.0, mag = 0.0;
        for (int64_t l = 0; l < c.k; ++l) {
          const double p = double(x[i * c.k + l]) * w.values[j * c.k + l];
          sum += p;
          mag += std::abs(p);
        }
        ASSERT_NEAR(outs[0][i * c.m + j], sum, 1e-4 * (std::abs(sum) + mag) + 1e-4) << "row " << i << " col " << j;
      }
    }
  }
}
#endif

// Batched per-head products (MLA's absorbed projections): the one-launch
// gemv path (n <= 4) and the per-head fallback, against the CPU in f32.
TEST_F(CudaBf16Test, LinearBatched) {
  Rng rng(104);
  // W_UK's shape (k = 128: one warp per row) and W_UV's (k = 512: two).
  for (auto [k, m] : std::vector<std::pair<int64_t, int64_t>>{{128, 512}, {512, 128}}) {
    for (int64_t n : {1, 4, 11}) {
      const int64_t heads = 16, qk = k + 64;
      SCOPED_TRACE(fmt::format("n={} k={} m={}", n, k, m));
      std::vector<float> x = round_bf16(rng.floats(static_cast<size_t>(n * heads * qk)));
      std::vector<float> w = round_bf16(rng.floats(static_cast<size_t>(heads * m * k), -0.1f, 0.1f));
      DeviceTensor gx = upload_bf16(gpu(), {n, heads * qk}, x), cx = upload_f32(cpu(), {n, heads * qk}, x);
      DeviceTensor gw = upload_bf16(gpu(), {heads, m, k}, w), cw = upload_f32(cpu(), {heads, m, k}, w);
      DeviceTensor go = zeros(gpu(), DType::BF16, {n, heads, m}), co = zeros(cpu(), DType::F32, {n, heads, m});
      ops::linear_batched(gpu(), gx.t.split_last(heads, qk).narrow(2, 0, k), gw.t, go.t);
      ops::linear_batched(cpu(), cx.t.split_last(heads, qk).narrow(2, 0, k), cw.t, co.t);
      EXPECT_TRUE(all_close(download_any(gpu(), go.t), to_double(download_f32(cpu(), co.t)), 1e-2, 1e-2));
    }
  }
}

TEST_F(CudaBf16Test, NormsActivationsEmbedding) {
  Rng rng(101);
  // Widths cover the chunked kernels' warp splits (1/2/4/8 warps per row), a
  // width that is not whole 16-byte chunks and one past the chunked limit
  // (both take the scalar kernels); one row is the decode shape.
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {37, 128}, {37, 1000}, {37, 2048}, {1, 4096}, {37, 4096}, {3, 5120}, {37, 14336}, {2, 16392}}) {
    std::vector<float> x = round_bf16(rng.floats(static_cast<size_t>(rows * cols), -3, 3));
    std::vector<float> r = round_bf16(rng.floats(static_cast<size_t>(rows * cols), -3, 3));
    std::vector<float> w = rng.floats(static_cast<size_t>(cols));
    for (float offset : {0.0f, 1.0f}) {
      DeviceTensor gx = upload_bf16(gpu(), {rows, cols}, x), gr = upload_bf16(gpu(), {rows, cols}, r);
      DeviceTensor gw = upload_f32(gpu(), {cols}, w), gout = zeros(gpu(), DType::BF16, {rows, cols});
      DeviceTensor cx = upload_f32(cpu(), {rows, cols}, x), cr = upload_f32(cpu(), {rows, cols}, r);
      DeviceTensor cw = upload_f32(cpu(), {cols}, w), cout = zeros(cpu(), DType::F32, {rows, cols});
      ops::rms_norm(gpu(), gx.t, gw.t, 1e-6f, offset, gout.t);
      ops::rms_norm(cpu(), cx.t, cw.t, 1e-6f, offset, cout.t);
      EXPECT_TRUE(all_close(download_any(gpu(), gout.t), to_double(download_f32(cpu(), cout.t)), 1e-2, 1e-2));
      ops::add_rms_norm(gpu(), gr.t, gx.t, gw.t, 1e-6f, offset, gout.t);
      ops::add_rms_norm(cpu(), cr.t, cx.t, cw.t, 1e-6f, offset, cout.t);
      EXPECT_TRUE(all_close(download_any(gpu(), gr.t), to_double(download_f32(cpu(), cr.t)), 1e-2, 1e-2));
      EXPECT_TRUE(all_close(download_any(gpu(), gout.t), to_double(download_f32(cpu(), cout.t)), 2e-2, 2e-2));
    }
    for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
      DeviceTensor gg = upload_bf16(gpu(), {rows, cols}, x), gu = upload_bf16(gpu(), {rows, cols}, r);
      DeviceTensor go = zeros(gpu(), DType::BF16, {rows, cols});
      DeviceTensor cg = upload_f32(cpu(), {rows, cols}, x), cu = upload_f32(cpu(), {rows, cols}, r);
      DeviceTensor co = zeros(cpu(), DType::F32, {rows, cols});
      ops::gated_activation(gpu(), gg.t, gu.t, act, go.t);
      ops::gated_activation(cpu(), cg.t, cu.t, act, co.t);
      EXPECT_TRUE(all_close(download_any(gpu(), go.t), to_double(download_f32(cpu(), co.t)), 1e-2, 1e-2));
    }
    // Gate and up as the two halves of one fused row (strided views), and add.
    std::vector<float> fused_rows = round_bf16(rng.floats(static_cast<size_t>(rows * 2 * cols), -3, 3));
    DeviceTensor gf = upload_bf16(gpu(), {rows, 2 * cols}, fused_rows);
    DeviceTensor cf = upload_f32(cpu(), {rows, 2 * cols}, fused_rows);
    DeviceTensor go = zeros(gpu(), DType::BF16, {rows, cols});
    DeviceTensor co = zeros(cpu(), DType::F32, {rows, cols});
    ops::gated_activation(gpu(), gf.t.narrow(1, 0, cols), gf.t.narrow(1, cols, cols),
                          Activation::Silu, go.t);
    ops::gated_activation(cpu(), cf.t.narrow(1, 0, cols), cf.t.narrow(1, cols, cols),
                          Activation::Silu, co.t);
    EXPECT_TRUE(all_close(download_any(gpu(), go.t), to_double(download_f32(cpu(), co.t)), 1e-2, 1e-2));
    DeviceTensor ga = upload_bf16(gpu(), {rows, cols}, x), gb = upload_bf16(gpu(), {rows, cols}, r);
    DeviceTensor ca = upload_f32(cpu(), {rows, cols}, x), cb = upload_f32(cpu(), {rows, cols}, r);
    ops::add(gpu(), ga.t, gb.t, go.t);
    ops::add(cpu(), ca.t, cb.t, co.t);
    EXPECT_TRUE(all_close(download_any(gpu(), go.t), to_double(download_f32(cpu(), co.t)), 1e-2, 1e-2));
  }
  // Embedding of a bf16 table into bf16 activations is exact.
  HostWeights table = random_weights(rng, DType::BF16, 100, 64);
  DeviceTensor gt = upload(gpu(), DType::BF16, {100, 64}, table.bytes.data());
  std::vector<int32_t> ids = {5, 99, 0, 5};
  DeviceTensor gids = upload_i32(gpu(), ids);
  DeviceTensor gout = zeros(gpu(), DType::BF16, {4, 64});
  ops::embedding(gpu(), gt.t, gids.t, gout.t);
  std::vector<double> expected;
  for (int32_t id : ids) {
    for (int64_t c = 0; c < 64; ++c) expected.push_back(table.values[id * 64 + c]);
  }
  EXPECT_TRUE(all_close(download_any(gpu(), gout.t), expected, 0.0, 0.0));
}

TEST_F(CudaBf16Test, Rope) {
  Rng rng(102);
  for (RopeStyle style : {RopeStyle::Neox, RopeStyle::Interleaved}) {
    const int64_t n = 19, hq = 8, hkv = 2, d = 128;
    std::vector<float> q = round_bf16(rng.floats(static_cast<size_t>(n * hq * d)));
    std::vector<float> k = round_bf16(rng.floats(static_cast<size_t>(n * hkv * d)));
    std::vector<int32_t> pos(n);
    for (auto& p : pos) p = rng.uniform_int(0, 100000);
    std::vector<float> freq(d / 2);
    for (int i = 0; i < d / 2; ++i) freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / d));
    DeviceTensor gq = upload_bf16(gpu(), {n, hq, d}, q), gk = upload_bf16(gpu(), {n, hkv, d}, k);
    DeviceTensor cq = upload_f32(cpu(), {n, hq, d}, q), ck = upload_f32(cpu(), {n, hkv, d}, k);
    DeviceTensor gp = upload_i32(gpu(), pos), cp = upload_i32(cpu(), pos);
    DeviceTensor gf = upload_f32(gpu(), {d / 2}, freq), cf = upload_f32(cpu(), {d / 2}, freq);
    ops::rope(gpu(), gq.t, gk.t, gp.t, RopeParams{gf.t, static_cast<int>(d), style, 1.0f});
    ops::rope(cpu(), cq.t, ck.t, cp.t, RopeParams{cf.t, static_cast<int>(d), style, 1.0f});
    EXPECT_TRUE(all_close(download_any(gpu(), gq.t), to_double(download_f32(cpu(), cq.t)), 1e-2, 1e-2));
    EXPECT_TRUE(all_close(download_any(gpu(), gk.t), to_double(download_f32(cpu(), ck.t)), 1e-2, 1e-2));
  }
}

// The fused [q/k norm +] rope + KV store (one decode kernel) against the
// separate ops on the same backend, with full and partial rotary dims, both
// styles, GQA and padding tokens (slot -1). Without norms the results are
// identical bit for bit; with them the per-head sums of squares may round
// differently, so almost all values must be identical and all close.
TEST_F(CudaBf16Test, RopeStoreKvEqualsSeparateOps) {
  Rng rng(103);
  const int64_t n = 7, hq = 8, hkv = 2, d = 128, pages = 4, page_size = 16;
  for (bool with_norm : {false, true}) {
    for (RopeStyle style : {RopeStyle::Neox, RopeStyle::Interleaved}) {
      for (int64_t rotary : {d, d / 2}) {
        for (DType cache_type : {DType::BF16, DType::F8E4M3}) {
          SCOPED_TRACE(fmt::format("norm {} style {} rotary {} cache {}", with_norm, static_cast<int>(style), rotary,
                                   dtype_name(cache_type)));
          std::vector<float> q = round_bf16(rng.floats(static_cast<size_t>(n * hq * d)));
          std::vector<float> k = round_bf16(rng.floats(static_cast<size_t>(n * hkv * d)));
          std::vector<float> v = round_bf16(rng.floats(static_cast<size_t>(n * hkv * d)));
          std::vector<int32_t> pos(n), slots = {3, 17, -1, 40, 41, -1, 63};
          for (auto& p : pos) p = rng.uniform_int(0, 100000);
          std::vector<float> freq(static_cast<size_t>(rotary / 2));
          for (size_t i = 0; i < freq.size(); ++i) freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / rotary));
          DeviceTensor gp = upload_i32(gpu(), pos), gs = upload_i32(gpu(), slots);
          DeviceTensor gf = upload_f32(gpu(), {rotary / 2}, freq);
          DeviceTensor qw = upload_f32(gpu(), {d}, rng.floats(static_cast<size_t>(d)));
          DeviceTensor kw = upload_f32(gpu(), {d}, rng.floats(static_cast<size_t>(d)));
          const QkNorm norm{qw.t, kw.t, 1e-6f, rotary == d ? 0.0f : 1.0f};
          const RopeParams params{gf.t, static_cast<int>(rotary), style, 0.9f};
          std::vector<std::vector<float>> results[2];
          for (int fused = 0; fused < 2; ++fused) {
            DeviceTensor gq = upload_bf16(gpu(), {n, hq, d}, q), gk = upload_bf16(gpu(), {n, hkv, d}, k);
            DeviceTensor gv = upload_bf16(gpu(), {n, hkv, d}, v);
            DeviceTensor ck = zeros(gpu(), cache_type, {pages, page_size, hkv, d});
            DeviceTensor cv = zeros(gpu(), cache_type, {pages, page_size, hkv, d});
            const KvCacheLayer cache{ck.t, cv.t};
            if (fused) {
              ops::rope_store_kv(gpu(), gq.t, gk.t, gv.t, gp.t, params, gs.t, cache, with_norm ? &norm : nullptr);
            } else {
              if (with_norm) {
                ops::rms_norm(gpu(), gq.t, norm.q_weight, norm.eps, norm.weight_offset, gq.t);
                ops::rms_norm(gpu(), gk.t, norm.k_weight, norm.eps, norm.weight_offset, gk.t);
              }
              ops::rope(gpu(), gq.t, gk.t, gp.t, params);
              ops::store_kv(gpu(), gk.t, gv.t, gs.t, cache);
            }
            results[fused] = {download_any(gpu(), gq.t), download_any(gpu(), ck.t), download_any(gpu(), cv.t)};
          }
          for (size_t i = 0; i < 3; ++i) {
            if (!with_norm) {
              EXPECT_EQ(results[0][i], results[1][i]) << "tensor " << i;
              continue;
            }
            size_t same = 0;
            for (size_t j = 0; j < results[0][i].size(); ++j) same += results[0][i][j] == results[1][i][j];
            EXPECT_GE(same, results[0][i].size() * 99 / 100) << "tensor " << i;
            EXPECT_TRUE(all_close(results[1][i], to_double(results[0][i]), 1e-2, 1e-2)) << "tensor " << i;
          }
          EXPECT_NE(results[1][1], std::vector<float>(results[1][1].size(), 0.0f));  // something was stored
        }
      }
    }
  }
}

struct Seq {
  int q_len, kv_len;
};

// store_kv of every sequence's keys into a bf16 (or f16) paged cache, then
// attention, against the CPU backend on f32 copies of the same values. The
// inputs are bf16-rounded, so f16 holds them too. f16 is not an activation
// dtype of the CUDA backend, so that case calls the backend directly.
// With fp8_cache both backends store into an f8_e4m3 cache; the values
// round identically (the GPU converts the same bf16-representable values).
void compare_attention(Backend& gpu, Backend& cpu, Rng& rng, const std::vector<Seq>& seqs, int hkv, int group,
                       int d, int page_size, const AttentionParams& base, bool sinks,
                       DType gpu_type = DType::BF16, bool fp8_cache = false) {
  std::string lens;
  for (const Seq& s : seqs) lens += fmt::format(" {}/{}", s.q_len, s.kv_len);
  SCOPED_TRACE(fmt::format("hkv={} group={} d={} page={} window={} softcap={} sinks={} type={} fp8={} q/kv:{}", hkv,
                           group, d, page_size, base.sliding_window, base.logit_softcap, sinks, dtype_name(gpu_type),
                           fp8_cache, lens));
  const int64_t hq = int64_t{hkv} * group;
  const PagedLayout lay = random_paged_layout(rng, seqs, page_size);
  const int64_t n = lay.n, kv_total = lay.kv_total, num_pages = lay.num_pages;
  std::vector<float> k = round_bf16(rng.floats(static_cast<size_t>(kv_total * hkv * d)));
  std::vector<float> v = round_bf16(rng.floats(static_cast<size_t>(kv_total * hkv * d)));
  std::vector<float> q = round_bf16(rng.floats(static_cast<size_t>(n * hq * d), -2, 2));
  std::vector<float> sink_values = rng.floats(static_cast<size_t>(hq), -1, 2);

  auto run = [&](Backend& b, DType act) {
    auto up = [&](std::initializer_list<int64_t> shape, const std::vector<float>& x) {
      if (act == DType::F16) return upload_f16(b, shape, x);
      return act == DType::BF16 ? upload_bf16(b, shape, x) : upload_f32(b, shape, x);
    };
    DeviceTensor dk = up({kv_total, hkv, d}, k), dv = up({kv_total, hkv, d}, v), dq = up({n, hq, d}, q);
    const DType cache_type = fp8_cache ? DType::F8E4M3 : act;
    DeviceTensor ck = zeros(b, cache_type, {num_pages, page_size, hkv, d});
    DeviceTensor cv = zeros(b, cache_type, {num_pages, page_size, hkv, d});
    DeviceTensor dslots = upload_i32(b, lay.slots);
    KvCacheLayer cache{ck.t, cv.t};
    if (act == DType::F16) b.store_kv(dk.t, dv.t, dslots.t, cache);
    else ops::store_kv(b, dk.t, dv.t, dslots.t, cache);
    const DeviceMetadata dm = upload_metadata(b, lay);
    const AttentionMetadata& meta = dm.meta;
    DeviceTensor ds = upload_f32(b, {hq}, sink_values);
    AttentionParams params = base;
    if (sinks) params.sinks = ds.t;
    DeviceTensor out = zeros(b, act, {n, hq, d});
    if (act == DType::F16) b.attention(dq.t, cache, meta, params, out.t);
    else ops::attention(b, dq.t, cache, meta, params, out.t);
    return download_any(b, out.t);
  };
  std::vector<float> got = run(gpu, gpu_type);
  std::vector<float> want = run(cpu, DType::F32);
  EXPECT_TRUE(all_close(got, to_double(want), 2e-2, 2e-2));
}

TEST_F(CudaBf16Test, AttentionDecodeSplitKv) {
  Rng rng(103);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(128.0f);
  // Batch 1 with a long context: split across blocks and merged.
  compare_attention(gpu(), cpu(), rng, {{1, 3000}}, 8, 4, 128, 16, p, false);
  compare_attention(gpu(), cpu(), rng, {{1, 1500}, {1, 17}, {1, 600}}, 2, 4, 128, 32, p, true);
  AttentionParams w = p;
  w.sliding_window = 512;
  compare_attention(gpu(), cpu(), rng, {{1, 2000}, {1, 100}}, 4, 2, 128, 16, w, false);
  AttentionParams g;
  g.scale = 1.0f / 16.0f;
  g.logit_softcap = 50.0f;
  compare_attention(gpu(), cpu(), rng, {{1, 700}}, 1, 4, 256, 16, g, false);
}

TEST_F(CudaBf16Test, AttentionPrefillAndMixed) {
  Rng rng(104);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(128.0f);
  compare_attention(gpu(), cpu(), rng, {{300, 300}}, 2, 4, 128, 16, p, false);
  compare_attention(gpu(), cpu(), rng, {{100, 164}, {1, 50}, {37, 37}}, 2, 2, 64, 16, p, true);
  AttentionParams w = p;
  w.sliding_window = 64;
  w.logit_softcap = 30.0f;
  compare_attention(gpu(), cpu(), rng, {{200, 230}, {5, 9}}, 1, 8, 256, 32, w, false);
}

// The tensor-core kernels (bf16/f16, head 64/128/256): a batch that mixes
// decode rows, a short chunk, a block-sized chunk and a long prefill over
// the head sizes, GQA groups and page sizes (1 and 7 make a key tile span
// many pages, and pages that do not divide the tile).
TEST_F(CudaBf16Test, AttentionMmaSweep) {
  Rng rng(105);
  const std::vector<Seq> mixed = {{1, 1}, {15, 40}, {64, 64}, {300, 333}, {1, 257}};
  for (int d : {64, 128, 256}) {
    for (int group : {1, 4, 8}) {
      for (int page : {16, 1, 7}) {
        AttentionParams p;
        p.scale = 1.0f / std::sqrt(static_cast<float>(d));
        compare_attention(gpu(), cpu(), rng, mixed, 2, group, d, page, p, group == 4);
      }
    }
  }
}

TEST_F(CudaBf16Test, AttentionMmaWindowSoftcapSinks) {
  Rng rng(106);
  const std::vector<Seq> mixed = {{1, 90}, {15, 40}, {200, 260}, {3, 3}};
  for (int window : {0, 1, 37, 200}) {
    for (float softcap : {0.0f, 30.0f}) {
      for (bool sinks : {false, true}) {
        AttentionParams p;
        p.scale = 1.0f / std::sqrt(128.0f);
        p.sliding_window = window;
        p.logit_softcap = softcap;
        compare_attention(gpu(), cpu(), rng, mixed, 2, 4, 128, 16, p, sinks);
      }
    }
  }
}

// Few sequences with long contexts: the plan splits the keys, and the
// combine kernel merges the tensor-core kernel's partials. q_len * group up
// to 16 keeps the decode kernel (several query tokens in one block).
TEST_F(CudaBf16Test, AttentionMmaSplitKv) {
  Rng rng(107);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(128.0f);
  compare_attention(gpu(), cpu(), rng, {{1, 5000}}, 8, 4, 128, 16, p, false);
  compare_attention(gpu(), cpu(), rng, {{2, 3000}, {1, 100}}, 2, 8, 64, 7, p, true);
  compare_attention(gpu(), cpu(), rng, {{4, 2500}, {1, 1}}, 1, 1, 128, 1, p, false);
  AttentionParams w = p;
  w.sliding_window = 1000;
  compare_attention(gpu(), cpu(), rng, {{1, 4000}, {3, 2500}}, 2, 4, 128, 16, w, true);
  AttentionParams g;
  g.scale = 1.0f / 16.0f;
  g.logit_softcap = 50.0f;
  compare_attention(gpu(), cpu(), rng, {{1, 4000}}, 1, 2, 256, 16, g, true);
  // Prefill-shaped blocks with splits (one sequence, few heads).
  compare_attention(gpu(), cpu(), rng, {{40, 3000}}, 1, 4, 128, 16, p, false);
}

TEST_F(CudaBf16Test, AttentionF16) {
  Rng rng(108);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(128.0f);
  compare_attention(gpu(), cpu(), rng, {{1, 700}, {100, 150}, {7, 7}}, 2, 4, 128, 16, p, true, DType::F16);
  compare_attention(gpu(), cpu(), rng, {{1, 3000}}, 2, 4, 64, 16, p, false, DType::F16);
  AttentionParams w = p;
  w.sliding_window = 50;
  compare_attention(gpu(), cpu(), rng, {{120, 120}}, 1, 2, 256, 7, w, false, DType::F16);
}

// FP8 KV cache: the tensor-core kernels widen each landed e4m3 tile to bf16
// (f16) in shared memory, the SIMT kernel on load; against the CPU backend
// storing into its own FP8 cache.
TEST_F(CudaBf16Test, AttentionFp8Cache) {
  Rng rng(111);
  const std::vector<Seq> mixed = {{1, 1}, {15, 40}, {64, 64}, {300, 333}, {1, 257}};
  for (int d : {64, 128, 256}) {
    for (int group : {1, 4, 8}) {
      for (int page : {16, 7}) {
        AttentionParams p;
        p.scale = 1.0f / std::sqrt(static_cast<float>(d));
        compare_attention(gpu(), cpu(), rng, mixed, 2, group, d, page, p, group == 4, DType::BF16, true);
      }
    }
  }
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(128.0f);
  compare_attention(gpu(), cpu(), rng, {{1, 5000}}, 8, 4, 128, 16, p, false, DType::BF16, true);  // split-KV
  compare_attention(gpu(), cpu(), rng, {{4, 2500}, {1, 100}}, 2, 4, 128, 16, p, true, DType::BF16, true);
  compare_attention(gpu(), cpu(), rng, {{1, 700}, {100, 150}}, 2, 4, 128, 16, p, true, DType::F16, true);
  AttentionParams w = p;
  w.sliding_window = 37;
  w.logit_softcap = 30.0f;
  compare_attention(gpu(), cpu(), rng, {{1, 90}, {200, 260}}, 2, 4, 128, 16, w, true, DType::BF16, true);
  AttentionParams simt;  // head sizes outside the tensor-core set
  simt.scale = 1.0f / std::sqrt(96.0f);
  compare_attention(gpu(), cpu(), rng, {{1, 300}, {40, 60}}, 2, 4, 96, 16, simt, false, DType::BF16, true);
}

// With an FP8 cache the tensor-core kernels multiply in f16, so with f16
// activations the FP8 path differs from an f16 cache holding the same rounded
// values only in where K/V come from and in the order of the dims inside each
// 16-wide Q.K step (K's fragments are built from FP8 bytes): the outputs agree
// to f16 rounding (decode, split-KV and prefill shapes). bf16 activations use
// the same f16 products; the test above compares them with the CPU.
TEST_F(CudaBf16Test, AttentionFp8CacheMatchesF16CacheOfRoundedValues) {
  Rng rng(112);
  for (const std::vector<Seq>& seqs : {std::vector<Seq>{{1, 3000}}, std::vector<Seq>{{1, 70}, {130, 200}, {3, 9}}}) {
    const int64_t hkv = 2, group = 4, hq = hkv * group, d = 128, page_size = 16;
    const PagedLayout lay = random_paged_layout(rng, seqs, page_size);
    std::vector<float> k = round_to_fp8(rng.floats(static_cast<size_t>(lay.kv_total * hkv * d), -2, 2));
    std::vector<float> v = round_to_fp8(rng.floats(static_cast<size_t>(lay.kv_total * hkv * d), -2, 2));
    std::vector<float> q = round_to_fp8(rng.floats(static_cast<size_t>(lay.n * hq * d), -2, 2));  // exact in f16
    std::vector<float> outs[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      const DType cache_type = fp8 ? DType::F8E4M3 : DType::F16;
      DeviceTensor dk = upload_f16(gpu(), {lay.kv_total, hkv, d}, k);
      DeviceTensor dv = upload_f16(gpu(), {lay.kv_total, hkv, d}, v);
      DeviceTensor dq = upload_f16(gpu(), {lay.n, hq, d}, q);
      DeviceTensor ck = zeros(gpu(), cache_type, {lay.num_pages, page_size, hkv, d});
      DeviceTensor cv = zeros(gpu(), cache_type, {lay.num_pages, page_size, hkv, d});
      DeviceTensor dslots = upload_i32(gpu(), lay.slots);
      const KvCacheLayer cache{ck.t, cv.t};
      gpu().store_kv(dk.t, dv.t, dslots.t, cache);  // f16 is not the backend's activation type: no ops:: checks
      const DeviceMetadata dm = upload_metadata(gpu(), lay);
      AttentionParams params;
      params.scale = 1.0f / std::sqrt(128.0f);
      DeviceTensor out = zeros(gpu(), DType::F16, {lay.n, hq, d});
      gpu().attention(dq.t, cache, dm.meta, params, out.t);
      outs[fp8] = download_any(gpu(), out.t);
    }
    EXPECT_TRUE(all_close(outs[1], to_double(outs[0]), 2e-3, 2e-3));
    EXPECT_NE(outs[0], std::vector<float>(outs[0].size(), 0.0f));
  }
}

// Head sizes the tensor-core kernels do not cover stay on the SIMT kernel in bf16.
TEST_F(CudaBf16Test, AttentionSimtFallback) {
  Rng rng(109);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(80.0f);
  compare_attention(gpu(), cpu(), rng, {{1, 300}, {20, 50}}, 2, 4, 80, 16, p, true);
}

// Bad metadata reaches the tensor-core kernel (bf16, head 64) and is reported
// at the next synchronize, without reading outside the cache.
TEST_F(CudaBf16Test, AttentionMmaRejectsBadMetadata) {
  DeviceTensor q = upload_bf16(gpu(), {2, 4, 64}, std::vector<float>(2 * 4 * 64, 0.5f));
  DeviceTensor out = zeros(gpu(), DType::BF16, {2, 4, 64});
  DeviceTensor k = zeros(gpu(), DType::BF16, {3, 16, 2, 64}), v = zeros(gpu(), DType::BF16, {3, 16, 2, 64});
  DeviceTensor q_indptr = upload_i32(gpu(), {0, 2}), kv_indptr = upload_i32(gpu(), {0, 1});
  DeviceTensor bad_page = upload_i32(gpu(), {7}), good_page = upload_i32(gpu(), {1});
  DeviceTensor last = upload_i32(gpu(), {5}), too_short = upload_i32(gpu(), {1});
  AttentionMetadata meta;
  meta.num_seqs = 1;
  meta.max_q_len = 2;
  meta.max_kv_len = 5;
  meta.q_indptr = q_indptr.t;
  meta.kv_indptr = kv_indptr.t;
  meta.kv_page_indices = bad_page.t;
  meta.kv_last_page_len = last.t;
  auto run = [&] {
    ops::attention(gpu(), q.t, KvCacheLayer{k.t, v.t}, meta, {}, out.t);
    gpu().synchronize();
  };
  EXPECT_THROW(run(), Error);
  meta.kv_page_indices = good_page.t;
  EXPECT_NO_THROW(run());
  meta.kv_last_page_len = too_short.t;  // two queries but one key
  EXPECT_THROW(run(), Error);
}

}  // namespace
}  // namespace deepinfer::testing
