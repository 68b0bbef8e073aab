// StepPlan: one step as plain host data — what a model runner needs and
// nothing more. It names no Request: per sequence the query tokens (each id
// known on the host, or sampled on the device by an earlier step), their
// positions, the pages of every KV layer group, and the rows whose logits are
// sampled with their parameters. The engine builds it (step_plan_builder.h)
// from the scheduler's decision; a runner, on this rank or another, consumes it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "sched/request.h"

namespace deepinfer {

class PenaltyState;

// Where one query token's id comes from.
struct TokenSource {
  int32_t id = 0;     // the id, when known on the host
  DeviceToken device;  // else the earlier step's sampling row (device.slot >= 0)
  bool on_device() const { return device.slot >= 0; }
  static TokenSource host(int32_t id) { return {id, {}}; }
  static TokenSource sampled(DeviceToken d) { return {0, d}; }
};

// How one sampling row is sampled.
struct RowSampling {
  SamplingRowParams params;  // the device sampler's parameters for this row
  bool copy_logits = false;  // the host needs the row's logits (host sampling, logprobs)
  // Applied to the row's logits on the device before sampling (the copied
  // logits then hold the processed values); null: none. Must stay alive and
  // unchanged until the runner's launch() returns.
  const PenaltyState* penalties = nullptr;
  // A grammar constrains the row: the host fills its token bitmask after the
  // step is launched (ModelRunner::finish_launch), while the forward runs.
  bool token_mask = false;
};

struct PlannedSeq {
  uint64_t request_id = 0;
  int32_t start = 0;        // position of the first query token
  int32_t num_tokens = 0;   // query tokens: plan.tokens[token_begin, token_begin + num_tokens)
  int32_t token_begin = 0;
  int32_t row_begin = 0;    // sampling rows: plan.rows[row_begin, row_begin + num_rows)
  int32_t num_rows = 0;
  int32_t kv_len() const { return start + num_tokens; }
};

// A sampling row: the logits after query token `query` of sequence `seq`.
struct PlannedRow {
  int32_t seq = 0;
  int32_t query = 0;  // index among the sequence's query tokens
  RowSampling sampling;
};

// One KV group's page tables for the step, CSR over the plan's sequences:
// sequence s reads pages[indptr[s], indptr[s + 1]), the first of which starts
// at position first_pos[s] (pages a window released are not listed). Its
// last listed page holds position kv_len - 1.
struct GroupPages {
  std::vector<int32_t> indptr{0};
  std::vector<int32_t> pages;
  std::vector<int32_t> first_pos;
};

struct StepPlan {
  std::vector<PlannedSeq> seqs;
  std::vector<TokenSource> tokens;
  std::vector<PlannedRow> rows;
  std::vector<GroupPages> groups;  // one per KvLayout group
  int32_t page_size = 0;
  // Optional (an MTP layer's step): per query token, the row of
  // hidden_source (a device tensor [rows, hidden], e.g. a runner's
  // hidden_states of an earlier step) the model takes as its hidden input.
  Tensor hidden_source;
  std::vector<int32_t> hidden_rows;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_rows() const { return static_cast<int32_t>(rows.size()); }
  bool empty() const { return seqs.empty(); }
  // Every sequence computes one token and samples it (a decode step).
  bool decode_only() const;
  // The pages, of every group, that hold the step's new positions (those the
  // step writes KV into), sorted, each once.
  std::vector<int32_t> written_pages() const;
};

}  // namespace deepinfer
