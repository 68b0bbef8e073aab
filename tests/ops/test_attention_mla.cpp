// Attention over an MLA latent cache (DeepSeek): one KV head whose rows hold
// [latent | rope part], V a view of each row's first latent channels, every
// query head sharing it. On every backend (f32), against a naive
// double-precision reference over prefill, chunked-prefill and decode layouts;
// store_kv writes the row once. On CUDA also in bf16 and at DeepSeek's sizes
// (576-channel rows, 512-channel values, 16 and 128 heads; long split-KV
// decode), against the CPU backend on the same values (skipped without a GPU;
// bf16 tolerances as in test_cuda_bf16.cpp).
#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string>

#include "op_test_util.h"
#include "../support/error_message.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class LatentAttentionTest : public BackendTest {
 public:
  Backend& device() { return backend(); }
};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(LatentAttentionTest);

struct Seq {
  int q_len, kv_len;
};

// fp8: the latent cache holds f8_e4m3 (the reference reads the same rounded values).
void run_latent(LatentAttentionTest& test, Rng& rng, int heads, int latent, int rope, int page_size,
                const std::vector<Seq>& seqs, bool fp8 = false) {
  SCOPED_TRACE(fmt::format("heads={} latent={} rope={} page={} seqs={} fp8={}", heads, latent, rope, page_size,
                           seqs.size(), fp8));
  Backend& b = test.device();
  const int64_t row = latent + rope, ps = page_size;
  int64_t needed = 0;
  for (const Seq& s : seqs) needed += (s.kv_len + ps - 1) / ps;
  const int64_t num_pages = needed + 2;
  std::vector<int32_t> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng.gen());
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, page_ids, last_len;
  for (const Seq& s : seqs) {
    const int64_t pages = (s.kv_len + ps - 1) / ps;
    for (int64_t p = 0; p < pages; ++p) page_ids.push_back(pool[page_ids.size()]);
    q_indptr.push_back(q_indptr.back() + s.q_len);
    kv_indptr.push_back(static_cast<int32_t>(page_ids.size()));
    last_len.push_back(static_cast<int32_t>(s.kv_len - (pages - 1) * ps));
  }
  const int64_t n = q_indptr.back();
  std::vector<float> cache = rng.floats(static_cast<size_t>(num_pages * ps * row));
  if (fp8) cache = round_to_fp8(cache);
  std::vector<float> q = rng.floats(static_cast<size_t>(n * heads * row));
  DeviceTensor dk = fp8 ? upload_fp8(b, {num_pages, ps, 1, row}, cache) : upload_f32(b, {num_pages, ps, 1, row}, cache);
  DeviceTensor dq = upload_f32(b, {n, heads, row}, q);
  DeviceTensor dout = zeros(b, DType::F32, {n, heads, latent});
  DeviceTensor dq_indptr = upload_i32(b, q_indptr), dkv_indptr = upload_i32(b, kv_indptr);
  DeviceTensor dpages = upload_i32(b, page_ids), dlast = upload_i32(b, last_len);
  AttentionMetadata meta;
  meta.num_seqs = static_cast<int>(seqs.size());
  for (const Seq& s : seqs) {
    meta.max_q_len = std::max(meta.max_q_len, s.q_len);
    meta.max_kv_len = std::max(meta.max_kv_len, s.kv_len);
  }
  meta.q_indptr = dq_indptr.t;
  meta.kv_indptr = dkv_indptr.t;
  meta.kv_page_indices = dpages.t;
  meta.kv_last_page_len = dlast.t;
  AttentionParams params;
  params.scale = 0.3f;
  const KvCacheLayer layer{dk.t, dk.t.narrow(3, 0, latent)};
  ops::attention(b, dq.t, layer, meta, params, dout.t);

  std::vector<double> expected(static_cast<size_t>(n * heads * latent));
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int i = 0; i < seqs[s].q_len; ++i) {
      const int64_t t = q_indptr[s] + i, last = seqs[s].kv_len - seqs[s].q_len + i;
      for (int h = 0; h < heads; ++h) {
        const float* qv = &q[static_cast<size_t>((t * heads + h) * row)];
        std::vector<double> logits(static_cast<size_t>(last + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= last; ++j) {
          const int64_t page = page_ids[static_cast<size_t>(kv_indptr[s] + j / ps)];
          const float* kv = &cache[static_cast<size_t>((page * ps + j % ps) * row)];
          double dot = 0;
          for (int64_t d = 0; d < row; ++d) dot += double(qv[d]) * kv[d];
          logits[j] = dot * params.scale;
          mx = std::max(mx, logits[j]);
        }
        double* o = &expected[static_cast<size_t>((t * heads + h) * latent)];
        for (int64_t j = 0; j <= last; ++j) {
          const int64_t page = page_ids[static_cast<size_t>(kv_indptr[s] + j / ps)];
          const float* kv = &cache[static_cast<size_t>((page * ps + j % ps) * row)];
          const double w = std::exp(logits[j] - mx);
          sum += w;
          for (int d = 0; d < latent; ++d) o[d] += w * kv[d];
        }
        for (int d = 0; d < latent; ++d) o[d] /= sum;
      }
    }
  }
  EXPECT_TRUE(all_close(download_f32(b, dout.t), expected, 2e-5, 1e-4));
}

TEST_P(LatentAttentionTest, MatchesNaiveReference) {
  Rng rng(31);
  // Prefill, chunked prefill (queries after cached keys) and batched decode.
  run_latent(*this, rng, 4, 32, 8, 16, {{19, 19}});
  run_latent(*this, rng, 4, 32, 8, 16, {{7, 40}, {3, 3}});
  run_latent(*this, rng, 16, 64, 16, 8, {{1, 1}, {1, 17}, {1, 33}});
  // Sizes that are no multiple of 4 (scalar loads, unaligned value rows).
  run_latent(*this, rng, 3, 30, 6, 5, {{9, 12}, {1, 23}});
}

// The latent cache in FP8 (--kv-cache-dtype fp8 with DeepSeek models): the
// SIMT kernel (CUDA) and the CPU widen the rows exactly.
TEST_P(LatentAttentionTest, Fp8LatentCache) {
  Rng rng(33);
  run_latent(*this, rng, 4, 32, 8, 16, {{7, 40}, {3, 3}}, true);
  run_latent(*this, rng, 16, 64, 16, 8, {{1, 1}, {1, 17}, {1, 33}}, true);
  run_latent(*this, rng, 3, 30, 6, 5, {{9, 12}, {1, 23}}, true);
}

TEST_P(LatentAttentionTest, StoreKvWritesTheRowOnce) {
  Backend& b = backend();
  Rng rng(32);
  const int64_t latent = 16, rope = 4, row = latent + rope, ps = 8, pages = 3, n = 5;
  std::vector<float> rows = rng.floats(static_cast<size_t>(n * row));
  DeviceTensor dk = upload_f32(b, {n, 1, row}, rows);
  std::vector<float> init = rng.floats(static_cast<size_t>(pages * ps * row));
  DeviceTensor cache = upload_f32(b, {pages, ps, 1, row}, init);
  const std::vector<int32_t> slots = {3, 17, -1, 8, 0};
  DeviceTensor dslots = upload_i32(b, slots);
  const KvCacheLayer layer{cache.t, cache.t.narrow(3, 0, latent)};
  const Tensor k = dk.t, v = dk.t.narrow(2, 0, latent);
  ops::store_kv(b, k, v, dslots.t, layer);
  std::vector<double> expected(init.begin(), init.end());
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    for (int64_t d = 0; d < row; ++d) expected[static_cast<size_t>(slots[i] * row + d)] = rows[i * row + d];
  }
  EXPECT_TRUE(all_close(download_f32(b, cache.t), expected, 0.0, 0.0));

  // v must be k's own view when V lives inside K.
  DeviceTensor other = upload_f32(b, {n, 1, row}, rows);
  EXPECT_THAT(error_of([&] { ops::store_kv(b, k, other.t.narrow(2, 0, latent), dslots.t, layer); }),
              HasSubstr("v must be the matching view of k"));
  // The output's head size is V's, not K's.
  DeviceTensor q = zeros(b, DType::F32, {2, 4, row}), wrong = zeros(b, DType::F32, {2, 4, row});
  AttentionMetadata meta;
  EXPECT_THAT(error_of([&] { ops::attention(b, q.t, layer, meta, {}, wrong.t); }),
              HasSubstr("attention: out f32[2, 4, 20]"));
  const KvCacheLayer too_wide{cache.t.narrow(3, 0, latent), cache.t};
  EXPECT_THAT(error_of([&] { ops::attention(b, q.t, too_wide, meta, {}, wrong.t); }),
              HasSubstr("with a head size no larger"));
}


// CUDA against the CPU backend on the same values.
class LatentAttentionCudaTest : public CudaVsCpuTest {};

DeviceTensor upload_as(Backend& b, DType type, std::initializer_list<int64_t> shape, const std::vector<float>& v) {
  return type == DType::F32 ? upload_f32(b, shape, v) : upload_bf16(b, shape, v);
}

// store_kv of every sequence's rows into a latent cache, then attention: the
// GPU in `type` against the CPU in f32 on the same values (bf16-rounded when
// type is bf16). The partition (head tiles, split-KV) is the planner's choice
// for these shapes, as in a model.
void compare_latent(Backend& gpu, Backend& cpu, Rng& rng, int heads, int latent, int rope, int page_size,
                    const std::vector<Seq>& seqs, DType type) {
  std::string lens;
  for (const Seq& s : seqs) lens += fmt::format(" {}/{}", s.q_len, s.kv_len);
  SCOPED_TRACE(fmt::format("heads={} latent={} rope={} page={} type={} q/kv:{}", heads, latent, rope, page_size,
                           dtype_name(type), lens));
  const int64_t row = latent + rope, ps = page_size;
  const PagedLayout lay = random_paged_layout(rng, seqs, page_size);
  const int64_t n = lay.n, kv_total = lay.kv_total, num_pages = lay.num_pages;
  AttentionMetadata meta;
  meta.num_seqs = static_cast<int>(seqs.size());
  meta.max_q_len = lay.max_q;
  meta.max_kv_len = lay.max_kv;
  auto rounded = [&](std::vector<float> v) {
    if (type == DType::BF16) {
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    }
    return v;
  };
  const std::vector<float> rows = rounded(rng.floats(static_cast<size_t>(kv_total * row)));
  const std::vector<float> q = rounded(rng.floats(static_cast<size_t>(n * heads * row), -2, 2));
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(192.0f);  // DeepSeek's 1 / sqrt(nope + rope)

  auto run = [&](Backend& b, DType t) {
    DeviceTensor dk = upload_as(b, t, {kv_total, 1, row}, rows), dq = upload_as(b, t, {n, heads, row}, q);
    DeviceTensor cache = zeros(b, t, {num_pages, ps, 1, row});
    const KvCacheLayer layer{cache.t, cache.t.narrow(3, 0, latent)};
    DeviceTensor dslots = upload_i32(b, lay.slots);
    ops::store_kv(b, dk.t, dk.t.narrow(2, 0, latent), dslots.t, layer);
    DeviceTensor dqi = upload_i32(b, lay.q_indptr), dki = upload_i32(b, lay.kv_indptr), dp = upload_i32(b, lay.pages);
    DeviceTensor dl = upload_i32(b, lay.last);
    AttentionMetadata m = meta;
    m.q_indptr = dqi.t;
    m.kv_indptr = dki.t;
    m.kv_page_indices = dp.t;
    m.kv_last_page_len = dl.t;
    DeviceTensor out = zeros(b, t, {n, heads, latent});
    ops::attention(b, dq.t, layer, m, params, out.t);
    return download_any(b, out.t);
  };
  const std::vector<float> got = run(gpu, type);
  const std::vector<float> want = run(cpu, DType::F32);
  const std::vector<double> expected(want.begin(), want.end());
  if (type == DType::BF16) {
    EXPECT_TRUE(all_close(got, expected, 2e-2, 2e-2));
  } else {
    EXPECT_TRUE(all_close(got, expected, 2e-5, 1e-4));
  }
}

TEST_F(LatentAttentionCudaTest, DeepseekSizesDecode) {
  Rng rng(33);
  for (DType type : {DType::F32, DType::BF16}) {
    // DeepSeek-V2-Lite (16 heads) and V3 (128 heads, in head tiles); kv_lora 512 + rope 64.
    compare_latent(gpu(), cpu(), rng, 16, 512, 64, 16, {{1, 200}, {1, 37}, {1, 1}}, type);
    compare_latent(gpu(), cpu(), rng, 128, 512, 64, 64, {{1, 300}, {1, 5}}, type);
  }
}

TEST_F(LatentAttentionCudaTest, DeepseekSizesSplitKvDecode) {
  Rng rng(34);
  for (DType type : {DType::F32, DType::BF16}) {
    compare_latent(gpu(), cpu(), rng, 16, 512, 64, 16, {{1, 3000}}, type);
    compare_latent(gpu(), cpu(), rng, 16, 512, 64, 64, {{1, 2500}, {1, 100}, {2, 700}}, type);
  }
}

TEST_F(LatentAttentionCudaTest, DeepseekSizesPrefill) {
  Rng rng(35);
  for (DType type : {DType::F32, DType::BF16}) {
    compare_latent(gpu(), cpu(), rng, 16, 512, 64, 16, {{64, 64}}, type);
    compare_latent(gpu(), cpu(), rng, 16, 512, 64, 16, {{20, 90}, {1, 33}, {13, 13}}, type);
  }
}

TEST_F(LatentAttentionCudaTest, SmallAndUnalignedSizes) {
  Rng rng(36);
  for (DType type : {DType::F32, DType::BF16}) {
    compare_latent(gpu(), cpu(), rng, 4, 32, 8, 16, {{19, 19}, {1, 40}}, type);
    compare_latent(gpu(), cpu(), rng, 3, 30, 6, 5, {{9, 12}, {1, 700}}, type);
  }
}

}  // namespace
}  // namespace deepinfer::testing
