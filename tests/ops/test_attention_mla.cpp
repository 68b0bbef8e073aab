// Attention over an MLA latent cache (DeepSeek): one KV head whose rows hold
// [latent | rope part], V a view of each row's first latent channels, every
// query head sharing it. Checked against a naive double-precision reference
// over prefill, chunked-prefill and decode layouts; store_kv writes the row
// once. CUDA has no kernel for a value head smaller than the key head: there
// both ops must throw a clear error.
#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class LatentAttentionTest : public BackendTest {
 public:
  Backend& device() { return backend(); }
  // True (and the op checked to throw) where the backend has no latent-cache kernels.
  bool unsupported(const std::function<void()>& op) {
    if (backend().device().type == DeviceType::CPU) return false;
    try {
      op();
      backend().synchronize();
      ADD_FAILURE() << "expected a 'not supported' error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("not supported on CUDA yet"));
    }
    return true;
  }
};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(LatentAttentionTest);

struct Seq {
  int q_len, kv_len;
};

void run_latent(LatentAttentionTest& test, Rng& rng, int heads, int latent, int rope, int page_size,
                const std::vector<Seq>& seqs) {
  SCOPED_TRACE(fmt::format("heads={} latent={} rope={} page={} seqs={}", heads, latent, rope, page_size, seqs.size()));
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
  std::vector<float> q = rng.floats(static_cast<size_t>(n * heads * row));
  DeviceTensor dk = upload_f32(b, {num_pages, ps, 1, row}, cache);
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
  if (test.unsupported([&] { ops::attention(b, dq.t, layer, meta, params, dout.t); })) return;
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
  EXPECT_TRUE(all_close(download_f32(b, dout.t), expected, 1e-5, 1e-5));
}

TEST_P(LatentAttentionTest, MatchesNaiveReference) {
  Rng rng(31);
  // Prefill, chunked prefill (queries after cached keys) and batched decode.
  run_latent(*this, rng, 4, 32, 8, 16, {{19, 19}});
  run_latent(*this, rng, 4, 32, 8, 16, {{7, 40}, {3, 3}});
  run_latent(*this, rng, 16, 64, 16, 8, {{1, 1}, {1, 17}, {1, 33}});
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
  if (unsupported([&] { ops::store_kv(b, k, v, dslots.t, layer); })) return;
  ops::store_kv(b, k, v, dslots.t, layer);
  std::vector<double> expected(init.begin(), init.end());
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    for (int64_t d = 0; d < row; ++d) expected[static_cast<size_t>(slots[i] * row + d)] = rows[i * row + d];
  }
  EXPECT_TRUE(all_close(download_f32(b, cache.t), expected, 0.0, 0.0));

  // v must be k's own view when V lives inside K.
  DeviceTensor other = upload_f32(b, {n, 1, row}, rows);
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THAT(message([&] { ops::store_kv(b, k, other.t.narrow(2, 0, latent), dslots.t, layer); }),
              HasSubstr("v must be the matching view of k"));
  // The output's head size is V's, not K's.
  DeviceTensor q = zeros(b, DType::F32, {2, 4, row}), wrong = zeros(b, DType::F32, {2, 4, row});
  AttentionMetadata meta;
  EXPECT_THAT(message([&] { ops::attention(b, q.t, layer, meta, {}, wrong.t); }),
              HasSubstr("attention: out f32[2, 4, 20]"));
  const KvCacheLayer too_wide{cache.t.narrow(3, 0, latent), cache.t};
  EXPECT_THAT(message([&] { ops::attention(b, q.t, too_wide, meta, {}, wrong.t); }),
              HasSubstr("with a head size no larger"));
}

}  // namespace
}  // namespace deepinfer::testing
