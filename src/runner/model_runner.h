// ModelRunner: turns a StepPlan into the model's inputs (flat token ids,
// positions, and per KV layer group the KV slots and CSR page tables), runs
// the forward pass and the
// device-side sampling, and brings the sampled tokens (and the logits rows the
// host asked for) back — without waiting: launch() only enqueues work, wait()
// blocks until a launched step's results are on the host.
//
// Steps rotate through kSlots slots of pinned staging memory, so the host can
// build and launch step N+1 while step N still runs (the Engine's pipelined step loop).
// A token sampled by step N that step N+1 consumes never visits the host on
// the way: its row in step N's device-side sampled-token array is the source
// of a device gather that fills step N+1's input ids (a TokenSource that
// names the step's slot and row).
//
// Steps whose sequences sample every token they compute — decode steps
// (q = 1) and speculative verify steps — run as CUDA graphs captured per
// (padded batch size, q, context bucket) when the backend supports them:
// padding sequences attend to the KV storage's padding page and store
// nothing. In a verify step whose requests verify different numbers of
// drafts, q is the longest sequence's tokens and each shorter one is padded
// at its end (when the padding is cheap: pads_shorter_sequences). Its padding
// tokens take the positions after its last and attend causally, so no real
// token sees them; they store their keys and values in the sequence's own
// last page, past its end (scratch that the next real tokens overwrite
// before reading, as rejected drafts' slots are), and nothing beyond it (the
// padding page stands in there). Their rows are computed, never sampled.
//
// Rows constrained by a grammar (RowSampling::token_mask) are sampled only
// after the host has filled their token bitmasks: launch() then enqueues the
// forward alone and returns, the host computes the masks while the device
// runs it (for the pipelined loop, after reading the previous step's tokens,
// which the masks depend on), and finish_launch() enqueues the masks' upload,
// ops::apply_token_bitmask and the sampling.
//
// Rows with a PenaltyState (logit_bias, min_tokens mask, penalties) are
// processed on the device before the device sampler (ops::apply_penalties):
// the step uploads each such row's entry list with its inputs, and a row
// whose last input token is still in flight names that token's place in the
// step's gathered input ids as its pending token, so the op sees the full
// history without the host knowing the token. Such rows need no logits copy
// and keep the pipeline full.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include "runner/penalty_state.h"
#include "runner/runner_rank.h"
#include "sched/step_plan.h"

namespace deepinfer {

struct RunnerLimits {
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 256;
  int32_t max_model_len = 8192;
  // Sampling rows one sequence may have in a step: 1, or 1 + the drafts a
  // speculative step verifies. With max_num_seqs and the token budget it
  // bounds the rows per step (the logits buffer).
  int32_t max_rows_per_seq = 1;
  bool use_graphs = true;  // when the backend supports them (--enforce-eager turns this off)
  // Testing: stage steps in the padded shapes CUDA graphs replay, and run them
  // eagerly, so that the padding is checked on backends without graphs.
  bool graph_shapes_eager = false;
  // Count each step's routed tokens per expert of every MoE layer on the
  // device and bring the counts back with the step's results (EPLB load
  // statistics). Off: no buffer, no op, no copy.
  bool count_experts = false;
  // Keep every step's final hidden states on the device (hidden_states()),
  // for a multi-token-prediction layer to read; and accept plans with a
  // hidden input (StepPlan::hidden_rows).
  bool hidden_states = false;
  // Bring back the probability of each sampled token (StepResults::probs).
  bool sampled_probs = false;
};

// A launched step's results, valid after wait() until the slot is reused.
struct StepResults {
  std::span<const int32_t> tokens;  // device-sampled token per sampling row, in batch order
  std::span<const float> logits;    // [rows with copy_logits, vocab], in batch order
  // Device time of the step, and the device's idle time between the end of
  // the previous step and the start of this one (negative when unknown).
  double device_ms = 0.0;
  double idle_ms_before = -1.0;
  bool graph = false;  // ran as a captured graph
  // Sequences that computed fewer tokens than the step's longest and ran
  // padded to it (a verify step in a graph's shape; see graph_shape).
  int32_t padded_seqs = 0;
  // The graph was captured by this step: device_ms includes the capture (host
  // work between the step's events), so it says nothing about the step's cost.
  bool captured = false;
  double capture_ms = 0.0;  // host time of that capture (begin to end, instantiation included)
  // With RunnerLimits::count_experts: i32[moe_layers x n_experts], row-major,
  // the step's routed (token, expert) choices; padding rows of graph batches
  // are not counted. Empty otherwise.
  std::span<const int32_t> expert_counts;
  // With RunnerLimits::sampled_probs: per sampling row, the probability of
  // its token under the row's (processed) logits; 0 for an unsampled row.
  std::span<const float> probs;
};

// The most sampling rows a step of these limits can have.
int32_t max_sampling_rows(int32_t max_num_batched_tokens, int32_t max_num_seqs, int32_t max_rows_per_seq);

class ModelRunner {
 public:
  static constexpr int kSlots = 3;

  ModelRunner(Model& model, Backend& backend, KvStorage& kv, RunnerLimits limits, RunnerRank rank = {});
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Enqueues the step and returns its slot. A token sampled by an earlier
  // step names that step's slot and its row (StepResults::tokens index).
  int launch(const StepPlan& plan);
  // A step of no sequence of this rank's own: one padding token (no KV
  // written, no row sampled) through the whole model, so that a
  // data-parallel rank with nothing to do joins its group's collectives.
  int launch_padding();
  // A launched step with token_mask rows waits for their masks: the i-th such
  // row (in plan order) has token_mask(slot, i), mask_words() int32s to fill
  // (bit t % 32 of word t / 32 set: token t allowed). finish_launch() then
  // enqueues the rest of the step; it must come before the next launch().
  int32_t num_masked_rows(int slot) const;
  std::span<int32_t> token_mask(int slot, int32_t i);
  void finish_launch(int slot);
  int32_t mask_words() const { return mask_words_; }
  // Whether a step of `seqs` sequences sampling all their tokens, the longest
  // of `longest` tokens and `tokens` in all, runs padded to the longest (as a
  // graph, or eagerly under graph_shapes_eager): tokens up to the longest
  // then cost nothing more (Speculator::set_padding_rule).
  bool pads_verify_step(int32_t seqs, int32_t longest, int64_t tokens) const;
  // Blocks until the step in `slot` has finished and its results are on the host.
  StepResults wait(int slot);

  // With RunnerLimits::hidden_states: the final hidden states of the step
  // launched in `slot`, [max tokens, hidden] by the step's token order (the
  // plan's), valid on the device's stream until the slot's next launch.
  Tensor hidden_states(int slot) const;

  Model& model() { return model_; }
  const RunnerLimits& limits() const { return limits_; }
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  // Rows of StepResults::expert_counts (0 unless counting).
  int32_t num_counted_moe_layers() const { return moe_layers_; }

 private:
  // Offsets (in int32 units) of the step inputs inside a slot's staging
  // memory, which mirrors the device-side input area byte for byte. They
  // depend only on the counts, so a padded graph batch always finds its
  // inputs at the same device addresses.
  struct GroupLayout {
    int64_t slots, kv_indptr, last_len, start_pos, kv_pages;
  };
  struct Layout {
    int64_t host_tokens, gather, positions, logit_rows, q_indptr, params, penalty_params, hidden_rows;
    std::vector<GroupLayout> groups;  // page lists last, max_kv_pages_ apart
  };
  struct Staged;
  // The shape of a step run as a graph: `seqs` sequences (padded) of q tokens
  // and q sampling rows each; seqs == 0: the step runs eagerly.
  struct GraphShape {
    int32_t seqs = 0;
    int32_t q = 1;
  };
  Layout layout(int32_t tokens, int32_t seqs, int32_t rows) const;
  // Fills the slot's staging with the plan (padded to the graph's shape).
  Staged stage(int slot, const StepPlan& plan, GraphShape graph);
  // launch() of a checked plan; `shape` pads it (graph: replayed as a graph).
  int launch_staged(const StepPlan& plan, GraphShape shape, bool graph);
  void stage_penalties(int slot, const StepPlan& plan, Staged& st);
  // graph_kv_len > 0: the inputs of a graph, whose attention plan must hold
  // for every context up to that length.
  ForwardInputs device_inputs(const Staged& staged, int32_t graph_kv_len) const;
  // Context-length bucket a decode graph is captured for (a few per batch
  // size, so short contexts do not pay for a plan sized for --max-model-len).
  int32_t graph_kv_bucket(int32_t max_kv_len) const;
  GraphShape graph_shape(const StepPlan& plan) const;
  // The captured batch size a step of `seqs` sequences of q tokens pads to; 0: none.
  int32_t graph_batch(int32_t seqs, int32_t q) const;
  // Whether a step whose sequences sample all their tokens, some fewer than
  // q, runs as the q graph with those padded (see graph_shape).
  bool pads_shorter_sequences(const StepPlan& plan, int32_t q, int64_t real_tokens) const;
  bool padding_allowed(int64_t padded_tokens, int64_t real_tokens) const;
  void ensure_logits_capacity(int slot, int64_t rows);
  void ensure_mask_capacity(int slot, int64_t rows);
  // What launch() leaves for after the forward: penalties, token masks,
  // sampling and the copies back (see Slot::tail).
  void enqueue_sampling(int slot);
  // Room for `entries` penalty entries in the slot's staging and on the device.
  void ensure_penalty_capacity(int slot, int64_t entries);

  Model& model_;
  Backend& backend_;
  KvStorage& kv_;
  RunnerLimits limits_;
  RunnerRank rank_;
  int32_t max_rows_ = 0;          // logit rows per step
  int64_t staging_ints_ = 0;      // capacity of one slot's staging, in int32s
  int64_t sampled_ints_ = 0;      // kSlots * max_rows_, rounded up
  int32_t max_kv_pages_ = 0;      // page-table entries per step and KV group
  int32_t num_groups_ = 0;        // KV layer groups (KvStorage::layout)

  // Device: [kSlots * max_rows_ sampled tokens][step inputs (staging image)].
  Buffer step_dev_;
  Buffer token_ids_dev_;  // i32[max tokens]: the gathered input ids
  Buffer logits_dev_;     // f32[max_rows_, vocab]
  // The step's penalty entries (grown on demand; outside captured graphs, so
  // its address may change).
  Buffer penalty_entries_dev_;
  int64_t penalty_entries_capacity_ = 0;
  // Expert counting: one device count table every step zeroes and fills (a
  // fixed address, so captured graphs write it too) and a pinned zero image
  // the zeroing copies from.
  // Token masks of grammar-constrained rows: the row each mask applies to
  // and the masks themselves (grown on demand, outside captured graphs).
  int32_t mask_words_ = 0;
  Buffer mask_rows_dev_;  // i32[max_rows_]
  Buffer masks_dev_;      // i32[masks_capacity_, mask_words_]
  int64_t masks_capacity_ = 0;
  int32_t moe_layers_ = 0;
  int64_t count_cells_ = 0;  // moe_layers_ * n_experts
  Buffer counts_dev_;
  int32_t* counts_zero_host_ = nullptr;
  // Hidden states (RunnerLimits::hidden_states): the forward's input and
  // output at fixed addresses (graphs), and each slot's copy of the output.
  Buffer hidden_in_dev_, hidden_out_dev_;
  std::array<Buffer, kSlots> hidden_slots_dev_;
  Buffer probs_dev_;  // f32[max_rows_] (RunnerLimits::sampled_probs)

  struct Slot {
    int32_t* staging = nullptr;      // pinned
    int32_t* tokens_host = nullptr;  // pinned i32[max_rows_]
    float* logits_host = nullptr;    // pinned, grown on demand
    int32_t* counts_host = nullptr;  // pinned i32[count_cells_] when counting
    float* probs_host = nullptr;     // pinned f32[max_rows_] with sampled_probs
    PenaltyEntry* penalties_host = nullptr;  // pinned, grown on demand
    int32_t* mask_rows_host = nullptr;       // pinned i32[max_rows_], on first use
    int32_t* masks_host = nullptr;           // pinned [rows, mask_words_], grown on demand
    int64_t masks_capacity = 0;
    int64_t logits_rows_capacity = 0;
    int64_t penalty_entries_capacity = 0;
    std::unique_ptr<DeviceEvent> start, end;
    int32_t num_rows = 0, num_copied = 0;
    // The part of the step after the forward, as launch() planned it.
    struct Tail {
      int64_t params_at = 0, penalty_params_at = 0;  // int32 offsets in the step's device inputs
      int64_t penalty_entries = -1;                  // -1: no row has penalties
      int32_t tokens = 0;                            // the step's (padded) token count
      std::vector<int32_t> copy_rows;                // rows whose logits come back
      int32_t num_masks = 0;
      int32_t real_tokens = 0;                       // the plan's tokens (hidden states kept)
    } tail;
    bool awaiting_masks = false;
    bool in_flight = false, graph = false, captured = false;
    int32_t padded_seqs = 0;
    double capture_ms = 0.0;
    uint64_t sequence = 0;  // launch order
    int prev_slot = -1;     // slot of the step launched just before
  };
  std::array<Slot, kSlots> slots_;
  int next_slot_ = 0;
  uint64_t launches_ = 0;
  int last_launched_slot_ = -1;

  // By (padded batch, tokens per sequence, context bucket).
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::unique_ptr<OpGraph>> graphs_;
  std::vector<int32_t> graph_sizes_;
  int graphs_hidden_input_ = -1;  // whether captured graphs read a hidden input (-1: none captured)
};

}  // namespace deepinfer
