#include "sched/step_plan_builder.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

bool StepPlan::decode_only() const {
  return std::all_of(seqs.begin(), seqs.end(),
                     [](const PlannedSeq& s) { return s.num_tokens == 1 && s.num_rows == 1; });
}

std::vector<int32_t> StepPlan::written_pages() const {
  std::vector<int32_t> pages_out;
  if (page_size <= 0) return pages_out;
  for (const GroupPages& g : groups) {
    for (size_t s = 0; s < seqs.size() && s + 1 < g.indptr.size(); ++s) {
      const PlannedSeq& q = seqs[s];
      if (q.num_tokens <= 0) continue;
      const int32_t first = s < g.first_pos.size() ? g.first_pos[s] : 0;
      // Listed page i holds positions [first + i * page_size, ...).
      const int64_t lo = g.indptr[s] + (std::max(q.start, first) - first) / page_size;
      const int64_t hi = g.indptr[s] + (q.kv_len() - 1 - first) / page_size;
      for (int64_t i = std::max<int64_t>(lo, g.indptr[s]); i <= hi && i < g.indptr[s + 1]; ++i) {
        if (i >= 0 && static_cast<size_t>(i) < g.pages.size()) pages_out.push_back(g.pages[static_cast<size_t>(i)]);
      }
    }
  }
  std::sort(pages_out.begin(), pages_out.end());
  pages_out.erase(std::unique(pages_out.begin(), pages_out.end()), pages_out.end());
  return pages_out;
}

RowSampling sampling_row(const Request& r, int32_t offset) {
  const SamplingParams& p = r.params();
  RowSampling rs;
  rs.params.temperature = p.temperature;
  rs.params.top_p = p.top_p;
  rs.params.min_p = p.min_p;
  rs.params.top_k = p.top_k;
  rs.params.seed = r.seed();
  // Index of the sampled token within the output: the RNG stream is keyed on
  // it, so a token's draw does not depend on how steps were cut.
  rs.params.position = r.sample_position_base + r.num_output_tokens() + r.num_inflight_tokens() + offset;
  rs.copy_logits = r.host_sampling || p.logprobs.has_value();
  // Host-sampled rows apply the grammar on the host (with their raw logits).
  rs.token_mask = r.grammar && !r.host_sampling;
  return rs;
}

StepPlan build_step_plan(const ScheduledBatch& batch, const KvCacheManager& kv, const RowSamplingFn& sampling) {
  StepPlan plan;
  plan.page_size = kv.block_size();
  plan.groups.resize(static_cast<size_t>(kv.layout().num_groups()));
  plan.seqs.reserve(batch.seqs.size());
  plan.tokens.reserve(static_cast<size_t>(batch.num_tokens));
  for (const ScheduledSeq& s : batch.seqs) {
    const Request& r = *s.request;
    DI_CHECK(s.num_draft_tokens == 0 ||
                 (s.num_draft_tokens == r.num_draft_tokens() && s.num_sample_rows == s.num_draft_tokens + 1),
             "request {}: the step verifies {} drafts with {} rows, but the request holds {} drafts", r.id(),
             s.num_draft_tokens, s.num_sample_rows, r.num_draft_tokens());
    DI_CHECK(s.num_tokens > 0 && s.start >= 0 && s.num_sample_rows >= 0 && s.num_sample_rows <= s.num_tokens,
             "request {}: invalid share of a step ({} tokens from {}, {} rows)", r.id(), s.num_tokens, s.start,
             s.num_sample_rows);
    PlannedSeq ps_seq;
    ps_seq.request_id = r.id();
    ps_seq.start = s.start;
    ps_seq.num_tokens = s.num_tokens;
    ps_seq.token_begin = plan.num_tokens();
    ps_seq.row_begin = plan.num_rows();
    ps_seq.num_rows = s.num_sample_rows;
    const int32_t kv_len = ps_seq.kv_len();
    DI_CHECK(kv_len <= r.total_tokens(), "request {}: step reaches position {} of a sequence of {} tokens", r.id(),
             kv_len - 1, r.total_tokens());
    for (int32_t p = s.start; p < kv_len; ++p) {
      if (p < r.num_tokens()) {
        plan.tokens.push_back(TokenSource::host(r.token_at(p)));
      } else if (r.num_draft_tokens() > 0) {
        // A request with drafts has nothing in flight: the drafts follow its known tokens.
        const auto k = static_cast<size_t>(p - r.num_tokens());
        DI_CHECK(k < r.draft_ids.size(), "request {}: token {} is past its drafts", r.id(), p);
        plan.tokens.push_back(TokenSource::host(r.draft_ids[k]));
      } else {
        const auto k = static_cast<size_t>(p - r.num_tokens());
        DI_CHECK(k < r.inflight.size() && r.inflight[k].slot >= 0 && r.inflight[k].row >= 0,
                 "request {}: token {} is neither known nor in flight", r.id(), p);
        plan.tokens.push_back(TokenSource::sampled(r.inflight[k]));
      }
    }
    const auto seq_index = static_cast<int32_t>(plan.seqs.size());
    for (int32_t j = 0; j < s.num_sample_rows; ++j) {
      plan.rows.push_back({seq_index, s.num_tokens - s.num_sample_rows + j, sampling(r, j)});
    }
    add_sequence_pages(plan, kv, r.id(), s.start, kv_len);
    plan.seqs.push_back(ps_seq);
  }
  return plan;
}

void add_sequence_pages(StepPlan& plan, const KvCacheManager& kv, uint64_t request_id, int32_t start, int32_t kv_len) {
  const KvLayout& layout = kv.layout();
  const int32_t ps = kv.block_size();
  DI_CHECK(static_cast<int32_t>(plan.groups.size()) == layout.num_groups(), "step plan has {} KV groups of {}",
           plan.groups.size(), layout.num_groups());
  const SequenceKv& tables = kv.tables(request_id);
  const int32_t n_pages = (kv_len + ps - 1) / ps;
  for (int32_t g = 0; g < layout.num_groups(); ++g) {
    const GroupTable& t = tables.groups[static_cast<size_t>(g)];
    const int32_t window = layout.groups[static_cast<size_t>(g)].window;
    DI_CHECK(n_pages <= static_cast<int32_t>(t.blocks.size()), "request {}: needs {} KV pages in group {} but holds {}",
             request_id, n_pages, g, t.blocks.size());
    // A window reads from i - W + 1, but never before an SWA replay's start.
    const int32_t first_read = window > 0 ? std::max({start - window + 1, tables.replay_start, 0}) : 0;
    DI_CHECK(t.num_released * ps <= first_read, "request {}: group {} released position {} that the step still reads",
             request_id, g, first_read);
    GroupPages& gp = plan.groups[static_cast<size_t>(g)];
    gp.pages.insert(gp.pages.end(), t.blocks.begin() + t.num_released, t.blocks.begin() + n_pages);
    gp.indptr.push_back(static_cast<int32_t>(gp.pages.size()));
    gp.first_pos.push_back(t.num_released * ps);
  }
}

}  // namespace deepinfer
