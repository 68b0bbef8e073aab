// Mixture-of-experts ops of the CPU backend.
//
// moe_experts groups the (token, expert) pairs by expert, so each expert runs
// its three matrix products once over all of its tokens: prefill gets one
// sgemm per expert (CpuBackend::linear's gemm path), decode one weight-bound
// gemv per chosen expert, and experts nobody chose are never read. The rows of
// one expert keep token order and every token sums its experts' outputs in
// routing order, so results are deterministic and, with batch invariance on
// (linear always per row), independent of the batch. Expert biases (gpt-oss)
// ride on linear's bias; interleaved gate/up views are plain strided weights.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/rows.h"
#include "core/error.h"

namespace deepinfer::cpu {

namespace {

constexpr size_t kAlign = 64;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Carves the workspace: index arrays, then f32 activation blocks of R = n * top_k rows.
struct MoeLayout {
  size_t offsets = 0;       // i32[E + 1]: expert e owns sorted rows [offsets[e], offsets[e+1])
  size_t cursor = 0;        // i32[E]
  size_t token_of_row = 0;  // i32[R]: token whose input a sorted row holds
  size_t row_of_slot = 0;   // i32[R]: sorted row of (token t, choice j) at t * top_k + j
  size_t rows_in = 0;       // f32[R, H]: gathered inputs, later the experts' outputs
  size_t gate = 0;          // f32[R, F]: gate products, then the activations
  size_t up = 0;            // f32[R, F]
  size_t total = 0;

  MoeLayout(int64_t n_tokens, int top_k, int64_t n_experts, int64_t hidden, int64_t ffn) {
    const size_t r = static_cast<size_t>(n_tokens) * static_cast<size_t>(top_k);
    const size_t e = static_cast<size_t>(n_experts);
    size_t at = 0;
    auto take = [&](size_t bytes) {
      size_t start = at;
      at += aligned(bytes);
      return start;
    };
    offsets = take((e + 1) * sizeof(int32_t));
    cursor = take(e * sizeof(int32_t));
    token_of_row = take(r * sizeof(int32_t));
    row_of_slot = take(r * sizeof(int32_t));
    rows_in = take(r * static_cast<size_t>(hidden) * sizeof(float));
    gate = take(r * static_cast<size_t>(ffn) * sizeof(float));
    up = take(r * static_cast<size_t>(ffn) * sizeof(float));
    total = at;
  }
};

// Index of the largest value not yet taken; ties and NaNs resolve to the lowest index.
int64_t take_best(const float* v, uint8_t* taken, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (taken[i]) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  taken[best] = 1;
  return best;
}

}  // namespace

void CpuBackend::moe_route(const Tensor& logits, const MoeRouteParams& params, Tensor expert_ids,
                           Tensor expert_weights) {
  Rows lr(logits), ir(expert_ids), wr(expert_weights);
  const int64_t n_experts = lr.cols();
  const int top_k = params.top_k;
  const float* bias = params.correction_bias.defined() ? params.correction_bias.data_as<float>() : nullptr;
  const int64_t groups = params.n_groups, group_size = n_experts / groups;
  // Per thread: scores, selection scores and group ranks (f32), then taken flags.
  const size_t scratch_bytes = (2 * n_experts + groups) * sizeof(float) + n_experts + groups;

  pool_.parallel_for(lr.rows(), [&](int64_t begin, int64_t end, int thread) {
    float* scores = thread_scratch_[static_cast<size_t>(thread)].get<float>(scratch_bytes);
    float* choice = scores + n_experts;
    float* group_rank = choice + n_experts;
    uint8_t* taken = reinterpret_cast<uint8_t*>(group_rank + groups);
    uint8_t* group_taken = taken + n_experts;
    for (int64_t t = begin; t < end; ++t) {
      const float* l = lr.row(t);
      if (params.scoring == MoeScoring::Softmax) {
        const float mx = *std::max_element(l, l + n_experts);
        float sum = 0.0f;
        for (int64_t e = 0; e < n_experts; ++e) sum += scores[e] = std::exp(l[e] - mx);
        for (int64_t e = 0; e < n_experts; ++e) scores[e] /= sum;
      } else {
        for (int64_t e = 0; e < n_experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-l[e]));
      }
      for (int64_t e = 0; e < n_experts; ++e) choice[e] = bias ? scores[e] + bias[e] : scores[e];
      std::memset(taken, 0, static_cast<size_t>(n_experts));
      if (groups > 1) {
        for (int64_t g = 0; g < groups; ++g) {
          const float* c = choice + g * group_size;
          uint8_t* tk = taken + g * group_size;
          const int64_t a = take_best(c, tk, group_size);
          group_rank[g] = params.group_score == MoeGroupScore::Max ? c[a] : c[a] + c[take_best(c, tk, group_size)];
        }
        // Experts of the groups that lose stay taken, so they cannot be chosen.
        std::memset(taken, 1, static_cast<size_t>(n_experts));
        std::memset(group_taken, 0, static_cast<size_t>(groups));
        for (int i = 0; i < params.top_k_groups; ++i) {
          const int64_t g = take_best(group_rank, group_taken, groups);
          std::memset(taken + g * group_size, 0, static_cast<size_t>(group_size));
        }
      }
      int32_t* ids = ir.row<int32_t>(t);
      float* w = wr.row(t);
      float sum = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const int64_t e = take_best(choice, taken, n_experts);
        ids[j] = static_cast<int32_t>(e);
        sum += w[j] = scores[e];
      }
      const float factor = params.renormalize && sum > 0.0f ? params.scaling / sum : params.scaling;
      for (int j = 0; j < top_k; ++j) w[j] *= factor;
    }
  }, std::max<int64_t>(1, 4096 / std::max<int64_t>(n_experts, 1)));
}

size_t CpuBackend::moe_workspace_bytes(int64_t n_tokens, int top_k, const MoeExpertWeights& w) const {
  return MoeLayout(n_tokens, top_k, w.gate.size(0), w.gate.size(2), w.gate.size(1)).total;
}

void CpuBackend::moe_experts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                             const MoeExpertWeights& w, Activation act, bool accumulate, Tensor workspace,
                             Tensor out) {
  const int64_t n = x.size(0), hidden = x.size(1);
  const int64_t n_experts = w.gate.size(0), ffn = w.gate.size(1);
  const int top_k = static_cast<int>(expert_ids.size(1));
  const int64_t total_rows = n * top_k;
  const MoeLayout layout(n, top_k, n_experts, hidden, ffn);
  char* ws = static_cast<char*>(workspace.data());
  auto* offsets = reinterpret_cast<int32_t*>(ws + layout.offsets);
  auto* cursor = reinterpret_cast<int32_t*>(ws + layout.cursor);
  auto* token_of_row = reinterpret_cast<int32_t*>(ws + layout.token_of_row);
  auto* row_of_slot = reinterpret_cast<int32_t*>(ws + layout.row_of_slot);
  Tensor rows_in(ws + layout.rows_in, DType::F32, {total_rows, hidden}, device());
  Tensor gate(ws + layout.gate, DType::F32, {total_rows, ffn}, device());
  Tensor up(ws + layout.up, DType::F32, {total_rows, ffn}, device());
  if (n == 0) return;

  // Counting sort of the (token, choice) slots by expert.
  Rows ids(expert_ids), weights(expert_weights), xr(x), orow(out);
  std::fill(cursor, cursor + n_experts, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* id = ids.row<int32_t>(t);
    for (int j = 0; j < top_k; ++j) {
      DI_CHECK(id[j] >= 0 && id[j] < n_experts, "moe_experts: expert id {} of token {} out of range [0, {})",
               id[j], t, n_experts);
      ++cursor[id[j]];
    }
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    offsets[e + 1] = offsets[e] + cursor[e];
    cursor[e] = offsets[e];
  }
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* id = ids.row<int32_t>(t);
    for (int j = 0; j < top_k; ++j) {
      const int32_t row = cursor[id[j]]++;
      token_of_row[row] = static_cast<int32_t>(t);
      row_of_slot[t * top_k + j] = row;
    }
  }

  Rows sorted(rows_in);
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(float);
  pool_.parallel_for(total_rows, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) std::memcpy(sorted.row(r), xr.row(token_of_row[r]), row_bytes);
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)));

  const bool bias = w.has_bias();
  auto bias_of = [&](const Tensor& b, int64_t e) { return bias ? b.row(e) : Tensor(); };
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t start = offsets[e], count = offsets[e + 1] - start;
    if (count == 0) continue;
    const Tensor in = rows_in.slice_rows(start, count);
    linear(in, w.gate.row(e), bias_of(w.gate_bias, e), gate.slice_rows(start, count));
    linear(in, w.up.row(e), bias_of(w.up_bias, e), up.slice_rows(start, count));
  }
  gated_activation(gate, up, act, gate);
  // The inputs are consumed: the experts' outputs go to the same rows.
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t start = offsets[e], count = offsets[e + 1] - start;
    if (count == 0) continue;
    linear(gate.slice_rows(start, count), w.down.row(e), bias_of(w.down_bias, e), rows_in.slice_rows(start, count));
  }

  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = orow.row(t);
      const float* wt = weights.row(t);
      if (!accumulate) std::fill(o, o + hidden, 0.0f);
      for (int j = 0; j < top_k; ++j) {
        const float* y = sorted.row(row_of_slot[t * top_k + j]);
        const float s = wt[j];
        for (int64_t i = 0; i < hidden; ++i) o[i] += s * y[i];
      }
    }
  }, std::max<int64_t>(1, 8192 / std::max<int64_t>(hidden * top_k, 1)));
}

void CpuBackend::count_experts(const Tensor& expert_ids, const Tensor& token_slots, Tensor counts) {
  const int64_t n = expert_ids.size(0), top_k = expert_ids.size(1), n_experts = counts.size(0);
  const int32_t* slots = token_slots.defined() ? token_slots.data_as<const int32_t>() : nullptr;
  Rows ids(expert_ids);
  // Every id is checked before any is counted, so a bad row leaves counts as they were.
  for (int64_t t = 0; t < n; ++t) {
    if (slots && slots[t] < 0) continue;
    const int32_t* id = ids.row<int32_t>(t);
    for (int64_t j = 0; j < top_k; ++j) {
      DI_CHECK(id[j] >= 0 && id[j] < n_experts, "count_experts: expert id {} of token {} out of range [0, {})",
               id[j], t, n_experts);
    }
  }
  int32_t* out = counts.data_as<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    if (slots && slots[t] < 0) continue;
    const int32_t* id = ids.row<int32_t>(t);
    for (int64_t j = 0; j < top_k; ++j) ++out[id[j]];
  }
}

}  // namespace deepinfer::cpu
