// ModelRunner's private types and helpers, shared by its translation units
// (model_runner.cpp: buffers, launches, graphs and read-back;
// model_runner_staging.cpp: a step plan's layout and staging into the
// pinned input buffer).
#pragma once

#include <cstdint>
#include <vector>

#include "runner/model_runner.h"

namespace deepinfer {

namespace runner_detail {

inline constexpr int64_t kParamInts = static_cast<int64_t>(sizeof(SamplingRowParams) / sizeof(int32_t));
static_assert(sizeof(SamplingRowParams) % sizeof(int32_t) == 0);
inline constexpr int64_t kPenaltyParamInts = static_cast<int64_t>(sizeof(PenaltyRowParams) / sizeof(int32_t));
static_assert(sizeof(PenaltyRowParams) % sizeof(int32_t) == 0);

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace runner_detail

struct ModelRunner::Staged {
  Layout l;
  int32_t tokens = 0, seqs = 0, rows = 0;
  int32_t graph_q = 0;  // tokens per sequence of a graph step; 0: eager
  int32_t padded_seqs = 0;  // real sequences padded to graph_q tokens
  // Where sequence si's tokens start among the staged ones: graph_q each in
  // a graph's shape (the real ones first, then padding), the plan's otherwise.
  int32_t seq_begin(const StepPlan& plan, int32_t si) const {
    return graph_q > 0 ? si * graph_q : plan.seqs[static_cast<size_t>(si)].token_begin;
  }
  std::vector<int32_t> pages;  // listed page-table entries per KV group
  int32_t max_q = 0, max_kv = 0;
  int64_t penalty_entries = -1;  // entries staged for apply_penalties; -1: no row has penalties
  bool hidden_input = false;     // the plan has hidden rows (staged at l.hidden_rows)
};

}  // namespace deepinfer
