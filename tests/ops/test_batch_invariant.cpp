// Batch invariance of the ops a model step runs (DEEPINFER_BATCH_INVARIANT=1,
// BackendOptions::batch_invariant), on every backend: a row's result must be
// the same bits whatever else is in the batch — how many rows, where the row
// sits, whether its sequence is decoding alone, beside a prefill, or is the
// last row of a chunk or of a whole prompt, and however long the batch's
// longest sequence is (split-KV). The results are also checked against a
// double-precision reference, so invariance is not bought with wrong sums.
#include <cmath>
#include <numeric>

#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

// A cache layout the attention test runs: head size, the cache's dtype, sinks.
struct AttentionCacheCase {
  int64_t d;
  bool fp8_cache;
  bool sinks;
};

class BatchInvariantTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.num_threads = GetParam().num_threads;
    options.batch_invariant = true;
    backend_ = create_backend(GetParam().type, options);
  }
  Backend& backend() { return *backend_; }
  // The activations' dtype a model runs with: 16-bit on a GPU, f32 on the CPU.
  DType act_dtype() const { return GetParam().type == DeviceType::CUDA ? DType::BF16 : DType::F32; }
  DeviceTensor upload_act(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    return act_dtype() == DType::BF16 ? upload_bf16(backend(), shape, v) : upload_f32(backend(), shape, v);
  }
  // The attention rows' check for one cache layout (AnAttentionRowIsTheSameBitsInEveryBatch).
  void check_attention_row(const AttentionCacheCase& cc);

 private:
  std::unique_ptr<Backend> backend_;
};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(BatchInvariantTest);

TEST_P(BatchInvariantTest, ALinearRowIsTheSameBitsInEveryBatch) {
  Rng rng(11);
  const int64_t rows = 300, k = 512, m = 264;  // m: partial column tiles
  HostWeights w = random_weights(rng, DType::BF16, m, k);
  const std::vector<float> x = rng.floats(static_cast<size_t>(rows * k));
  const std::vector<float> bias = rng.floats(static_cast<size_t>(m));
  DeviceTensor dw = upload(backend(), DType::BF16, {m, k}, w.bytes.data());
  DeviceTensor dx = upload_act({rows, k}, x);
  DeviceTensor db = upload_f32(backend(), {m}, bias);
  DeviceTensor full = zeros(backend(), act_dtype(), {rows, m});
  ops::linear(backend(), dx.t, dw.t, db.t, full.t);
  const std::vector<float> all = download_any(backend(), full.t);
  // Against the reference (x as the device holds it, bf16 on a GPU).
  const std::vector<float> x_held = download_any(backend(), dx.t);
  for (int64_t i = 0; i < rows; i += 37) {
    for (int64_t j = 0; j < m; ++j) {
      double sum = bias[static_cast<size_t>(j)], mag = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const double p =
            static_cast<double>(x_held[static_cast<size_t>(i * k + l)]) * w.values[static_cast<size_t>(j * k + l)];
        sum += p;
        mag += std::abs(p);
      }
      ASSERT_NEAR(all[static_cast<size_t>(i * m + j)], sum, 1e-2 * mag + 1e-3) << i << "," << j;
    }
  }
  for (const int64_t n : {1, 2, 15, 16, 17, 33, 64, 65, 129, 299}) {
    for (const int64_t at : {int64_t{0}, int64_t{7}, rows - n}) {
      if (at + n > rows) continue;
      DeviceTensor part = zeros(backend(), act_dtype(), {n, m});
      ops::linear(backend(), dx.t.narrow(0, at, n), dw.t, db.t, part.t);
      const std::vector<float> got = download_any(backend(), part.t);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          ASSERT_EQ(got[static_cast<size_t>(i * m + j)], all[static_cast<size_t>((at + i) * m + j)])
              << n << " rows from " << at << ": row " << i << " col " << j;
        }
      }
    }
  }
}

// A gated MLP's gate-up product with its activation fused (CUDA: in the
// GEMM's epilogue) is the same bits as the linear followed by the
// activation, in every batch.
TEST_P(BatchInvariantTest, AGatedLinearRowIsTheSameBitsAsLinearThenActivation) {
  Rng rng(19);
  const int64_t rows = 300, k = 1096, f = 264;  // rows: every CUDA tile config of the fused product
  HostWeights w = random_weights(rng, DType::BF16, 2 * f, k);
  const std::vector<float> x = rng.floats(static_cast<size_t>(rows * k));
  DeviceTensor dw = upload(backend(), DType::BF16, {2 * f, k}, w.bytes.data());
  for (const Activation act : {Activation::Silu, Activation::GeluTanh}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{33}, int64_t{129}, rows}) {
      DeviceTensor dx = upload_act({n, k}, std::vector<float>(x.begin(), x.begin() + n * k));
      DeviceTensor fused = zeros(backend(), act_dtype(), {n, f});
      if (!ops::gated_linear(backend(), dx.t, dw.t, act, fused.t)) {
        GTEST_SKIP() << "this backend has no fused gated product in the mode";
      }
      DeviceTensor gate_up = zeros(backend(), act_dtype(), {n, 2 * f});
      DeviceTensor plain = zeros(backend(), act_dtype(), {n, f});
      ops::linear(backend(), dx.t, dw.t, Tensor(), gate_up.t);
      ops::gated_activation(backend(), gate_up.t.narrow(1, 0, f), gate_up.t.narrow(1, f, f), act, plain.t);
      const std::vector<float> a = download_any(backend(), fused.t), b = download_any(backend(), plain.t);
      for (size_t e = 0; e < a.size(); ++e) {
        ASSERT_EQ(a[e], b[e]) << n << " rows, activation " << static_cast<int>(act) << ": element " << e;
      }
    }
  }
}

TEST_P(BatchInvariantTest, ANormalisedRowIsTheSameBitsInEveryBatch) {
  Rng rng(13);
  const int64_t rows = 100, h = 4096;
  const std::vector<float> x = rng.floats(static_cast<size_t>(rows * h));
  const std::vector<float> res = rng.floats(static_cast<size_t>(rows * h));
  const std::vector<float> w = rng.floats(static_cast<size_t>(h), 0.5f, 1.5f);
  DeviceTensor dw = upload_f32(backend(), {h}, w);
  for (const bool add : {false, true}) {
    auto norm = [&](int64_t at, int64_t n) {
      DeviceTensor dx = upload_act({n, h}, std::vector<float>(x.begin() + at * h, x.begin() + (at + n) * h));
      DeviceTensor dr = upload_act({n, h}, std::vector<float>(res.begin() + at * h, res.begin() + (at + n) * h));
      DeviceTensor out = zeros(backend(), act_dtype(), {n, h});
      if (add) {
        ops::add_rms_norm(backend(), dr.t, dx.t, dw.t, 1e-6f, 0.0f, out.t);
      } else {
        ops::rms_norm(backend(), dx.t, dw.t, 1e-6f, 0.0f, out.t);
      }
      return download_any(backend(), out.t);
    };
    const std::vector<float> all = norm(0, rows);
    for (const int64_t n : {1, 3, 63, 64}) {
      const int64_t at = rows - n;
      const std::vector<float> got = norm(at, n);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], all[static_cast<size_t>(at * h) + i]) << (add ? "add_rms_norm" : "rms_norm") << ", " << n
                                                                << " rows: element " << i;
      }
    }
  }
}

// A token's MoE output row is the same bits in every batch: CUDA's grouped
// GEMMs with row tiles of 16, 32 and 64 (by the number of (token, choice)
// slots), one to two real rows a tile or many; hidden and ffn leave a
// partial last k16 step and partial column tiles. Accumulating onto the
// output, as a shared expert's sum is. Token 0's row is also checked against
// a double-precision reference.
TEST_P(BatchInvariantTest, AnExpertRowIsTheSameBitsInEveryBatch) {
  Rng rng(23);
  const int64_t tokens = 80, hidden = 264, ffn = 200, n_experts = 12;
  const int top_k = 4;
  const HostWeights gate = random_weights(rng, DType::BF16, n_experts * ffn, hidden);
  const HostWeights up = random_weights(rng, DType::BF16, n_experts * ffn, hidden);
  const HostWeights down = random_weights(rng, DType::BF16, n_experts * hidden, ffn);
  DeviceTensor dgate = upload(backend(), DType::BF16, {n_experts, ffn, hidden}, gate.bytes.data());
  DeviceTensor dup = upload(backend(), DType::BF16, {n_experts, ffn, hidden}, up.bytes.data());
  DeviceTensor ddown = upload(backend(), DType::BF16, {n_experts, hidden, ffn}, down.bytes.data());
  MoeExpertWeights w;
  w.gate = dgate.t;
  w.up = dup.t;
  w.down = ddown.t;
  const std::vector<float> x = rng.floats(static_cast<size_t>(tokens * hidden));
  const std::vector<float> base = rng.floats(x.size());
  const std::vector<int32_t> ids = draw_expert_ids(rng, tokens, n_experts, top_k);
  const std::vector<float> route = rng.floats(ids.size(), 0.0f, 1.0f);
  // Tokens [at, at + n) as one batch: their output rows.
  auto run = [&](int64_t at, int64_t n) {
    DeviceTensor dx = upload_act({n, hidden}, std::vector<float>(x.begin() + at * hidden, x.begin() + (at + n) * hidden));
    DeviceTensor out = upload_act({n, hidden}, std::vector<float>(base.begin() + at * hidden,
                                                                  base.begin() + (at + n) * hidden));
    std::vector<int32_t> part_ids(ids.begin() + at * top_k, ids.begin() + (at + n) * top_k);
    DeviceTensor did = upload(backend(), DType::I32, {n, top_k}, part_ids.data());
    DeviceTensor droute = upload_f32(backend(), {n, top_k}, std::vector<float>(route.begin() + at * top_k,
                                                                               route.begin() + (at + n) * top_k));
    Buffer ws_buf(backend(), ops::moe_workspace_bytes(backend(), n, top_k, w));
    Tensor ws = ws_buf.view(DType::U8, {static_cast<int64_t>(ws_buf.size())});
    ops::moe_experts(backend(), dx.t, did.t, droute.t, w, Activation::Silu, true, ws, out.t);
    return download_any(backend(), out.t);
  };
  const std::vector<float> all = run(0, tokens);
  {
    // Token 0 in double precision, from the inputs as the device holds them.
    DeviceTensor dx = upload_act({1, hidden}, std::vector<float>(x.begin(), x.begin() + hidden));
    DeviceTensor dbase = upload_act({1, hidden}, std::vector<float>(base.begin(), base.begin() + hidden));
    const std::vector<float> x0 = download_any(backend(), dx.t), b0 = download_any(backend(), dbase.t);
    // mag: the sum of the products' magnitudes, which bounds the rounding of
    // act(gate) * up (bf16 on a GPU) carried into the sums.
    std::vector<double> want(b0.begin(), b0.end()), mag(static_cast<size_t>(hidden), 0.0);
    for (int j = 0; j < top_k; ++j) {
      const int64_t e = ids[static_cast<size_t>(j)];
      std::vector<double> h(static_cast<size_t>(ffn));
      for (int64_t f = 0; f < ffn; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < hidden; ++i) {
          g += x0[static_cast<size_t>(i)] * gate.values[static_cast<size_t>((e * ffn + f) * hidden + i)];
          u += x0[static_cast<size_t>(i)] * up.values[static_cast<size_t>((e * ffn + f) * hidden + i)];
        }
        h[static_cast<size_t>(f)] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t i = 0; i < hidden; ++i) {
        double y = 0;
        for (int64_t f = 0; f < ffn; ++f) {
          y += h[static_cast<size_t>(f)] * down.values[static_cast<size_t>((e * hidden + i) * ffn + f)];
        }
        double m = 0;
        for (int64_t f = 0; f < ffn; ++f) {
          m += std::abs(h[static_cast<size_t>(f)] * down.values[static_cast<size_t>((e * hidden + i) * ffn + f)]);
        }
        want[static_cast<size_t>(i)] += route[static_cast<size_t>(j)] * y;
        mag[static_cast<size_t>(i)] += route[static_cast<size_t>(j)] * m;
      }
    }
    for (int64_t i = 0; i < hidden; ++i) {
      const size_t e = static_cast<size_t>(i);
      ASSERT_NEAR(all[e], want[e], 1e-2 * (std::abs(want[e]) + mag[e]) + 1e-3) << "element " << i;
    }
  }
  for (const int64_t n : {1, 3, 16, 17, 40}) {
    for (const int64_t at : {int64_t{0}, tokens - n}) {
      const std::vector<float> got = run(at, n);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], all[static_cast<size_t>(at * hidden) + i])
            << n << " tokens from " << at << ": token " << i / hidden << " element " << i % hidden;
      }
    }
  }
}

// One attention call over sequences given as (queries, keys); sequence
// `target` is always the same cache pages and its last query row the same q.
struct AttentionRun {
  std::vector<std::pair<int, int>> seqs;  // (q_len, kv_len)
  int target = 0;
};

TEST_P(BatchInvariantTest, AnAttentionRowIsTheSameBitsInEveryBatch) {
  // bf16 (f32 on the CPU) at 128- and 256-wide heads; an FP8 cache at 64-wide heads with attention sinks.
  for (const AttentionCacheCase cc : {AttentionCacheCase{128, false, false}, AttentionCacheCase{256, false, false},
                                      AttentionCacheCase{64, true, true}}) {
    SCOPED_TRACE(fmt::format("head size {}, fp8 cache {}, sinks {}", cc.d, cc.fp8_cache, cc.sinks));
    check_attention_row(cc);
    if (HasFatalFailure()) return;
  }
}

void BatchInvariantTest::check_attention_row(const AttentionCacheCase& cc) {
  Rng rng(12);
  const int64_t hkv = 2, group = 4, hq = hkv * group, d = cc.d, ps = 16;
  const int target_len = 2000;  // long enough that a lone decode would split its keys
  const int64_t target_pages = (target_len + ps - 1) / ps;
  const int64_t other_pages = 160;  // room for the other sequences of a run (up to 2560 keys)
  const int64_t num_pages = target_pages + other_pages;
  const size_t cache_elems = static_cast<size_t>(num_pages * ps * hkv * d);
  const std::vector<float> kc = rng.floats(cache_elems), vc = rng.floats(cache_elems);
  DeviceTensor dk = cc.fp8_cache ? upload_fp8(backend(), {num_pages, ps, hkv, d}, kc) : upload_act({num_pages, ps, hkv, d}, kc);
  DeviceTensor dv = cc.fp8_cache ? upload_fp8(backend(), {num_pages, ps, hkv, d}, vc) : upload_act({num_pages, ps, hkv, d}, vc);
  const std::vector<float> sinks = rng.floats(static_cast<size_t>(hq), -1.0f, 2.0f);
  DeviceTensor dsinks = upload_f32(backend(), {hq}, sinks);
  const std::vector<float> target_q = rng.floats(static_cast<size_t>(hq * d));

  std::vector<AttentionRun> runs = {
      {{{1, target_len}}, 0},                                // decoding alone
      {{{57, 57}, {1, target_len}, {1, 20}}, 1},             // beside a prefill and another decode
      {{{9, target_len}}, 0},                                // the last row of a chunk
      {{{3, 40}, {target_len, target_len}}, 1},              // the last row of the whole prompt
      {{{1, 300}, {1, 1000}, {1, target_len}, {2, 30}}, 2},  // a decode batch
  };
  // A decode batch of enough sequences to fill a GPU's SMs with blocks
  // (CUDA: 160 blocks, which the mode's split-dims decode kernel takes).
  AttentionRun wide{{{1, target_len}}, 0};
  for (int s = 1; s < 80; ++s) wide.seqs.emplace_back(1, 20 + s % 7);
  runs.push_back(wide);
  for (const int window : {0, 700}) {  // full attention, and a sliding window
    SCOPED_TRACE(window);
    std::vector<float> first;
    for (size_t r = 0; r < runs.size(); ++r) {
      const AttentionRun& run = runs[r];
      std::vector<int32_t> q_indptr{0}, kv_indptr{0}, pages, last_len, start_pos;
      int64_t next_other = target_pages;
      int max_q = 0, max_kv = 0;
      for (size_t s = 0; s < run.seqs.size(); ++s) {
        const auto [q_len, kv_len] = run.seqs[s];
        const int64_t n_pages = (kv_len + ps - 1) / ps;
        for (int64_t p = 0; p < n_pages; ++p) {
          pages.push_back(static_cast<int32_t>(static_cast<int>(s) == run.target ? p : next_other++));
        }
        ASSERT_LE(next_other, num_pages);
        q_indptr.push_back(q_indptr.back() + q_len);
        kv_indptr.push_back(static_cast<int32_t>(pages.size()));
        last_len.push_back(static_cast<int32_t>(kv_len - (n_pages - 1) * ps));
        start_pos.push_back(0);
        max_q = std::max(max_q, q_len);
        max_kv = std::max(max_kv, kv_len);
      }
      const int64_t n = q_indptr.back();
      std::vector<float> q = rng.floats(static_cast<size_t>(n * hq * d));
      const int64_t target_row = q_indptr[static_cast<size_t>(run.target) + 1] - 1;
      std::copy(target_q.begin(), target_q.end(), q.begin() + target_row * hq * d);
      DeviceTensor dq = upload_act({n, hq, d}, q), dout = zeros(backend(), act_dtype(), {n, hq, d});
      DeviceTensor dqi = upload_i32(backend(), q_indptr), dkvi = upload_i32(backend(), kv_indptr);
      DeviceTensor dpages = upload_i32(backend(), pages), dlast = upload_i32(backend(), last_len);
      DeviceTensor dstart = upload_i32(backend(), start_pos);
      AttentionMetadata meta;
      meta.num_seqs = static_cast<int>(run.seqs.size());
      meta.max_q_len = max_q;
      meta.max_kv_len = max_kv;
      meta.q_indptr = dqi.t;
      meta.kv_indptr = dkvi.t;
      meta.kv_page_indices = dpages.t;
      meta.kv_last_page_len = dlast.t;
      meta.kv_start_pos = dstart.t;
      AttentionParams params;
      params.scale = 1.0f / std::sqrt(static_cast<float>(d));
      params.sliding_window = window;
      if (cc.sinks) params.sinks = dsinks.t;
      ops::attention(backend(), dq.t, KvCacheLayer{dk.t, dv.t}, meta, params, dout.t);
      const std::vector<float> out = download_any(backend(), dout.t.narrow(0, target_row, 1));
      if (r == 0) {
        first = out;
        if (window > 0) continue;
        // Against the reference for head 0 (the cache and q as the device holds them).
        const std::vector<float> k_held = download_any(backend(), dk.t), v_held = download_any(backend(), dv.t);
        const std::vector<float> q_held = download_any(backend(), dq.t.narrow(0, target_row, 1));
        std::vector<double> logits(target_len);
        double mx = -INFINITY;
        for (int j = 0; j < target_len; ++j) {
          const size_t at = static_cast<size_t>((j * hkv + 0) * d);  // pages 0.. hold the target in order
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(q_held[static_cast<size_t>(e)]) * k_held[at + e];
          logits[static_cast<size_t>(j)] = dot * params.scale;
          mx = std::max(mx, logits[static_cast<size_t>(j)]);
        }
        const double sink = cc.sinks ? static_cast<double>(sinks[0]) : -INFINITY;
        mx = std::max(mx, sink);
        double denom = cc.sinks ? std::exp(sink - mx) : 0.0;
        for (double l : logits) denom += std::exp(l - mx);
        for (int64_t e = 0; e < d; e += 9) {
          double o = 0;
          for (int j = 0; j < target_len; ++j) {
            o += std::exp(logits[static_cast<size_t>(j)] - mx) / denom * v_held[static_cast<size_t>((j * hkv) * d + e)];
          }
          ASSERT_NEAR(out[static_cast<size_t>(e)], o, 2e-2) << "dim " << e;
        }
        continue;
      }
      ASSERT_EQ(out.size(), first.size());
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], first[i]) << "run " << r << " element " << i;
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
