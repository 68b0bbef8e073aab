// rope, store_kv and paged attention against naive references: attention
// materialises each sequence's full score matrix with explicit causal and
// sliding-window masks, in double precision.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "op_test_util.h"
#include "core/fp8.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

class AttentionTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(AttentionTest);

std::vector<float> inv_freqs(int rotary_dim, double base) {
  std::vector<float> f(static_cast<size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) f[i] = static_cast<float>(std::pow(base, -2.0 * i / rotary_dim));
  return f;
}

TEST_P(AttentionTest, Rope) {
  Rng rng(20);
  for (RopeStyle style : {RopeStyle::Neox, RopeStyle::Interleaved}) {
    for (int head_dim : {64, 128}) {
      for (int rotary_dim : {head_dim, head_dim / 2}) {
        for (float factor : {1.0f, 1.25f}) {
          for (bool with_k : {true, false}) {
            SCOPED_TRACE(fmt::format("style={} head_dim={} rotary_dim={} factor={} k={}", static_cast<int>(style),
                                     head_dim, rotary_dim, factor, with_k));
            const int64_t n = 7, hq = 6, hkv = 2, heads = hq + 2 * hkv;
            std::vector<float> qkv = rng.floats(static_cast<size_t>(n * heads * head_dim));
            DeviceTensor dqkv = upload_f32(backend(), {n, heads, head_dim}, qkv);
            std::vector<int32_t> pos(n);
            for (auto& p : pos) p = rng.uniform_int(0, 4096);
            pos[0] = 0;
            DeviceTensor dpos = upload_i32(backend(), pos);
            std::vector<float> freq = inv_freqs(rotary_dim, 10000.0);
            DeviceTensor dfreq = upload_f32(backend(), {rotary_dim / 2}, freq);
            RopeParams params{dfreq.t, rotary_dim, style, factor};
            Tensor q = dqkv.t.narrow(1, 0, hq), k = dqkv.t.narrow(1, hq, hkv);
            ops::rope(backend(), q, with_k ? k : Tensor(), dpos.t, params);

            std::vector<double> expected(qkv.begin(), qkv.end());
            int64_t rotated_heads = with_k ? hq + hkv : hq;
            int half = rotary_dim / 2;
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t h = 0; h < rotated_heads; ++h) {
                double* v = &expected[static_cast<size_t>((t * heads + h) * head_dim)];
                for (int i = 0; i < half; ++i) {
                  // The angle as Hugging Face forms it: an f32 product.
                  double angle = static_cast<float>(pos[t]) * freq[i];
                  double c = std::cos(angle) * factor, s = std::sin(angle) * factor;
                  int a = style == RopeStyle::Neox ? i : 2 * i;
                  int b = style == RopeStyle::Neox ? i + half : 2 * i + 1;
                  double x0 = v[a], x1 = v[b];
                  v[a] = x0 * c - x1 * s;
                  v[b] = x0 * s + x1 * c;
                }
              }
            }
            EXPECT_TRUE(all_close(download_f32(backend(), dqkv.t), expected, 1e-5, 1e-5));
          }
        }
      }
    }
  }
}

TEST_P(AttentionTest, StoreKv) {
  Rng rng(21);
  for (int page_size : {16, 32}) {
    const int64_t n = 10, hkv = 3, head_dim = 64, num_pages = 4, heads = 1 + 2 * hkv;
    std::vector<float> kv = rng.floats(static_cast<size_t>(n * heads * head_dim));
    DeviceTensor dkv = upload_f32(backend(), {n, heads, head_dim}, kv);
    Tensor k = dkv.t.narrow(1, 1, hkv), v = dkv.t.narrow(1, 1 + hkv, hkv);
    std::vector<int32_t> all(static_cast<size_t>(num_pages * page_size));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.gen());
    std::vector<int32_t> slots(all.begin(), all.begin() + n);
    slots[4] = -1;  // a padding token
    DeviceTensor dslots = upload_i32(backend(), slots);
    size_t cache_elems = static_cast<size_t>(num_pages * page_size * hkv * head_dim);
    std::vector<float> k_init = rng.floats(cache_elems), v_init = rng.floats(cache_elems);
    DeviceTensor ck = upload_f32(backend(), {num_pages, page_size, hkv, head_dim}, k_init);
    DeviceTensor cv = upload_f32(backend(), {num_pages, page_size, hkv, head_dim}, v_init);
    ops::store_kv(backend(), k, v, dslots.t, KvCacheLayer{ck.t, cv.t});

    std::vector<double> k_expected(k_init.begin(), k_init.end()), v_expected(v_init.begin(), v_init.end());
    for (int64_t i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;
      for (int64_t h = 0; h < hkv; ++h) {
        for (int64_t d = 0; d < head_dim; ++d) {
          size_t dst = static_cast<size_t>((slots[i] * hkv + h) * head_dim + d);
          k_expected[dst] = kv[static_cast<size_t>((i * heads + 1 + h) * head_dim + d)];
          v_expected[dst] = kv[static_cast<size_t>((i * heads + 1 + hkv + h) * head_dim + d)];
        }
      }
    }
    EXPECT_TRUE(all_close(download_f32(backend(), ck.t), k_expected, 0.0, 0.0));
    EXPECT_TRUE(all_close(download_f32(backend(), cv.t), v_expected, 0.0, 0.0));

    slots[0] = static_cast<int32_t>(num_pages * page_size);
    DeviceTensor bad = upload_i32(backend(), slots);
    // A GPU backend finds bad data on the device and reports it at the next synchronize().
    EXPECT_THROW(
        {
          ops::store_kv(backend(), k, v, bad.t, KvCacheLayer{ck.t, cv.t});
          backend().synchronize();
        },
        Error);
  }
}

// Storing into an FP8 cache rounds each element to nearest even e4m3, the
// same bytes on every backend; values beyond +-448 saturate.
TEST_P(AttentionTest, StoreKvFp8) {
  Rng rng(26);
  const int64_t n = 9, hkv = 2, head_dim = 64, page_size = 16, num_pages = 3;
  std::vector<float> k = rng.floats(static_cast<size_t>(n * hkv * head_dim), -3.0f, 3.0f);
  std::vector<float> v = rng.floats(static_cast<size_t>(n * hkv * head_dim), -0.05f, 0.05f);
  k[3] = 1000.0f;
  k[7] = -451.0f;
  v[5] = 1e-4f;  // subnormal in e4m3
  DeviceTensor dk = upload_f32(backend(), {n, hkv, head_dim}, k), dv = upload_f32(backend(), {n, hkv, head_dim}, v);
  std::vector<int32_t> slots = {5, 0, 47, -1, 16, 17, 2, 30, 9};
  DeviceTensor dslots = upload_i32(backend(), slots);
  DeviceTensor ck = zeros(backend(), DType::F8E4M3, {num_pages, page_size, hkv, head_dim});
  DeviceTensor cv = zeros(backend(), DType::F8E4M3, {num_pages, page_size, hkv, head_dim});
  ops::store_kv(backend(), dk.t, dv.t, dslots.t, KvCacheLayer{ck.t, cv.t});
  const std::vector<uint8_t> k_bytes = download_bytes(backend(), ck.t), v_bytes = download_bytes(backend(), cv.t);
  std::vector<uint8_t> k_want(k_bytes.size(), 0), v_want(v_bytes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    const auto dst = static_cast<size_t>(slots[i] * hkv * head_dim), src = static_cast<size_t>(i * hkv * head_dim);
    for (size_t e = 0; e < static_cast<size_t>(hkv * head_dim); ++e) {
      k_want[dst + e] = f32_to_f8e4m3(k[src + e]);
      v_want[dst + e] = f32_to_f8e4m3(v[src + e]);
    }
  }
  EXPECT_EQ(k_bytes, k_want);
  EXPECT_EQ(v_bytes, v_want);
  EXPECT_EQ(k_bytes[static_cast<size_t>(5 * hkv * head_dim + 3)], 0x7e);  // 1000 saturates to 448

  // The cache must hold the activations' type or f8_e4m3.
  DeviceTensor ci = zeros(backend(), DType::I32, {num_pages, page_size, hkv, head_dim});
  EXPECT_THROW(ops::store_kv(backend(), dk.t, dv.t, dslots.t, KvCacheLayer{ci.t, ci.t}), Error);
}

// rope_store_kv (with and without the per-head q/k norm) is the separate
// ops in one call: same q and caches on every backend (f32: the CUDA backend
// runs its fused kernel without the norm and falls back with it). Bad norm
// weights and a missing k are rejected.
TEST_P(AttentionTest, RopeStoreKvEqualsSeparateOps) {
  Rng rng(22);
  const int64_t n = 5, hq = 4, hkv = 2, d = 64, pages = 2, page_size = 16;
  std::vector<float> freq(d / 2);
  for (size_t i = 0; i < freq.size(); ++i) freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
  DeviceTensor dfreq = upload_f32(backend(), {d / 2}, freq);
  const RopeParams params{dfreq.t, static_cast<int>(d), RopeStyle::Neox, 1.0f};
  DeviceTensor dpos = upload_i32(backend(), {0, 7, 8, 30, 31});
  DeviceTensor dslots = upload_i32(backend(), {1, 2, -1, 20, 21});
  DeviceTensor qw = upload_f32(backend(), {d}, rng.floats(static_cast<size_t>(d)));
  DeviceTensor kw = upload_f32(backend(), {d}, rng.floats(static_cast<size_t>(d)));
  const std::vector<float> q = rng.floats(static_cast<size_t>(n * hq * d));
  const std::vector<float> kv = rng.floats(static_cast<size_t>(n * 2 * hkv * d));
  for (bool with_norm : {false, true}) {
    SCOPED_TRACE(fmt::format("norm {}", with_norm));
    const QkNorm norm{qw.t, kw.t, 1e-6f, 1.0f};
    std::vector<float> results[2][3];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceTensor dq = upload_f32(backend(), {n, hq, d}, q), dkv = upload_f32(backend(), {n, 2 * hkv, d}, kv);
      const Tensor k = dkv.t.narrow(1, 0, hkv), v = dkv.t.narrow(1, hkv, hkv);
      DeviceTensor ck = zeros(backend(), DType::F32, {pages, page_size, hkv, d});
      DeviceTensor cv = zeros(backend(), DType::F32, {pages, page_size, hkv, d});
      const KvCacheLayer cache{ck.t, cv.t};
      if (fused) {
        ops::rope_store_kv(backend(), dq.t, k, v, dpos.t, params, dslots.t, cache, with_norm ? &norm : nullptr);
      } else {
        if (with_norm) {
          ops::rms_norm(backend(), dq.t, qw.t, norm.eps, norm.weight_offset, dq.t);
          ops::rms_norm(backend(), k, kw.t, norm.eps, norm.weight_offset, k);
        }
        ops::rope(backend(), dq.t, k, dpos.t, params);
        ops::store_kv(backend(), k, v, dslots.t, cache);
      }
      results[fused][0] = download_f32(backend(), dq.t);
      results[fused][1] = download_f32(backend(), ck.t);
      results[fused][2] = download_f32(backend(), cv.t);
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "tensor " << i;
  }
  DeviceTensor dq = zeros(backend(), DType::F32, {n, hq, d}), dkv = zeros(backend(), DType::F32, {n, 2 * hkv, d});
  DeviceTensor ck = zeros(backend(), DType::F32, {pages, page_size, hkv, d});
  DeviceTensor cv = zeros(backend(), DType::F32, {pages, page_size, hkv, d});
  const KvCacheLayer cache{ck.t, cv.t};
  DeviceTensor short_w = zeros(backend(), DType::F32, {d - 1});
  const QkNorm bad{qw.t, short_w.t, 1e-6f, 0.0f};
  const Tensor k = dkv.t.narrow(1, 0, hkv), v = dkv.t.narrow(1, hkv, hkv);
  ops::rope_store_kv(backend(), dq.t, k, v, dpos.t, params, dslots.t, cache);  // well-formed
  EXPECT_THROW(ops::rope_store_kv(backend(), dq.t, k, v, dpos.t, params, dslots.t, cache, &bad), Error);
  EXPECT_THROW(ops::rope_store_kv(backend(), dq.t, Tensor(), v, dpos.t, params, dslots.t, cache), Error);
}

struct SeqSpec {
  int q_len, kv_len, start_pos;
};

struct AttentionCase {
  int heads_kv, group, head_dim, page_size;
  std::vector<SeqSpec> seqs;
  int window = 0;
  float softcap = 0.0f;
  bool sinks = false;
  bool fp8_cache = false;  // K/V stored as f8_e4m3 (the reference reads the same rounded values)
  std::string describe() const {
    return fmt::format("heads_kv={} group={} head_dim={} page_size={} window={} softcap={} sinks={} fp8={}",
                       heads_kv, group, head_dim, page_size, window, softcap, sinks, fp8_cache);
  }
};

void run_attention(Backend& backend, Rng& rng, const AttentionCase& c) {
  SCOPED_TRACE(c.describe());
  const int64_t hkv = c.heads_kv, hq = hkv * c.group, d = c.head_dim, ps = c.page_size;
  int num_seqs = static_cast<int>(c.seqs.size());

  // Page tables: every sequence gets its pages from a shuffled pool with spares.
  int64_t needed = 0;
  for (const auto& s : c.seqs) needed += (s.kv_len + ps - 1) / ps;
  int64_t num_pages = needed + 3;
  std::vector<int32_t> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng.gen());
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, page_ids, last_len, start_pos;
  for (const auto& s : c.seqs) {
    int64_t pages = (s.kv_len + ps - 1) / ps;
    for (int64_t p = 0; p < pages; ++p) page_ids.push_back(pool[page_ids.size()]);
    q_indptr.push_back(q_indptr.back() + s.q_len);
    kv_indptr.push_back(static_cast<int32_t>(page_ids.size()));
    last_len.push_back(static_cast<int32_t>(s.kv_len - (pages - 1) * ps));
    start_pos.push_back(s.start_pos);
  }
  int64_t n = q_indptr.back();

  size_t cache_elems = static_cast<size_t>(num_pages * ps * hkv * d);
  std::vector<float> k_cache = rng.floats(cache_elems), v_cache = rng.floats(cache_elems);
  if (c.fp8_cache) {
    k_cache = round_to_fp8(k_cache);
    v_cache = round_to_fp8(v_cache);
  }
  // q as the middle of a fused [k | q | v] projection output; out as a strided view too.
  const int64_t fused_heads = hq + 2 * hkv;
  float q_range = c.softcap > 0 ? 2.0f : 1.0f;
  std::vector<float> qkv = rng.floats(static_cast<size_t>(n * fused_heads * d), -q_range, q_range);
  std::vector<float> sinks = rng.floats(static_cast<size_t>(hq), -1.0f, 2.0f);

  DeviceTensor dk = c.fp8_cache ? upload_fp8(backend, {num_pages, ps, hkv, d}, k_cache)
                                : upload_f32(backend, {num_pages, ps, hkv, d}, k_cache);
  DeviceTensor dv = c.fp8_cache ? upload_fp8(backend, {num_pages, ps, hkv, d}, v_cache)
                                : upload_f32(backend, {num_pages, ps, hkv, d}, v_cache);
  DeviceTensor dqkv = upload_f32(backend, {n, fused_heads, d}, qkv);
  DeviceTensor dout = zeros(backend, DType::F32, {n, hq + 1, d});
  DeviceTensor dq_indptr = upload_i32(backend, q_indptr), dkv_indptr = upload_i32(backend, kv_indptr);
  DeviceTensor dpages = upload_i32(backend, page_ids), dlast = upload_i32(backend, last_len);
  DeviceTensor dstart = upload_i32(backend, start_pos), dsinks = upload_f32(backend, {hq}, sinks);

  AttentionMetadata meta;
  meta.num_seqs = num_seqs;
  for (const auto& s : c.seqs) {
    meta.max_q_len = std::max(meta.max_q_len, s.q_len);
    meta.max_kv_len = std::max(meta.max_kv_len, s.kv_len);
  }
  meta.q_indptr = dq_indptr.t;
  meta.kv_indptr = dkv_indptr.t;
  meta.kv_page_indices = dpages.t;
  meta.kv_last_page_len = dlast.t;
  meta.kv_start_pos = dstart.t;
  AttentionParams params;
  params.scale = c.softcap > 0 ? 1.0f : 1.0f / std::sqrt(static_cast<float>(d));
  params.sliding_window = c.window;
  params.logit_softcap = c.softcap;
  if (c.sinks) params.sinks = dsinks.t;
  Tensor q = dqkv.t.narrow(1, hkv, hq), out = dout.t.narrow(1, 1, hq);
  ops::attention(backend, q, KvCacheLayer{dk.t, dv.t}, meta, params, out);

  std::vector<double> expected(static_cast<size_t>(n * hq * d));
  auto cache_at = [&](const std::vector<float>& cache, int s, int64_t j, int64_t h) {
    int64_t page = page_ids[static_cast<size_t>(kv_indptr[s] + j / ps)];
    return &cache[static_cast<size_t>(((page * ps + j % ps) * hkv + h) * d)];
  };
  for (int s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = c.seqs[static_cast<size_t>(s)];
    for (int64_t i = 0; i < spec.q_len; ++i) {
      int64_t t = q_indptr[s] + i;
      int64_t q_pos = spec.start_pos + spec.kv_len - spec.q_len + i;
      for (int64_t h = 0; h < hq; ++h) {
        const float* qv = &qkv[static_cast<size_t>((t * fused_heads + hkv + h) * d)];
        std::vector<double> logits;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < spec.kv_len; ++j) {
          int64_t k_pos = spec.start_pos + j;
          bool causal = k_pos <= q_pos;
          bool in_window = c.window == 0 || q_pos - k_pos < c.window;
          if (!causal || !in_window) continue;
          const float* kv = cache_at(k_cache, s, j, h / c.group);
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += static_cast<double>(qv[e]) * kv[e];
          double logit = dot * params.scale;
          if (c.softcap > 0) logit = c.softcap * std::tanh(logit / c.softcap);
          logits.push_back(logit);
          keys.push_back(j);
        }
        double max = c.sinks ? sinks[h] : -INFINITY;
        for (double l : logits) max = std::max(max, l);
        double denom = c.sinks ? std::exp(sinks[h] - max) : 0.0;
        for (double l : logits) denom += std::exp(l - max);
        for (size_t j = 0; j < keys.size(); ++j) {
          double p = std::exp(logits[j] - max) / denom;
          const float* vv = cache_at(v_cache, s, keys[j], h / c.group);
          for (int64_t e = 0; e < d; ++e) expected[static_cast<size_t>((t * hq + h) * d + e)] += p * vv[e];
        }
      }
    }
  }
  EXPECT_TRUE(all_close(download_f32(backend, out), expected, 2e-5, 1e-4));
}

// Decode rows, a fresh prefill, a chunked prefill, and a sequence whose first
// pages were released (kv_start_pos > 0), all in one batch.
const std::vector<SeqSpec> kMixedBatch = {{1, 1, 0}, {1, 37, 0}, {20, 20, 0}, {7, 50, 0}, {3, 33, 40}};

TEST_P(AttentionTest, ShapeSweep) {
  Rng rng(22);
  for (int group : {1, 3, 8}) {
    // 80 leaves a tail after the CPU's 64-wide V accumulation.
    for (int head_dim : {64, 128, 256, 80}) {
      for (int page_size : {16, 32}) run_attention(backend(), rng, {2, group, head_dim, page_size, kMixedBatch});
    }
  }
}

TEST_P(AttentionTest, SlidingWindowSoftcapSinks) {
  Rng rng(23);
  for (int window : {0, 5, 1000}) {
    for (float softcap : {0.0f, 4.0f}) {
      for (bool sinks : {false, true}) {
        AttentionCase c{1, 3, 64, 16, kMixedBatch, window, softcap, sinks};
        run_attention(backend(), rng, c);
      }
    }
  }
}

// An FP8 cache decodes exactly, so attention over it equals attention over
// the same rounded values in f32 (same tolerance as the f32 cache).
TEST_P(AttentionTest, Fp8CacheSweep) {
  Rng rng(25);
  for (int group : {1, 4}) {
    for (int head_dim : {64, 128, 80}) {
      AttentionCase c{2, group, head_dim, 16, kMixedBatch};
      c.fp8_cache = true;
      run_attention(backend(), rng, c);
    }
  }
  AttentionCase windowed{1, 3, 64, 32, kMixedBatch, 5, 4.0f, true};
  windowed.fp8_cache = true;
  run_attention(backend(), rng, windowed);
}

TEST_P(AttentionTest, LongDecodeWithReleasedPages) {
  // A sliding-window layer that dropped its first 8 pages: the window (64) is
  // smaller than the listed keys (300), and the sequence starts at position 128.
  Rng rng(24);
  AttentionCase c{4, 2, 128, 16, {{1, 300, 128}, {2, 90, 0}, {1, 5, 16}}, 64, 0.0f, true};
  run_attention(backend(), rng, c);
  c.page_size = 32;
  run_attention(backend(), rng, c);
}

TEST_P(AttentionTest, RejectsBadMetadata) {
  std::vector<float> zeros_q(2 * 4 * 64, 0.0f), cache(3 * 16 * 2 * 64, 0.0f);
  DeviceTensor q = upload_f32(backend(), {2, 4, 64}, zeros_q);
  DeviceTensor out = zeros(backend(), DType::F32, {2, 4, 64});
  DeviceTensor k = upload_f32(backend(), {3, 16, 2, 64}, cache), v = upload_f32(backend(), {3, 16, 2, 64}, cache);
  DeviceTensor q_indptr = upload_i32(backend(), {0, 2}), kv_indptr = upload_i32(backend(), {0, 1});
  DeviceTensor bad_page = upload_i32(backend(), {7}), last = upload_i32(backend(), {5});
  AttentionMetadata meta;
  meta.num_seqs = 1;
  meta.q_indptr = q_indptr.t;
  meta.kv_indptr = kv_indptr.t;
  meta.kv_page_indices = bad_page.t;
  meta.kv_last_page_len = last.t;
  EXPECT_THROW(
      {
        ops::attention(backend(), q.t, KvCacheLayer{k.t, v.t}, meta, {}, out.t);
        backend().synchronize();
      },
      Error);
  // Heads that do not divide.
  DeviceTensor q3 = upload_f32(backend(), {2, 3, 64}, std::vector<float>(2 * 3 * 64, 0.0f));
  DeviceTensor out3 = zeros(backend(), DType::F32, {2, 3, 64});
  DeviceTensor good_page = upload_i32(backend(), {1});
  meta.kv_page_indices = good_page.t;
  EXPECT_THROW(ops::attention(backend(), q3.t, KvCacheLayer{k.t, v.t}, meta, {}, out3.t), Error);
}

}  // namespace
}  // namespace deepinfer::testing
