// CpuBackend::apply_penalties: each row's sorted entries in one pass, noting
// whether the pending token has one. Rows touch few logits, so one thread.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_penalties.h"
#include "backend/cpu/rows.h"
#include "core/error.h"

namespace deepinfer::cpu {

void CpuBackend::apply_penalties(Tensor logits, const Tensor& params, const Tensor& entries,
                                 const Tensor& pending_tokens) {
  const Rows rows(logits);
  const int64_t vocab = rows.cols();
  const auto* row_params = static_cast<const PenaltyRowParams*>(params.data());
  const auto* all = static_cast<const PenaltyEntry*>(entries.data());
  const int64_t n_entries = entries.size(0);
  const int64_t n_pending = pending_tokens.defined() ? pending_tokens.size(0) : 0;
  const auto* pending_ids = n_pending > 0 ? pending_tokens.data_as<const int32_t>() : nullptr;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const PenaltyRowParams& p = row_params[r];
    DI_CHECK(p.entries_begin >= 0 && p.entries_begin <= p.entries_end && p.entries_end <= n_entries,
             "apply_penalties: row {} entries [{}, {}) outside the list of {}", r, p.entries_begin, p.entries_end,
             n_entries);
    DI_CHECK(p.pending >= -1 && p.pending < n_pending, "apply_penalties: row {} pending index {} outside [0, {})", r,
             p.pending, n_pending);
    const int32_t pending = p.pending >= 0 ? pending_ids[p.pending] : -1;
    DI_CHECK(pending < vocab, "apply_penalties: row {} pending token {} outside the vocabulary [0, {})", r, pending,
             vocab);
    float* x = rows.row(r);
    const PenaltyEntry* begin = all + p.entries_begin;
    const PenaltyEntry* end = all + p.entries_end;
    bool pending_has_entry = false;
    for (const PenaltyEntry* e = begin; e != end; ++e) {
      DI_CHECK(e->token >= 0 && e->token < vocab, "apply_penalties: row {} token id {} outside the vocabulary [0, {})",
               r, e->token, vocab);
      DI_CHECK(e == begin || e[-1].token < e->token, "apply_penalties: row {} entries are not sorted by token id", r);
      const bool masked = p.mask_min_tokens != 0 && (e->flags & kPenaltyMinTokensMask) != 0;
      const bool is_pending = e->token == pending;
      pending_has_entry |= is_pending;
      x[e->token] = penalise_logit(x[e->token], p, e->flags, e->bias, masked, e->output_count + (is_pending ? 1 : 0));
    }
    // A pending token without an entry: a first output occurrence.
    if (pending >= 0 && !pending_has_entry) x[pending] = penalise_logit(x[pending], p, 0, 0.0f, false, 1);
  }
}

}  // namespace deepinfer::cpu
