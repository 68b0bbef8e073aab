// The Engine's private types, shared by its translation units (engine.cpp:
// requests and the step loop; engine_complete.cpp: sampling and completing a
// step's rows; engine_stats.cpp: statistics, integrity checks, timing steps).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/output_processor.h"
#include "runner/penalty_state.h"
#include "sched/request.h"
#include "structured/token_matcher.h"

namespace deepinfer {

struct Engine::Live {
  std::unique_ptr<Request> request;
  OutputProcessor output;
  bool abort_requested = false;
  // Logits processing done on the device (requests the host does not sample).
  std::optional<PenaltyState> penalties;
  // Structured output: the grammar state after the request's outputs, and
  // the same as a host-side processor for rows the host samples.
  std::optional<structured::TokenMatcher> grammar;
  std::unique_ptr<structured::GrammarLogitsProcessor> grammar_processor;

  Live(std::unique_ptr<Request> r, const Tokenizer& tok) : request(std::move(r)), output(request->params(), tok) {}
};

// One sampling row of a launched step, and what completing it needs.
struct StepRow {
  uint64_t request_id = 0;
  uint32_t generation = 0;
  bool host_sample = false;    // sampled on the host from the copied logits
  int32_t logits_index = -1;   // row in the copied logits, or -1
  int32_t mask_index = -1;     // the row's token mask in the runner (grammar), or -1
  // Rows of a step that verifies drafts: the request's num_drafts drafts give
  // num_drafts + 1 rows; row draft_index samples the token after draft
  // draft_index - 1 (row 0: after the last known token).
  int32_t num_drafts = 0;
  int32_t draft_index = 0;
};

struct Engine::InflightStep {
  uint64_t id = 0;
  int slot = -1;
  int32_t num_tokens = 0;
  bool drafting = false;  // planned after drafting (the step before it was finished first)
  // With MTP: the plan's sequences, for the catch-up after the step.
  struct Seq {
    uint64_t request_id = 0;
    uint32_t generation = 0;
    int32_t start = 0, num_tokens = 0, token_begin = 0;
  };
  std::vector<Seq> seqs;
  int32_t num_masks = 0;  // rows whose token masks the host fills after launch
  std::vector<StepRow> rows;
};

}  // namespace deepinfer
