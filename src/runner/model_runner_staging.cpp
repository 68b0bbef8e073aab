// ModelRunner's staging of a step: the input buffer's layout for a step's
// tokens, sequences and sampled rows, the CUDA-graph shape a plan pads to,
// and the plan written into the pinned buffer (tokens, positions, page
// tables, sampling and penalty rows) before one copy to the device.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"
#include "runner/model_runner_internal.h"

namespace deepinfer {

using runner_detail::kParamInts;
using runner_detail::kPenaltyParamInts;
using runner_detail::round_up;

ModelRunner::Layout ModelRunner::layout(int32_t tokens, int32_t seqs, int32_t rows) const {
  Layout l{};
  int64_t at = 0;
  auto take = [&](int64_t count, int64_t align_ints) {
    at = round_up(at, align_ints);
    const int64_t offset = at;
    at += count;
    return offset;
  };
  l.host_tokens = take(tokens, 4);
  l.gather = take(tokens, 4);
  l.positions = take(tokens, 4);
  l.logit_rows = take(rows, 4);
  l.q_indptr = take(seqs + 1, 4);
  l.params = take(rows * kParamInts, 4);
  l.penalty_params = take(rows * kPenaltyParamInts, 4);
  l.hidden_rows = take(tokens, 4);
  l.groups.resize(static_cast<size_t>(num_groups_));
  for (GroupLayout& g : l.groups) {
    g.slots = take(tokens, 4);
    g.kv_indptr = take(seqs + 1, 4);
    g.last_len = take(seqs, 4);
    g.start_pos = take(seqs, 4);
  }
  // Page lists last, each with room for a full table, so that a group's list
  // starts at an address that depends only on the counts (graphs).
  for (GroupLayout& g : l.groups) g.kv_pages = take(max_kv_pages_, 4);
  return l;
}

int32_t ModelRunner::graph_batch(int32_t seqs, int32_t q) const {
  // Padding sequences keep their q positions in the one padding page.
  if (graph_sizes_.empty() || seqs <= 0 || q < 1 || q > limits_.max_rows_per_seq || q > kv_.page_size()) return 0;
  auto it = std::lower_bound(graph_sizes_.begin(), graph_sizes_.end(), seqs);
  if (it == graph_sizes_.end()) return 0;
  const int64_t padded_tokens = int64_t{*it} * q;
  if (padded_tokens > limits_.max_num_batched_tokens || padded_tokens > max_rows_) return 0;
  return *it;
}

ModelRunner::GraphShape ModelRunner::graph_shape(const StepPlan& plan) const {
  if (plan.empty()) return {};
  // Every token of every sequence sampled: decode steps, and verify steps
  // (a verify step samples each token). q: the longest sequence's tokens.
  int32_t q = 0;
  int64_t real_tokens = 0;
  for (const PlannedSeq& s : plan.seqs) {
    if (s.num_rows != s.num_tokens) return {};
    q = std::max(q, s.num_tokens);
    real_tokens += s.num_tokens;
  }
  const auto n = static_cast<int32_t>(plan.seqs.size());
  const int32_t batch = graph_batch(n, q);
  if (batch == 0) return {};
  if (real_tokens < int64_t{n} * q && !pads_shorter_sequences(plan, q, real_tokens)) return {};
  return {batch, q};
}

// A verify step whose requests verify different numbers of drafts runs as
// the graph of its longest sequence, the shorter ones padded at their end:
// an eager step of a small model costs several graph replays in launches
// (docs/benchmarks.md, speculative decoding on the H100), while padding rows
// cost little as long as the products stream their weights (up to
// kFreePaddedTokens tokens) or add little compute next to that launch cost
// (kPaddingBudget: extra tokens x weight bytes, about 2 x parameters of
// bf16 weights, so roughly their FLOPs). The runner's per-token device
// state (hidden states, routing counts) follows the plan's token order,
// which padding moves: such runners do not pad.
bool ModelRunner::padding_allowed(int64_t padded_tokens, int64_t real_tokens) const {
  constexpr int64_t kFreePaddedTokens = 128;
  constexpr double kPaddingBudget = 2e11;
  if (limits_.hidden_states || limits_.count_experts) return false;
  return padded_tokens <= kFreePaddedTokens ||
         static_cast<double>(padded_tokens - real_tokens) * static_cast<double>(model_.weight_bytes()) <=
             kPaddingBudget;
}

bool ModelRunner::pads_shorter_sequences(const StepPlan& plan, int32_t q, int64_t real_tokens) const {
  if (!plan.hidden_rows.empty() || !padding_allowed(static_cast<int64_t>(plan.seqs.size()) * q, real_tokens)) {
    return false;
  }
  // Padding positions continue the sequence (queries are its last positions).
  return std::all_of(plan.seqs.begin(), plan.seqs.end(), [&](const PlannedSeq& s) {
    return s.kv_len() + (q - s.num_tokens) <= limits_.max_model_len;
  });
}

bool ModelRunner::pads_verify_step(int32_t seqs, int32_t longest, int64_t tokens) const {
  return graph_batch(seqs, longest) > 0 && padding_allowed(int64_t{seqs} * longest, tokens);
}

void ModelRunner::stage_penalties(int slot, const StepPlan& plan, Staged& st) {
  int64_t n_entries = 0;
  bool penalised = false;
  for (const PlannedRow& row : plan.rows) {
    if (row.sampling.penalties == nullptr) continue;
    penalised = true;
    n_entries += static_cast<int64_t>(row.sampling.penalties->entries().size());
  }
  if (!penalised) return;
  DI_CHECK(n_entries <= INT32_MAX, "step of {} penalty entries exceeds {}", n_entries, INT32_MAX);
  ensure_penalty_capacity(slot, n_entries);
  st.penalty_entries = 0;
  auto* params = reinterpret_cast<PenaltyRowParams*>(slots_[slot].staging + st.l.penalty_params);
  for (int32_t r = 0; r < plan.num_rows(); ++r) {
    const PlannedRow& row = plan.rows[static_cast<size_t>(r)];
    params[r] = PenaltyRowParams{};
    if (row.sampling.penalties == nullptr) continue;
    // The row's last input token, when it is still on the device, is the
    // history entry the host does not know yet.
    const PlannedSeq& seq = plan.seqs[static_cast<size_t>(row.seq)];
    const int32_t t = seq.token_begin + row.query;
    // The token's place among the staged ones (a padded step moves them).
    const bool on_device = plan.tokens[static_cast<size_t>(t)].on_device();
    const int32_t pending = on_device ? st.seq_begin(plan, row.seq) + row.query : -1;
    const auto entries = row.sampling.penalties->entries();
    params[r] = row.sampling.penalties->row_params(row.sampling.params.position,
                                                   static_cast<int32_t>(st.penalty_entries), pending);
    std::copy(entries.begin(), entries.end(), slots_[slot].penalties_host + st.penalty_entries);
    st.penalty_entries += static_cast<int64_t>(entries.size());
  }
}

ModelRunner::Staged ModelRunner::stage(int slot, const StepPlan& plan, GraphShape graph) {
  const int32_t ps = kv_.page_size();
  DI_CHECK(plan.page_size == ps && static_cast<int32_t>(plan.groups.size()) == num_groups_,
           "step plan for pages of {} in {} groups, but the KV cache has pages of {} in {} groups", plan.page_size,
           plan.groups.size(), ps, num_groups_);
  const auto real_seqs = static_cast<int32_t>(plan.seqs.size());
  Staged st;
  const bool padded = graph.seqs > 0;
  st.graph_q = padded ? graph.q : 0;
  st.seqs = padded ? graph.seqs : real_seqs;
  st.tokens = padded ? graph.seqs * graph.q : plan.num_tokens();
  st.rows = padded ? graph.seqs * graph.q : plan.num_rows();
  st.l = layout(st.tokens, st.seqs, st.rows);
  const Layout& l = st.l;
  int32_t* base = slots_[slot].staging;
  int32_t* host_tokens = base + l.host_tokens;
  int32_t* gather = base + l.gather;
  int32_t* positions = base + l.positions;
  int32_t* logit_rows = base + l.logit_rows;
  int32_t* q_indptr = base + l.q_indptr;
  // Index of host token i in the device array the gather reads from.
  const int64_t host_source = sampled_ints_ + l.host_tokens;
  const int32_t seq_q = padded ? graph.q : 0;
  auto staged_begin = [&](int32_t si) { return st.seq_begin(plan, si); };
  auto stage_padding_token = [&](int32_t at, int32_t position) {
    host_tokens[at] = 0;
    gather[at] = static_cast<int32_t>(host_source + at);
    positions[at] = position;
  };

  int32_t t = 0;
  q_indptr[0] = 0;
  for (int32_t si = 0; si < real_seqs; ++si) {
    const PlannedSeq& s = plan.seqs[static_cast<size_t>(si)];
    DI_CHECK(s.token_begin == t && s.num_tokens >= 0 && t + s.num_tokens <= plan.num_tokens() &&
                 (!padded || s.num_tokens <= seq_q),
             "step plan: sequence {} has inconsistent tokens", si);
    const int32_t at = staged_begin(si);
    for (int32_t i = 0; i < s.num_tokens; ++i, ++t) {
      const TokenSource& src = plan.tokens[static_cast<size_t>(t)];
      if (src.on_device()) {
        DI_CHECK(src.device.slot < kSlots && src.device.row >= 0 && src.device.row < max_rows_,
                 "step plan: token {} names sampling row {} of slot {}", t, src.device.row, src.device.slot);
        host_tokens[at + i] = 0;
        gather[at + i] = src.device.slot * max_rows_ + src.device.row;
      } else {
        host_tokens[at + i] = src.id;
        gather[at + i] = static_cast<int32_t>(host_source + at + i);
      }
      positions[at + i] = s.start + i;
    }
    const int32_t pad = padded ? seq_q - s.num_tokens : 0;
    for (int32_t i = s.num_tokens; i < s.num_tokens + pad; ++i) stage_padding_token(at + i, s.start + i);
    st.padded_seqs += pad > 0 ? 1 : 0;
    q_indptr[si + 1] = at + s.num_tokens + pad;
    st.max_q = std::max(st.max_q, s.num_tokens + pad);
    st.max_kv = std::max(st.max_kv, s.kv_len() + pad);
  }
  DI_CHECK(t == plan.num_tokens(), "step plan lists {} tokens but its sequences hold {}", plan.num_tokens(), t);
  for (int32_t r = 0; r < plan.num_rows(); ++r) {
    const PlannedRow& row = plan.rows[static_cast<size_t>(r)];
    DI_CHECK(row.seq >= 0 && row.seq < real_seqs, "step plan: row {} names sequence {}", r, row.seq);
    const PlannedSeq& s = plan.seqs[static_cast<size_t>(row.seq)];
    DI_CHECK(row.query >= 0 && row.query < s.num_tokens, "step plan: row {} names query token {} of {}", r, row.query,
             s.num_tokens);
    logit_rows[r] = staged_begin(row.seq) + row.query;
    std::memcpy(base + l.params + int64_t{r} * kParamInts, &row.sampling.params, sizeof(SamplingRowParams));
  }
  // Rows past the plan's: the padding tokens of shorter sequences, then the
  // padding sequences' (q tokens each, every one a row, attending to the
  // zeroed padding page and storing nothing: negative slot).
  int32_t pad_row = plan.num_rows();
  for (int32_t si = 0; padded && si < real_seqs; ++si) {
    const PlannedSeq& s = plan.seqs[static_cast<size_t>(si)];
    for (int32_t i = s.num_tokens; i < seq_q; ++i) logit_rows[pad_row++] = staged_begin(si) + i;
  }
  const int32_t pad_q = std::max(st.graph_q, 1);
  const int32_t real_end = padded ? real_seqs * seq_q : plan.num_tokens();
  for (int32_t si = real_seqs; si < st.seqs; ++si) {
    for (int32_t i = 0; i < pad_q; ++i) {
      const int32_t pt = real_end + (si - real_seqs) * pad_q + i;
      stage_padding_token(pt, i);
      logit_rows[pad_row++] = pt;
    }
    q_indptr[si + 1] = real_end + (si - real_seqs + 1) * pad_q;
    st.max_q = std::max(st.max_q, pad_q);
    st.max_kv = std::max(st.max_kv, pad_q);
  }
  DI_CHECK(pad_row == st.rows, "step staging: {} rows for a shape of {}", pad_row, st.rows);

  if (!plan.hidden_rows.empty()) {
    DI_CHECK(limits_.hidden_states, "step plan with a hidden input, but the runner keeps no hidden states");
    DI_CHECK(plan.hidden_rows.size() == plan.tokens.size() && plan.hidden_source.defined() &&
                 plan.hidden_source.ndim() == 2 && plan.hidden_source.size(1) == model_.config().hidden_size,
             "step plan: {} hidden rows for {} tokens, source {}", plan.hidden_rows.size(), plan.tokens.size(),
             plan.hidden_source.describe());
    for (size_t i = 0; i < plan.hidden_rows.size(); ++i) {
      const int32_t row = plan.hidden_rows[i];
      DI_CHECK(row >= 0 && row < plan.hidden_source.size(0), "step plan: token {} takes hidden row {} of {}", i, row,
               plan.hidden_source.size(0));
      base[l.hidden_rows + static_cast<int64_t>(i)] = row;
    }
  }

  st.pages.assign(static_cast<size_t>(num_groups_), 0);
  for (int32_t g = 0; g < num_groups_; ++g) {
    const GroupPages& gp = plan.groups[static_cast<size_t>(g)];
    const GroupLayout& gl = l.groups[static_cast<size_t>(g)];
    DI_CHECK(gp.indptr.size() == plan.seqs.size() + 1 && gp.first_pos.size() == plan.seqs.size(),
             "step plan: group {} tables cover {} sequences of {}", g, gp.first_pos.size(), plan.seqs.size());
    // A padded sequence may list the padding page once more (the constructor's bound allows both).
    const auto listed = static_cast<int64_t>(gp.pages.size()) + (st.seqs - real_seqs) + (padded ? real_seqs : 0);
    DI_CHECK(listed <= max_kv_pages_, "step page table of {} entries exceeds its {}", listed, max_kv_pages_);
    int32_t* kv_slots = base + gl.slots;
    int32_t* kv_indptr = base + gl.kv_indptr;
    int32_t* last_len = base + gl.last_len;
    int32_t* start_pos = base + gl.start_pos;
    int32_t* pages = base + gl.kv_pages;
    int32_t np = 0;
    kv_indptr[0] = 0;
    for (int32_t si = 0; si < real_seqs; ++si) {
      const PlannedSeq& s = plan.seqs[static_cast<size_t>(si)];
      const int32_t begin = gp.indptr[static_cast<size_t>(si)], end = gp.indptr[static_cast<size_t>(si) + 1];
      const int32_t first = gp.first_pos[static_cast<size_t>(si)];
      const int32_t n_pages = end - begin;
      DI_CHECK(begin >= 0 && end >= begin && end <= static_cast<int32_t>(gp.pages.size()) && first % ps == 0 &&
                   first <= s.start && first + n_pages * ps >= s.kv_len() && first + (n_pages - 1) * ps < s.kv_len(),
               "step plan: group {} pages of sequence {} do not cover positions {}..{}", g, si, s.start,
               s.kv_len() - 1);
      const int32_t list_begin = np;
      for (int32_t i = begin; i < end; ++i) pages[np++] = gp.pages[static_cast<size_t>(i)];
      const int32_t at = staged_begin(si);
      for (int32_t i = 0; i < s.num_tokens; ++i) {
        const int32_t p = s.start + i;
        kv_slots[at + i] = pages[list_begin + (p - first) / ps] * ps + p % ps;
      }
      // Padding tokens: their keys and values go to the sequence's last page
      // past its end (scratch), and nowhere beyond it, where the padding page
      // (zeros) is listed for them to read.
      const int32_t pad = padded ? seq_q - s.num_tokens : 0;
      const int32_t page_end = first + n_pages * ps;
      for (int32_t i = s.num_tokens; i < s.num_tokens + pad; ++i) {
        const int32_t p = s.start + i;
        kv_slots[at + i] = p < page_end ? pages[list_begin + (p - first) / ps] * ps + p % ps : -1;
      }
      const int32_t kv_len = s.kv_len() + pad;
      if (kv_len > page_end) pages[np++] = kv_.padding_page();  // pad < q <= page size: one page at most
      kv_indptr[si + 1] = np;
      last_len[si] = kv_len - first - (np - list_begin - 1) * ps;
      start_pos[si] = first;
    }
    for (int32_t si = real_seqs; si < st.seqs; ++si) {
      for (int32_t i = 0; i < pad_q; ++i) kv_slots[real_end + (si - real_seqs) * pad_q + i] = -1;
      pages[np++] = kv_.padding_page();
      kv_indptr[si + 1] = np;
      last_len[si] = pad_q;
      start_pos[si] = 0;
    }
    st.pages[static_cast<size_t>(g)] = np;
  }
  st.hidden_input = !plan.hidden_rows.empty();
  stage_penalties(slot, plan, st);
  return st;
}

int32_t ModelRunner::graph_kv_bucket(int32_t max_kv_len) const {
  int32_t bucket = 512;
  while (bucket < max_kv_len && bucket < limits_.max_model_len) bucket *= 4;
  return std::min(bucket, limits_.max_model_len);
}

ForwardInputs ModelRunner::device_inputs(const Staged& st, int32_t graph_kv_len) const {
  const bool graph = graph_kv_len > 0;
  auto view = [&](int64_t offset_ints, int64_t count) {
    return step_dev_.view(DType::I32, {count}, static_cast<size_t>(sampled_ints_ + offset_ints) * 4);
  };
  const Layout& l = st.l;
  ForwardInputs in;
  in.num_tokens = st.tokens;
  in.token_ids = token_ids_dev_.view(DType::I32, {st.tokens});
  in.positions = view(l.positions, st.tokens);
  in.logit_rows = view(l.logit_rows, st.rows);
  in.kv_groups.resize(static_cast<size_t>(num_groups_));
  for (int32_t g = 0; g < num_groups_; ++g) {
    const GroupLayout& gl = l.groups[static_cast<size_t>(g)];
    KvGroupInputs& group = in.kv_groups[static_cast<size_t>(g)];
    group.slot_mapping = view(gl.slots, st.tokens);
    AttentionMetadata& a = group.attention;
    a.num_seqs = st.seqs;
    // A graph is replayed for any context length: its plan must hold for the longest.
    a.max_q_len = graph ? st.graph_q : st.max_q;
    a.max_kv_len = graph ? graph_kv_len : st.max_kv;
    a.q_indptr = view(l.q_indptr, st.seqs + 1);
    a.kv_indptr = view(gl.kv_indptr, st.seqs + 1);
    a.kv_page_indices = view(gl.kv_pages, graph ? max_kv_pages_ : st.pages[static_cast<size_t>(g)]);
    a.kv_last_page_len = view(gl.last_len, st.seqs);
    a.kv_start_pos = view(gl.start_pos, st.seqs);
  }
  if (limits_.hidden_states) {
    const int64_t hidden = model_.config().hidden_size;
    const DType act = backend_.activation_dtype();
    in.hidden_out = hidden_out_dev_.view(act, {st.tokens, hidden});
    if (st.hidden_input) in.hidden_in = hidden_in_dev_.view(act, {st.tokens, hidden});
  }
  if (count_cells_ > 0) {
    in.expert_counts = counts_dev_.view(DType::I32, {moe_layers_, count_cells_ / moe_layers_});
  }
  return in;
}

}  // namespace deepinfer
