// mla_rope_store_kv: the steps of an MLA layer between its projections and
// its attention (normalise the latent, rotate q_pe into the absorbed query's
// tail and k_pe in place, store the token's [latent | k_pe] row in the latent
// cache). On every backend (f32) against a double-precision reference built
// from the definitions; on CUDA in bf16 the fused kernel against the separate
// ops on the same device, bf16 and FP8 caches. Skipped without a GPU where
// the test needs one.
#include <fmt/format.h>
#include <gmock/gmock.h>

#include <cmath>
#include <string>

#include "op_test_util.h"
#include "../support/error_message.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

using ::testing::HasSubstr;

class MlaRopeStoreTest : public BackendTest {
 public:
  Backend& device() { return backend(); }
};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(MlaRopeStoreTest);

// One layer's inputs: n tokens, `heads` query heads of [nope | rot] (q_pe is
// the rot part), kv rows of [lora | rot], a slot per token (-1: padding).
struct MlaCase {
  int64_t n, heads, nope, lora, rot;
  int rotary;  // rotary dims (<= rot); the rest of each rope part is copied unrotated
  RopeStyle style;
  std::vector<int32_t> slots;
};

std::vector<float> rounded_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

TEST_P(MlaRopeStoreTest, MatchesReference) {
  Backend& b = device();
  Rng rng(71);
  for (const MlaCase& c : {MlaCase{5, 4, 16, 32, 8, 8, RopeStyle::Interleaved, {3, -1, 20, 21, 7}},
                           MlaCase{3, 3, 8, 24, 16, 12, RopeStyle::Neox, {0, 9, 40}}}) {
    SCOPED_TRACE(fmt::format("n={} heads={} lora={} rot={} rotary={}", c.n, c.heads, c.lora, c.rot, c.rotary));
    const int64_t qk = c.nope + c.rot, row = c.lora + c.rot, pages = 6, page_size = 8;
    const std::vector<float> q = rng.floats(static_cast<size_t>(c.n * c.heads * qk));
    const std::vector<float> kv = rng.floats(static_cast<size_t>(c.n * row), -3, 3);
    const std::vector<float> norm_w = rng.floats(static_cast<size_t>(c.lora), 0.5, 1.5);
    std::vector<int32_t> pos(static_cast<size_t>(c.n));
    for (auto& p : pos) p = rng.uniform_int(0, 5000);
    std::vector<float> freq(static_cast<size_t>(c.rotary / 2));
    for (size_t i = 0; i < freq.size(); ++i) freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.rotary));
    const float eps = 1e-6f, factor = 0.8f;

    DeviceTensor dq = upload_f32(b, {c.n, c.heads, qk}, q), dkv = upload_f32(b, {c.n, 1, row}, kv);
    DeviceTensor dqa = zeros(b, DType::F32, {c.n, c.heads, row});
    DeviceTensor dw = upload_f32(b, {c.lora}, norm_w), dp = upload_i32(b, pos), ds = upload_i32(b, c.slots);
    DeviceTensor df = upload_f32(b, {c.rotary / 2}, freq);
    DeviceTensor cache = zeros(b, DType::F32, {pages, page_size, 1, row});
    const KvCacheLayer layer{cache.t, cache.t.narrow(3, 0, c.lora)};
    ops::mla_rope_store_kv(b, dq.t.narrow(2, c.nope, c.rot), dqa.t.narrow(2, c.lora, c.rot), dkv.t, c.lora, dw.t,
                           eps, dp.t, RopeParams{df.t, c.rotary, c.style, factor}, ds.t, layer);

    // The reference: RMSNorm of the latent, then RoPE of each rope part.
    auto rotate = [&](const float* in, double* out, int32_t p) {
      for (int64_t d = 0; d < c.rot; ++d) out[d] = in[d];
      const int half = c.rotary / 2;
      for (int i = 0; i < half; ++i) {
        const int a = c.style == RopeStyle::Neox ? i : 2 * i, bb = c.style == RopeStyle::Neox ? i + half : 2 * i + 1;
        // The angle as the backends form it, an f32 product (at position 5000 its rounding is ~3e-4 rad).
        const double ang = static_cast<float>(p) * freq[static_cast<size_t>(i)];
        const double cs = std::cos(ang) * factor, sn = std::sin(ang) * factor;
        out[a] = in[a] * cs - in[bb] * sn;
        out[bb] = in[bb] * cs + in[a] * sn;
      }
    };
    std::vector<double> want_qa(static_cast<size_t>(c.n * c.heads * row), 0.0), want_kv(kv.begin(), kv.end());
    std::vector<double> want_cache(static_cast<size_t>(pages * page_size * row), 0.0);
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t h = 0; h < c.heads; ++h) {
        rotate(&q[static_cast<size_t>((t * c.heads + h) * qk + c.nope)],
               &want_qa[static_cast<size_t>((t * c.heads + h) * row + c.lora)], pos[static_cast<size_t>(t)]);
      }
      double ss = 0.0;
      for (int64_t d = 0; d < c.lora; ++d) ss += want_kv[static_cast<size_t>(t * row + d)] * want_kv[static_cast<size_t>(t * row + d)];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(c.lora) + eps);
      for (int64_t d = 0; d < c.lora; ++d) want_kv[static_cast<size_t>(t * row + d)] *= inv * norm_w[static_cast<size_t>(d)];
      rotate(&kv[static_cast<size_t>(t * row + c.lora)], &want_kv[static_cast<size_t>(t * row + c.lora)],
             pos[static_cast<size_t>(t)]);
      const int32_t slot = c.slots[static_cast<size_t>(t)];
      for (int64_t d = 0; slot >= 0 && d < row; ++d) {
        want_cache[static_cast<size_t>(slot * row + d)] = want_kv[static_cast<size_t>(t * row + d)];
      }
    }
    EXPECT_TRUE(all_close(download_f32(b, dqa.t), want_qa, 1e-5, 1e-5)) << "q_rot (and the rest of q_att untouched)";
    EXPECT_TRUE(all_close(download_f32(b, dkv.t), want_kv, 1e-5, 1e-5)) << "kv in place";
    EXPECT_TRUE(all_close(download_f32(b, cache.t), want_cache, 1e-5, 1e-5)) << "cache rows";
    EXPECT_EQ(download_f32(b, dq.t), q) << "q_pe is read, not written";
  }
}

TEST_P(MlaRopeStoreTest, RejectsBadArguments) {
  Backend& b = device();
  const int64_t n = 2, heads = 2, lora = 16, rot = 8, row = lora + rot;
  DeviceTensor q = zeros(b, DType::F32, {n, heads, rot}), qa = zeros(b, DType::F32, {n, heads, row});
  DeviceTensor kv = zeros(b, DType::F32, {n, 1, row}), w = zeros(b, DType::F32, {lora});
  DeviceTensor pos = upload_i32(b, {0, 1}), slots = upload_i32(b, {0, 1}), freq = zeros(b, DType::F32, {rot / 2});
  DeviceTensor cache = zeros(b, DType::F32, {2, 4, 1, row}), other = zeros(b, DType::F32, {2, 4, 1, lora});
  const RopeParams rope{freq.t, static_cast<int>(rot), RopeStyle::Interleaved, 1.0f};
  const KvCacheLayer latent{cache.t, cache.t.narrow(3, 0, lora)};
  const Tensor q_rot = qa.t.narrow(2, lora, rot);
  EXPECT_THAT(error_of([&] {
                ops::mla_rope_store_kv(b, q.t, q_rot, kv.t, lora, w.t, 1e-6f, pos.t, rope, slots.t,
                                       KvCacheLayer{cache.t, other.t});
              }),
              HasSubstr("mla_rope_store_kv"));
  EXPECT_THAT(error_of([&] {
                ops::mla_rope_store_kv(b, q.t, q_rot, kv.t, row, w.t, 1e-6f, pos.t, rope, slots.t, latent);
              }),
              HasSubstr("lora 24 short of the row"));
  EXPECT_THAT(error_of([&] {
                ops::mla_rope_store_kv(b, q.t, qa.t.narrow(2, 0, rot - 2), kv.t, lora, w.t, 1e-6f, pos.t, rope,
                                       slots.t, latent);
              }),
              HasSubstr("mla_rope_store_kv"));
  EXPECT_THAT(error_of([&] {
                ops::mla_rope_store_kv(b, q.t, q_rot, kv.t, lora, w.t.narrow(0, 0, lora - 1), 1e-6f, pos.t, rope,
                                       slots.t, latent);
              }),
              HasSubstr("weight"));
}

// The fused CUDA kernel against the separate ops on the GPU (bf16): the
// rotations and stores are the same arithmetic (identical results); the
// latent's sum of squares may round differently (one warp against the norm
// kernel's two), so almost every value must be identical and all close.
class MlaRopeStoreCudaTest : public CudaVsCpuTest {};

TEST_F(MlaRopeStoreCudaTest, FusedEqualsSeparateOps) {
  Rng rng(72);
  const int64_t n = 6, heads = 16, nope = 128, lora = 512, rot = 64, qk = nope + rot, row = lora + rot;
  const int64_t pages = 4, page_size = 16;
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::Neox}) {
    for (DType cache_type : {DType::BF16, DType::F8E4M3}) {
      SCOPED_TRACE(fmt::format("style {} cache {}", static_cast<int>(style), dtype_name(cache_type)));
      const std::vector<float> q = rounded_bf16(rng.floats(static_cast<size_t>(n * heads * qk)));
      const std::vector<float> kv = rounded_bf16(rng.floats(static_cast<size_t>(n * row), -3, 3));
      std::vector<int32_t> pos(static_cast<size_t>(n)), slots = {2, 17, -1, 33, 34, 63};
      for (auto& p : pos) p = rng.uniform_int(0, 100000);
      std::vector<float> freq(static_cast<size_t>(rot / 2));
      for (size_t i = 0; i < freq.size(); ++i) freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / rot));
      DeviceTensor dw = upload_f32(gpu(), {lora}, rng.floats(static_cast<size_t>(lora), 0.5, 1.5));
      DeviceTensor dp = upload_i32(gpu(), pos), ds = upload_i32(gpu(), slots), df = upload_f32(gpu(), {rot / 2}, freq);
      const RopeParams params{df.t, static_cast<int>(rot), style, 0.7f};
      std::vector<std::vector<float>> results[2];
      for (int fused = 0; fused < 2; ++fused) {
        DeviceTensor dq = upload_bf16(gpu(), {n, heads, qk}, q), dkv = upload_bf16(gpu(), {n, 1, row}, kv);
        DeviceTensor dqa = zeros(gpu(), DType::BF16, {n, heads, row});
        DeviceTensor cache = zeros(gpu(), cache_type, {pages, page_size, 1, row});
        const KvCacheLayer layer{cache.t, cache.t.narrow(3, 0, lora)};
        const Tensor q_pe = dq.t.narrow(2, nope, rot), q_rot = dqa.t.narrow(2, lora, rot);
        if (fused) {
          ops::mla_rope_store_kv(gpu(), q_pe, q_rot, dkv.t, lora, dw.t, 1e-6f, dp.t, params, ds.t, layer);
        } else {
          const Tensor latent = dkv.t.select(1, 0).narrow(1, 0, lora);
          ops::rms_norm(gpu(), latent, dw.t, 1e-6f, 0.0f, latent);
          ops::copy(gpu(), q_rot, q_pe);
          ops::rope(gpu(), q_rot, dkv.t.narrow(2, lora, rot), dp.t, params);
          ops::store_kv(gpu(), dkv.t, dkv.t.narrow(2, 0, lora), ds.t, layer);
        }
        results[fused] = {download_any(gpu(), dqa.t), download_any(gpu(), dkv.t), download_any(gpu(), cache.t)};
      }
      EXPECT_EQ(results[0][0], results[1][0]) << "q_att";
      for (size_t i = 1; i < 3; ++i) {
        size_t same = 0;
        for (size_t j = 0; j < results[0][i].size(); ++j) same += results[0][i][j] == results[1][i][j];
        EXPECT_GE(same, results[0][i].size() * 99 / 100) << "tensor " << i;
        EXPECT_TRUE(all_close(results[1][i], std::vector<double>(results[0][i].begin(), results[0][i].end()), 1e-2,
                              1e-2))
            << "tensor " << i;
      }
      EXPECT_NE(results[1][2], std::vector<float>(results[1][2].size(), 0.0f));  // rows were stored
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
