// apply_penalties on every backend against the per-token reference
// processing (tests/support/reference_penalties.h) run on the full history,
// bit for bit: entry lists built by PenaltyState from the output the host
// knows, plus a pending token (one more output the host does not know) that
// is in the list as an output, prompt, bias or mask token, or not at all;
// repeated tokens, bias-only and mask-only rows, rows with everything off,
// strided logits. Plus the op's rejection of bad lists, and a check that the
// shared arithmetic rounds every step on its own (no fused multiply-add).
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <map>

#include "../support/error_message.h"
#include "../support/reference_penalties.h"
#include "backend/cpu/cpu_penalties.h"
#include "op_test_util.h"
#include "ops/ops.h"
#include "runner/penalty_state.h"

namespace deepinfer::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kEntryBytes = sizeof(PenaltyEntry);
constexpr int64_t kParamBytes = sizeof(PenaltyRowParams);

class PenaltiesTest : public BackendTest {};
DEEPINFER_INSTANTIATE_BACKEND_TESTS(PenaltiesTest);

enum class Pending { None, Output, Prompt, Bias, Mask, Fresh, NoToken };

struct RowCase {
  SamplingParams params;
  bool processed = true;  // false: the row has no PenaltyState (default parameters)
  std::vector<int32_t> prompt, known_output;
  int32_t pending = -1;   // the in-flight token, -1: none
  bool pending_slot = false;  // the row names a pending index (whose token may be -1)
};

std::vector<int32_t> draw_tokens(Rng& rng, int n, int32_t lo, int32_t hi) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = rng.uniform_int(lo, hi);
  return t;
}

// Row `i` of a batch: the parameter mix cycles through penalties alone and
// combined, bias only, min_tokens only, and nothing; the pending token
// through every way it can relate to the list. Tokens come from a narrow
// range so prompt, output and bias overlap and repeat.
RowCase make_row(Rng& rng, int i, int32_t vocab) {
  RowCase c;
  SamplingParams& p = c.params;
  const int32_t hi = std::min<int32_t>(vocab - 1, 60);
  switch (i % 9) {
    case 0: p.repetition_penalty = 1.3f; break;
    case 1: p.frequency_penalty = 0.7f; break;
    case 2: p.presence_penalty = -0.6f; break;
    case 3: p.repetition_penalty = 0.8f, p.frequency_penalty = -1.1f, p.presence_penalty = 1.5f; break;
    case 4: break;  // logit_bias only (below)
    case 5: p.min_tokens = 6, p.stop_token_ids = {3, 9}; break;
    case 6: p.min_tokens = 2, p.ignore_eos = true, p.stop_token_ids = {5}, p.repetition_penalty = 1.7f; break;
    case 7: c.processed = false; break;
    case 8: p.repetition_penalty = 1.1f, p.frequency_penalty = 0.3f, p.presence_penalty = 0.2f, p.min_tokens = 40; break;
  }
  if (i % 9 == 4 || i % 3 == 0) {
    const int n = rng.uniform_int(1, 6);
    for (int k = 0; k < n; ++k) p.logit_bias[rng.uniform_int(0, vocab - 1)] = rng.uniform(-100.0f, 100.0f);
    p.logit_bias[rng.uniform_int(0, hi)] = 0.0f;  // a zero bias is still an addition on the host
  }
  c.prompt = draw_tokens(rng, rng.uniform_int(0, 40), 0, hi);
  c.known_output = draw_tokens(rng, rng.uniform_int(0, 30), 0, hi);
  const auto kind = static_cast<Pending>(rng.uniform_int(0, 6));
  c.pending_slot = kind != Pending::None;
  switch (kind) {
    case Pending::None: break;
    case Pending::Output:
      c.pending = c.known_output.empty() ? 7 : c.known_output[static_cast<size_t>(rng.uniform_int(0, 1000)) %
                                                               c.known_output.size()];
      break;
    case Pending::Prompt:
      c.pending = c.prompt.empty() ? 11 : c.prompt[static_cast<size_t>(rng.uniform_int(0, 1000)) % c.prompt.size()];
      break;
    case Pending::Bias: c.pending = p.logit_bias.empty() ? 13 : p.logit_bias.begin()->first; break;
    case Pending::Mask: c.pending = p.stop_token_ids.empty() ? 2 : p.stop_token_ids[0]; break;
    case Pending::Fresh: c.pending = rng.uniform_int(0, vocab - 1); break;
    case Pending::NoToken: c.pending = -1; break;  // the sampler found no token
  }
  return c;
}

// Logits with exact zeros, -inf and wide magnitudes among uniform values.
float draw_logit(Rng& rng) {
  switch (rng.uniform_int(0, 19)) {
    case 0: return 0.0f;
    case 1: return -kInf;
    case 2: return rng.uniform(-1e4f, 1e4f);
    default: return rng.uniform(-6.0f, 6.0f);
  }
}

std::vector<uint32_t> bits_of(const float* x, int64_t n) {
  std::vector<uint32_t> b(static_cast<size_t>(n));
  std::memcpy(b.data(), x, static_cast<size_t>(n) * 4);
  return b;
}

const std::vector<int32_t> kEos = {0, 4};

// The op's tensors for `rows` with logits[r * stride, + vocab).
struct Inputs {
  std::vector<float> logits;
  std::vector<PenaltyRowParams> params;
  std::vector<PenaltyEntry> entries;
  std::vector<int32_t> pending_tokens;
};

Inputs build_inputs(Rng& rng, const std::vector<RowCase>& rows, int64_t vocab, int64_t stride) {
  Inputs in;
  in.logits.resize(rows.size() * static_cast<size_t>(stride));
  for (float& x : in.logits) x = draw_logit(rng);
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowCase& c = rows[r];
    const int32_t pending_index = c.pending_slot ? static_cast<int32_t>(in.pending_tokens.size()) : -1;
    if (c.pending_slot) in.pending_tokens.push_back(c.pending);
    if (!c.processed) {
      in.params.emplace_back();
      in.params.back().pending = pending_index;  // a pending token alone changes nothing
      continue;
    }
    const PenaltyState state(c.params, c.prompt, kEos, c.known_output);
    const int64_t position = static_cast<int64_t>(c.known_output.size()) + (c.pending_slot ? 1 : 0);
    in.params.push_back(state.row_params(position, static_cast<int32_t>(in.entries.size()), pending_index));
    in.entries.insert(in.entries.end(), state.entries().begin(), state.entries().end());
  }
  return in;
}

// The reference processing of row `c` on the full history.
void reference_row(const RowCase& c, std::span<float> x) {
  if (!c.processed) return;
  std::vector<int32_t> output = c.known_output;
  if (c.pending >= 0) output.push_back(c.pending);
  const auto position = static_cast<int32_t>(c.known_output.size()) + (c.pending_slot ? 1 : 0);
  if (position < c.params.min_tokens) {
    if (!c.params.ignore_eos) mask_tokens(x, kEos);
    mask_tokens(x, c.params.stop_token_ids);
  }
  apply_logit_bias(x, c.params.logit_bias);
  std::vector<int32_t> counts;
  apply_penalties(x, c.params, c.prompt, output, counts);
}

DeviceTensor upload_records(Backend& backend, const void* data, int64_t n, int64_t record_bytes) {
  // An empty list still gets a (one-record) buffer so the view has an address.
  DeviceTensor d{Buffer(backend, static_cast<size_t>(std::max<int64_t>(n, 1) * record_bytes)), {}};
  d.t = d.buffer.view(DType::U8, {n, record_bytes});
  if (n > 0) backend.copy(d.t, Tensor(const_cast<void*>(data), DType::U8, {n, record_bytes}));
  return d;
}

std::vector<float> run_op(Backend& backend, const Inputs& in, int64_t rows, int64_t vocab, int64_t stride) {
  DeviceTensor logits = upload_f32(backend, {rows, stride}, in.logits);
  DeviceTensor params = upload_records(backend, in.params.data(), rows, kParamBytes);
  DeviceTensor entries = upload_records(backend, in.entries.data(), static_cast<int64_t>(in.entries.size()), kEntryBytes);
  DeviceTensor pending;
  if (!in.pending_tokens.empty()) pending = upload_i32(backend, in.pending_tokens);
  ops::apply_penalties(backend, logits.t.narrow(1, 0, vocab), params.t, entries.t, pending.t);
  backend.synchronize();
  return download_f32(backend, logits.t);
}

TEST_P(PenaltiesTest, EqualsTheHostSamplerOnTheFullHistoryBitForBit) {
  Rng rng(2024);
  for (const int64_t vocab : {61, 4099, 151936}) {
    const int64_t stride = vocab + 5;  // strided rows; the gap must stay untouched
    const int n_rows = 45;
    std::vector<RowCase> rows;
    for (int i = 0; i < n_rows; ++i) rows.push_back(make_row(rng, i, static_cast<int32_t>(vocab)));
    const Inputs in = build_inputs(rng, rows, vocab, stride);
    const std::vector<float> got = run_op(backend(), in, n_rows, vocab, stride);
    std::vector<float> expected = in.logits;
    for (int r = 0; r < n_rows; ++r) {
      reference_row(rows[static_cast<size_t>(r)],
                    std::span<float>(expected.data() + r * stride, static_cast<size_t>(vocab)));
    }
    int changed = 0;
    for (int r = 0; r < n_rows; ++r) {
      const float* g = got.data() + r * stride;
      const float* e = expected.data() + r * stride;
      ASSERT_EQ(bits_of(g, stride), bits_of(e, stride)) << "vocab " << vocab << " row " << r << " (case " << r % 9
                                                         << ")";
      changed += std::memcmp(g, in.logits.data() + r * stride, static_cast<size_t>(stride) * 4) != 0;
    }
    EXPECT_GT(changed, n_rows / 2) << "most rows must be processed";
  }
}

TEST_P(PenaltiesTest, PendingTokenCountsAsOneMoreOutput) {
  // Hand-built list: token 2 is in the prompt, token 5 an output once, token 7
  // only biased. Each row's pending token is a different one of them, or 9
  // (not listed).
  const int64_t vocab = 12;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.logit_bias = {{7, 1.0f}};
  const std::vector<int32_t> prompt = {2}, output = {5};
  const PenaltyState state(p, prompt, {}, output);
  ASSERT_EQ(state.entries().size(), 3u);
  Inputs in;
  in.pending_tokens = {2, 5, 7, 9, -1};
  for (int32_t r = 0; r < 5; ++r) {
    in.params.push_back(state.row_params(2, static_cast<int32_t>(in.entries.size()), r));
    in.entries.insert(in.entries.end(), state.entries().begin(), state.entries().end());
  }
  in.logits.assign(5 * vocab, 3.0f);
  const std::vector<float> got = run_op(backend(), in, 5, vocab, vocab);
  auto at = [&](int r, int t) { return got[static_cast<size_t>(r * vocab + t)]; };
  // Without a pending token: 2 -> 3/2; 5 -> 3/2 - (0.5 + 0.25); 7 -> 3 + 1.
  for (int r = 0; r < 5; ++r) {
    const int32_t pending = in.pending_tokens[static_cast<size_t>(r)];
    EXPECT_EQ(at(r, 2), pending == 2 ? 1.5f - 0.75f : 1.5f) << "row " << r;
    EXPECT_EQ(at(r, 5), pending == 5 ? 1.5f - 1.25f : 0.75f) << "row " << r;
    EXPECT_EQ(at(r, 7), pending == 7 ? 2.0f - 0.75f : 4.0f) << "row " << r;
    EXPECT_EQ(at(r, 9), pending == 9 ? 0.75f : 3.0f) << "row " << r;
    EXPECT_EQ(at(r, 0), 3.0f);
  }
}

TEST_P(PenaltiesTest, RejectsBadListsAndArguments) {
  Backend& b = backend();
  const int64_t vocab = 16;
  DeviceTensor logits = zeros(b, DType::F32, {1, vocab});
  auto run = [&](const PenaltyRowParams& p, const std::vector<PenaltyEntry>& entries,
                 const std::vector<int32_t>& pending) {
    return error_of([&] {
      DeviceTensor params = upload_records(b, &p, 1, kParamBytes);
      DeviceTensor list = upload_records(b, entries.data(), static_cast<int64_t>(entries.size()), kEntryBytes);
      DeviceTensor pend;
      if (!pending.empty()) pend = upload_i32(b, pending);
      ops::apply_penalties(b, logits.t, params.t, list.t, pend.t);
      b.synchronize();
    });
  };
  PenaltyRowParams p;
  p.entries_end = 2;
  const std::vector<PenaltyEntry> good = {{.token = 1, .output_count = 1}, {.token = 3, .output_count = 2}};
  EXPECT_EQ(run(p, good, {}), "(no error)");
  EXPECT_NE(run(p, {good[0]}, {}), "(no error)") << "range past the list";
  EXPECT_NE(run(p, {good[1], good[0]}, {}), "(no error)") << "unsorted";
  EXPECT_NE(run(p, {good[0], good[0]}, {}), "(no error)") << "duplicate token";
  EXPECT_NE(run(p, {good[0], {.token = 16}}, {}), "(no error)") << "token outside the vocabulary";
  PenaltyRowParams with_pending = p;
  with_pending.pending = 1;
  EXPECT_NE(run(with_pending, good, {4}), "(no error)") << "pending index outside the pending tokens";
  with_pending.pending = 0;
  EXPECT_NE(run(with_pending, good, {16}), "(no error)") << "pending token outside the vocabulary";
  EXPECT_EQ(run(with_pending, good, {-1}), "(no error)") << "no token sampled: nothing pending";

  DeviceTensor params = zeros(b, DType::U8, {1, kParamBytes});
  DeviceTensor short_params = zeros(b, DType::U8, {1, kParamBytes - 4});
  DeviceTensor entries = zeros(b, DType::U8, {2, kEntryBytes});
  DeviceTensor entries_i32 = zeros(b, DType::I32, {2, 4});
  EXPECT_NE(error_of([&] { ops::apply_penalties(b, logits.t, short_params.t, entries.t, Tensor()); }), "(no error)");
  EXPECT_NE(error_of([&] { ops::apply_penalties(b, logits.t, params.t, entries_i32.t, Tensor()); }), "(no error)");
  DeviceTensor two_rows = zeros(b, DType::F32, {2, vocab});
  EXPECT_NE(error_of([&] { ops::apply_penalties(b, two_rows.t, params.t, entries.t, Tensor()); }), "(no error)");
}

// float(double(a) op double(b)) is the correctly rounded f32 result of one
// operation (the double has more than 2 * 24 + 2 bits), whatever the
// compiler does with f32 expressions.
float rn(double x) { return static_cast<float>(x); }

TEST(PenaltyArithmetic, EveryStepIsRoundedOnItsOwn) {
  Rng rng(7);
  int fused_would_differ = 0;
  for (int i = 0; i < 20000; ++i) {
    PenaltyRowParams p;
    p.repetition = rng.uniform(0.5f, 2.0f);
    p.frequency = rng.uniform(-2.0f, 2.0f);
    p.presence = rng.uniform(-2.0f, 2.0f);
    const float logit = rng.uniform(-30.0f, 30.0f), bias = rng.uniform(-5.0f, 5.0f);
    const int32_t count = rng.uniform_int(1, 50);
    float l = rn(double(logit) + bias);
    l = l > 0.0f ? rn(double(l) / p.repetition) : rn(double(l) * p.repetition);
    const float expected = rn(double(l) - rn(double(rn(double(p.frequency) * count)) + p.presence));
    EXPECT_EQ(cpu::penalise_logit(logit, p, kPenaltyHasBias, bias, false, count), expected) << i;
    fused_would_differ += rn(double(l) - std::fma(p.frequency, float(count), p.presence)) != expected;
  }
  EXPECT_GT(fused_would_differ, 0) << "the draws must include values where a fused multiply-add rounds differently";
}

}  // namespace
}  // namespace deepinfer::testing
