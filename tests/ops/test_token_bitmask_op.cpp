// apply_token_bitmask on every backend against a scalar reference, bit for
// bit: random masks of every density on a subset of strided logits rows,
// 16-byte aligned and not (the gap past each row must survive), vocabularies
// that are not a multiple of 32, masks with words (and stray bits) past the
// vocabulary and masks narrower than it, a row named twice, m = 0, a
// hand-built mask in XGrammar's bit order, and the rejection of bad
// arguments and of a row index outside the logits.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "../support/error_message.h"
#include "op_test_util.h"
#include "ops/ops.h"

namespace deepinfer::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class TokenBitmaskTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(TokenBitmaskTest);

std::vector<uint32_t> bits_of(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  std::memcpy(b.data(), x.data(), x.size() * sizeof(float));
  return b;
}

// Logits with NaN and infinities among ordinary values: the op must leave an
// allowed logit exactly as it was, whatever it holds.
std::vector<float> draw_logits(Rng& rng, size_t n) {
  std::vector<float> x(n);
  for (float& v : x) {
    switch (rng.uniform_int(0, 29)) {
      case 0: v = std::numeric_limits<float>::quiet_NaN(); break;
      case 1: v = -kInf; break;
      case 2: v = kInf; break;
      default: v = rng.uniform(-20.0f, 20.0f); break;
    }
  }
  return x;
}

// m rows of `words` words. Densities cycle through everything allowed,
// nothing allowed, about half, a few tokens (typical inside a grammar) and
// nearly all; bits past the vocabulary are random in every row.
std::vector<uint32_t> draw_masks(Rng& rng, int64_t m, int64_t words, int64_t vocab) {
  std::vector<uint32_t> mask(static_cast<size_t>(m * words));
  for (int64_t i = 0; i < m; ++i) {
    const int kind = static_cast<int>(i % 5);
    for (int64_t t = 0; t < words * 32; ++t) {
      bool allowed;
      if (t >= vocab) {
        allowed = rng.uniform_int(0, 1) == 1;
      } else if (kind == 0) {
        allowed = true;
      } else if (kind == 1) {
        allowed = false;
      } else if (kind == 2) {
        allowed = rng.uniform_int(0, 1) == 1;
      } else if (kind == 3) {
        allowed = rng.uniform_int(0, 99) == 0;
      } else {
        allowed = rng.uniform_int(0, 99) != 0;
      }
      if (allowed) mask[static_cast<size_t>(i * words + t / 32)] |= uint32_t{1} << (t % 32);
    }
  }
  return mask;
}

// The op's definition, token by token.
void reference(const std::vector<uint32_t>& mask, int64_t words, const std::vector<int32_t>& rows, int64_t vocab,
               int64_t stride, std::vector<float>& logits) {
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t t = 0; t < vocab; ++t) {
      const int64_t word = t / 32;
      const bool allowed = word < words && (mask[i * static_cast<size_t>(words) + static_cast<size_t>(word)] >>
                                            (t % 32)) % 2 == 1;
      if (!allowed) logits[static_cast<size_t>(rows[i] * stride + t)] = -kInf;
    }
  }
}

// bitmask and rows on the backend; an empty list still gets a one-row buffer
// so that its view has an address.
struct DeviceMask {
  DeviceTensor bitmask, rows;
};
DeviceMask upload_mask(Backend& backend, const std::vector<uint32_t>& mask, int64_t words,
                       const std::vector<int32_t>& rows) {
  const auto m = static_cast<int64_t>(rows.size());
  DeviceMask d;
  d.bitmask.buffer = Buffer(backend, static_cast<size_t>(std::max<int64_t>(m, 1) * words) * sizeof(int32_t));
  d.bitmask.t = d.bitmask.buffer.view(DType::I32, {m, words});
  d.rows.buffer = Buffer(backend, static_cast<size_t>(std::max<int64_t>(m, 1)) * sizeof(int32_t));
  d.rows.t = d.rows.buffer.view(DType::I32, {m});
  if (m > 0) {
    backend.copy(d.bitmask.t, Tensor(const_cast<uint32_t*>(mask.data()), DType::I32, {m, words}));
    backend.copy(d.rows.t, Tensor(const_cast<int32_t*>(rows.data()), DType::I32, {m}));
  }
  return d;
}

// Runs the op on n_rows rows of logits[r * stride, + vocab); returns the
// whole strided buffer.
std::vector<float> run_op(Backend& backend, const std::vector<float>& logits, int64_t n_rows, int64_t vocab,
                          int64_t stride, const std::vector<uint32_t>& mask, int64_t words,
                          const std::vector<int32_t>& rows) {
  DeviceTensor l = upload_f32(backend, {n_rows, stride}, logits);
  DeviceMask d = upload_mask(backend, mask, words, rows);
  ops::apply_token_bitmask(backend, l.t.narrow(1, 0, vocab), d.bitmask.t, d.rows.t);
  backend.synchronize();
  return download_f32(backend, l.t);
}

struct Shape {
  int64_t vocab, words;
};

TEST_P(TokenBitmaskTest, EqualsTheScalarReferenceBitForBit) {
  Rng rng(31);
  const std::vector<Shape> shapes = {
      {1, 1},         {32, 1},     {61, 2},       // one word; a partial last word
      {61, 5},                                    // words (with stray bits) past the vocabulary
      {4099, 129},    {4099, 100},                // a mask narrower than the vocabulary
      {151936, 4740},                             // a tokenizer's mask on a padded model vocabulary
      {151936, 4748}, {262145, 8193},             // many chunks, a last chunk of one token
  };
  for (const Shape& s : shapes) {
    // Row strides of whole 16-byte vectors and not (a backend may vectorise).
    for (const int64_t stride : {(s.vocab + 3) / 4 * 4 + 4, s.vocab + 7}) {
      const int64_t n_rows = 9;
      // A subset of the rows, out of order.
      std::vector<int32_t> rows(static_cast<size_t>(n_rows));
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng.gen());
      rows.resize(6);
      const auto m = static_cast<int64_t>(rows.size());
      const std::vector<float> logits = draw_logits(rng, static_cast<size_t>(n_rows * stride));
      const std::vector<uint32_t> mask = draw_masks(rng, m, s.words, s.vocab);
      const std::vector<float> got = run_op(backend(), logits, n_rows, s.vocab, stride, mask, s.words, rows);
      std::vector<float> expected = logits;
      reference(mask, s.words, rows, s.vocab, stride, expected);
      const std::vector<uint32_t> g = bits_of(got), e = bits_of(expected);
      for (int64_t r = 0; r < n_rows; ++r) {
        const auto b = static_cast<size_t>(r * stride);
        ASSERT_TRUE(std::equal(g.begin() + b, g.begin() + b + stride, e.begin() + b))
            << "vocab " << s.vocab << " words " << s.words << " stride " << stride << " logits row " << r;
      }
    }
  }
}

TEST_P(TokenBitmaskTest, FollowsXGrammarBitOrder) {
  // Allowed: 0, 5, 31 (word 0), 32, 63 (word 1), 64, 69 (word 2, the last token).
  const int64_t vocab = 70, words = 3;
  const std::vector<uint32_t> mask = {0x80000021u, 0x80000001u, 0x00000021u};
  const std::vector<float> logits(static_cast<size_t>(2 * vocab), 1.5f);
  const std::vector<float> got = run_op(backend(), logits, 2, vocab, vocab, mask, words, {1});
  const std::vector<int64_t> allowed = {0, 5, 31, 32, 63, 64, 69};
  for (int64_t t = 0; t < vocab; ++t) {
    const bool is_allowed = std::find(allowed.begin(), allowed.end(), t) != allowed.end();
    EXPECT_EQ(got[static_cast<size_t>(vocab + t)], is_allowed ? 1.5f : -kInf) << "token " << t;
    EXPECT_EQ(got[static_cast<size_t>(t)], 1.5f) << "row 0 is not named";
  }
}

TEST_P(TokenBitmaskTest, RowNamedTwiceGetsBothMasks) {
  const int64_t vocab = 40, words = 2;
  // Both mask rows name logits row 1: the first allows tokens 0-15 and 32-39,
  // the second 8-23 and 36-39, so 8-15 and 36-39 stay.
  const std::vector<uint32_t> mask = {0x0000ffffu, 0x000000ffu, 0x00ffff00u, 0x000000f0u};
  const std::vector<float> logits(static_cast<size_t>(3 * vocab), 2.0f);
  const std::vector<float> got = run_op(backend(), logits, 3, vocab, vocab, mask, words, {1, 1});
  for (int64_t t = 0; t < vocab; ++t) {
    const bool both = (t >= 8 && t < 16) || t >= 36;
    EXPECT_EQ(got[static_cast<size_t>(vocab + t)], both ? 2.0f : -kInf) << "token " << t;
    EXPECT_EQ(got[static_cast<size_t>(t)], 2.0f);
    EXPECT_EQ(got[static_cast<size_t>(2 * vocab + t)], 2.0f);
  }
}

TEST_P(TokenBitmaskTest, NoMaskRowsIsANoOp) {
  Rng rng(5);
  const int64_t vocab = 100, stride = 104;
  const std::vector<float> logits = draw_logits(rng, static_cast<size_t>(4 * stride));
  const std::vector<float> got = run_op(backend(), logits, 4, vocab, stride, {}, 4, {});
  EXPECT_EQ(bits_of(got), bits_of(logits));
}

TEST_P(TokenBitmaskTest, RowOutsideTheLogitsIsAnError) {
  Backend& b = backend();
  Rng rng(9);
  const int64_t vocab = 50, stride = 53, words = 2, n_rows = 3;
  const std::vector<float> logits = draw_logits(rng, static_cast<size_t>(n_rows * stride));
  for (const int32_t bad : {-1, 3, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()}) {
    const std::vector<int32_t> rows = {0, bad};
    const std::vector<uint32_t> mask = draw_masks(rng, 2, words, vocab);
    DeviceTensor l = upload_f32(b, {n_rows, stride}, logits);
    DeviceMask d = upload_mask(b, mask, words, rows);
    const std::string error = error_of([&] {
      ops::apply_token_bitmask(b, l.t.narrow(1, 0, vocab), d.bitmask.t, d.rows.t);
      b.synchronize();
    });
    EXPECT_NE(error.find("apply_token_bitmask"), std::string::npos) << "row " << bad << ": " << error;
    // The CPU checks every index before writing; a device skips the bad mask
    // row and applies the good one. Neither writes anywhere else.
    std::vector<float> expected = logits;
    if (b.device().type != DeviceType::CPU) reference({mask[0], mask[1]}, words, {0}, vocab, stride, expected);
    EXPECT_EQ(bits_of(download_f32(b, l.t)), bits_of(expected)) << "row " << bad;
  }
}

TEST_P(TokenBitmaskTest, RejectsBadArguments) {
  Backend& b = backend();
  const int64_t vocab = 64;
  DeviceTensor logits = zeros(b, DType::F32, {2, vocab});
  DeviceTensor mask = zeros(b, DType::I32, {2, 2});
  DeviceTensor rows = upload_i32(b, {0, 1});
  auto rejected = [&](const Tensor& l, const Tensor& m, const Tensor& r) {
    const std::string e = error_of([&] { ops::apply_token_bitmask(b, l, m, r); });
    return e.find("apply_token_bitmask") != std::string::npos;
  };
  EXPECT_FALSE(rejected(logits.t, mask.t, rows.t)) << "good arguments";

  DeviceTensor logits_bf16 = zeros(b, DType::BF16, {2, vocab});
  DeviceTensor logits_3d = zeros(b, DType::F32, {1, 2, vocab});
  EXPECT_TRUE(rejected(logits_bf16.t, mask.t, rows.t)) << "bf16 logits";
  EXPECT_TRUE(rejected(logits_3d.t, mask.t, rows.t)) << "rank-3 logits";
  EXPECT_TRUE(rejected(Tensor(), mask.t, rows.t)) << "undefined logits";

  DeviceTensor mask_f32 = zeros(b, DType::F32, {2, 2});
  DeviceTensor mask_i64 = zeros(b, DType::I64, {2, 2});
  DeviceTensor mask_1d = zeros(b, DType::I32, {4});
  DeviceTensor mask_3d = zeros(b, DType::I32, {2, 1, 2});
  DeviceTensor mask_wide = zeros(b, DType::I32, {2, 3});
  DeviceTensor mask_no_words = zeros(b, DType::I32, {2, 1});
  EXPECT_TRUE(rejected(logits.t, mask_f32.t, rows.t)) << "f32 bitmask";
  EXPECT_TRUE(rejected(logits.t, mask_i64.t, rows.t)) << "i64 bitmask";
  EXPECT_TRUE(rejected(logits.t, mask_1d.t, rows.t)) << "rank-1 bitmask";
  EXPECT_TRUE(rejected(logits.t, mask_3d.t, rows.t)) << "rank-3 bitmask";
  EXPECT_TRUE(rejected(logits.t, mask_wide.t.narrow(1, 0, 2), rows.t)) << "strided bitmask";
  EXPECT_TRUE(rejected(logits.t, mask_no_words.t.narrow(1, 0, 0), rows.t)) << "no words";
  EXPECT_TRUE(rejected(logits.t, Tensor(), rows.t)) << "undefined bitmask";

  DeviceTensor rows_long = upload_i32(b, {0, 1, 1});
  DeviceTensor rows_i64 = zeros(b, DType::I64, {2});
  DeviceTensor rows_2d = zeros(b, DType::I32, {2, 1});
  EXPECT_TRUE(rejected(logits.t, mask.t, rows_long.t)) << "more rows than mask rows";
  EXPECT_TRUE(rejected(logits.t, mask.t, rows_i64.t)) << "i64 rows";
  EXPECT_TRUE(rejected(logits.t, mask.t, rows_2d.t)) << "rank-2 rows";
  EXPECT_TRUE(rejected(logits.t, mask.t, Tensor())) << "undefined rows";
}

}  // namespace
}  // namespace deepinfer::testing
