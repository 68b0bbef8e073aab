// Engine: the step loop. Owns what build_engine() made (model, KV cache and
// its manager, scheduler, runner) and the requests; takes requests as token
// ids with sampling parameters and returns per-step outputs (new tokens and
// text, from each request's OutputProcessor). Single-threaded: the caller
// drives step(); AsyncEngine/servers wrap it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine_builder.h"
#include "engine/engine_config.h"
#include "engine/request_output.h"
#include "engine/speculator.h"
#include "kv/tiers/kv_tiers.h"
#include "kv/transport/kv_transport_stats.h"
#include "model/model_config.h"
#include "sched/request.h"
#include "sched/scheduled_batch.h"
#include "runner/sampler.h"

namespace deepinfer {

struct StepPlan;
class GlooCommunicator;
class MtpProposer;
namespace cpu {
class ThreadPool;
}
namespace structured {
class GrammarCompiler;
struct CompiledGrammar;
}  // namespace structured

struct EngineStats {
  size_t num_running = 0;
  size_t num_waiting = 0;
  double kv_usage = 0;
  int64_t num_preemptions = 0;
  int64_t numerical_faults = 0;  // requests ended because their logits allowed no token
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t steps = 0;
  // Data parallelism: steps that ran one padding token for the group's
  // collectives (no work of this rank's own), and group votes held.
  int64_t padding_steps = 0;
  int64_t group_votes = 0;
  // Sampling rows whose logits were copied to the host (host sampling, logprobs).
  int64_t logits_rows_copied = 0;
  // Device timeline (from events around every step): time the device spent
  // on steps, and idle between the end of one step and the start of the next.
  int64_t timed_steps = 0;
  int64_t graph_steps = 0;
  // Steps some of whose sequences ran padded to the longest (verify steps of
  // several draft lengths in a graph's shape).
  int64_t steps_with_padded_seqs = 0;
  // Graphs captured (each the first step of its shape) and the host time
  // the captures took: one-time work inside the timeline above.
  int64_t graph_captures = 0;
  double graph_capture_ms = 0.0;
  double device_busy_ms = 0.0;
  double device_idle_ms = 0.0;
  double device_idle_max_ms = 0.0;
  double last_step_device_ms = 0.0;  // the most recently completed step
  double last_step_idle_ms = -1.0;   // negative when unknown
  // EPLB simulation (--eplb-ep-size): moe_lb (max rank load / mean) averaged
  // over MoE layers, over the statistics window, for the current placement and
  // for the contiguous placement without redundancy.
  bool eplb = false;
  double moe_lb = 1.0;
  double moe_lb_contiguous = 1.0;
  int64_t eplb_replacements = 0;
  // Structured output: compilations by outcome (the compiler's cache hits
  // included), and rows masked with the host time spent filling their masks.
  int64_t grammar_compiled = 0;
  int64_t grammar_cache_hits = 0;
  int64_t grammar_invalid = 0;
  int64_t grammar_timed_out = 0;
  int64_t grammar_masked_rows = 0;
  double grammar_mask_ms = 0.0;
  // Speculative decoding (when configured).
  bool speculative = false;
  SpecDecodeStats spec;
  // KV tiers below the device (--kv-offloading-size, --kv-cache-dir).
  bool kv_tiers = false;
  int64_t tier_hit_tokens = 0;  // prompt tokens loaded from the tiers instead of computed
  KvTierStats tiers;
  // Serving KV to other nodes' engines (--kv-transport ucx, prefill role).
  bool kv_export_server = false;
  KvExportServerStats kv_export;
};

// Finished-request facts for callers that report timings.
struct RequestSummary {
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  // Speculative decoding: draft tokens verified, and accepted, for this request.
  int64_t num_verifications = 0;  // steps that verified drafts of it
  int64_t num_verified_drafts = 0;
  int64_t num_accepted_drafts = 0;
  RequestTimings timings;
};

class Engine {
 public:
  explicit Engine(EngineConfig config);
  ~Engine();

  const Tokenizer& tokenizer() const { return *parts_.tokenizer; }
  const EngineConfig& config() const { return parts_.config; }
  int32_t max_model_len() const { return parts_.max_model_len; }
  // The KV tiers (null without --kv-offloading-size / --kv-cache-dir); other
  // threads may use only their thread-safe members (the export fence).
  const KvTiers* kv_tiers() const { return parts_.kv_tiers.get(); }
  // Lets the KV tiers load from another engine's shared pool (KvTiers::attach_peer;
  // thread-safe). False without tiers that import.
  bool attach_kv_peer(std::string_view pool_name) {
    return parts_.kv_tiers != nullptr && parts_.kv_tiers->attach_peer(pool_name);
  }
  int32_t vocab_size() const;
  const ModelConfig& model_config() const;

  // Validates and queues one sequence (params.n must be 1; callers fan out n).
  // Throws deepinfer::Error (ParamError for sampling parameters) on bad input.
  // kv_source: the engine that computed the prompt's KV on another node
  // (ucx://host:port, from a prefill engine's answer), fetched before the
  // request runs where the tiers fetch remotely (--kv-transport ucx).
  // first_sample_position: Request::sample_position_base (a draft model's request).
  uint64_t add_request(std::vector<int32_t> prompt_ids, SamplingParams params, std::string cache_salt = {},
                       std::string_view kv_source = {}, int32_t first_sample_position = 0);
  // Compiles (or finds in the cache) a structured-output constraint; throws
  // ParamError when it is invalid or too costly to compile. Thread-safe, so a
  // server checks a request's schema in its handler before submitting it;
  // add_request then finds it compiled.
  std::shared_ptr<const structured::CompiledGrammar> compile_grammar(const StructuredOutputs& so) const;
  // Stops a request now, freeing its KV; its final output comes from the next step().
  void abort(uint64_t request_id);

  // One scheduling step. With the pipelined step loop (the default; config
  // zero_overhead_scheduling) it launches step N and then finishes step N-1,
  // whose outputs it returns, so the device never waits for the host.
  std::vector<RequestOutput> step();
  bool has_unfinished() const { return !requests_.empty(); }
  // Data parallelism (--data-parallel-size > 1): this rank and its group.
  // Unless they are independent replicas, the ranks step together (a vote
  // before every step), so a rank keeps calling step() while group_busy(), its
  // own requests done or not; an idle group's step() only votes. `control`
  // carries the commands' own exchanges between ranks (inputs, outputs, URLs),
  // never during a step().
  struct DataParallelRank {
    int rank = 0;
    int size = 1;
    GlooCommunicator* control = nullptr;
    // The ranks vote before every step (false: independent replicas,
    // EngineConfig::data_parallel_independent_replicas).
    bool steps_together = true;
  };
  std::optional<DataParallelRank> data_parallel() const;
  // Some rank of the group had work at the last vote (false without a group).
  bool group_busy() const { return group_busy_; }
  // Some rank voted that it is leaving (drain_group) at the last vote: the
  // group is stopping, and a server rank should stop too (false without a group).
  bool group_leaving() const { return group_leaving_; }
  // Marks this rank as leaving and steps until every rank of the group is
  // leaving and none has work (own requests finished first); all ranks
  // return after the same vote, so a group stopped on every rank (a
  // launcher's SIGTERM) ends cleanly.
  void drain_group();
  bool pipelined() const { return parts_.config.zero_overhead_scheduling; }

  // Summary of a request that finished in the last step() (valid until the next step).
  std::optional<RequestSummary> summary(uint64_t request_id) const;
  EngineStats stats() const;
  // Throws if the KV bookkeeping is inconsistent; with no requests in flight
  // every block must be free.
  void check_integrity() const;

  // Runs one forward step over a synthetic batch, for benchmarks and cost-model fitting.
  double time_prefill_step(int32_t num_new_tokens, int32_t num_cached_tokens) {
    return time_step(1, num_new_tokens, num_cached_tokens, 1);
  }
  // num_seqs sequences of num_cached_tokens cached and num_new_tokens new
  // tokens each, the last rows_per_seq of which are sampled (a verify step of
  // rows_per_seq - 1 drafts when num_new_tokens == rows_per_seq). Seconds.
  double time_step(int32_t num_seqs, int32_t num_new_tokens, int32_t num_cached_tokens, int32_t rows_per_seq);

 private:
  struct Live;  // a request plus its output processor and device-side penalty state
  // A launched step waiting for its results.
  struct InflightStep;
  InflightStep launch(const ScheduledBatch& batch);
  // The step's batch; in a data-parallel group after the group's vote on the
  // step's type, setting group_busy_ and group_forward_.
  ScheduledBatch schedule();
  // A forward of one padding token: a data-parallel rank without work of its
  // own in a step its group's MoE collectives need it in.
  InflightStep launch_padding();
  // Waits for the step's results and turns them into outputs; rows of
  // requests that finished, were aborted or were preempted meanwhile are dropped.
  void complete(const InflightStep& step, std::vector<RequestOutput>& outputs);
  SampleResult sample_on_host(Live& live, std::span<const float> logits);
  // Fills the token masks of the launched step's grammar-constrained rows
  // from their requests' grammar states and lets the runner sample them.
  void fill_token_masks(const InflightStep& step);
  // The row's token (sampled here, or `device_token` from the device) into
  // `result`; a non-empty message when the logits allow no token.
  std::string sample_row(Live& live, std::span<const float> logits, bool host_sample, int32_t device_token,
                         SampleResult& result);
  // The row's token appended to the request (its output into `outputs`);
  // the request may finish on it. Returns the token, or -1 after a numerical fault.
  int32_t append_row(Live& live, std::span<const float> logits, bool host_sample, int32_t device_token,
                     std::vector<RequestOutput>& outputs);
  // Drafts for the requests that are decoding with nothing in flight.
  void propose_drafts();
  // Plain (pipelined) steps: the proposer catches up on new tokens a little each step.
  void keep_proposer_up();
  // The step that still uses a finishing request's KV blocks, if any.
  std::optional<uint64_t> newest_inflight_step() const;
  // KV tiers: a new request whose prefix is on disk, or on the node kv_source
  // names, waits while it is read.
  void start_kv_prefetch(Request& r, std::string_view kv_source);
  void calibrate_kv_tiers();
  void poll_kv_prefetches();
  void finish(Live& live, FinishReason reason, RequestOutput& out);
  std::unique_ptr<spec::Proposer> make_proposer();
  // MTP: the completed step's sequences, with the tokens that follow what it computed.
  void observe_for_mtp(const InflightStep& step);
  // After an EPLB re-placement: with expert parallelism the model's experts
  // move to the new placement on every rank.
  void move_experts();

  EngineParts parts_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Speculator> speculator_;  // null without speculative decoding
  MtpProposer* mtp_ = nullptr;              // speculator_'s proposer with the "mtp" method
  int64_t prompt_tokens_computed_ = 0;      // prompt tokens launched (the speculation switch's measure)
  size_t keep_up_cursor_ = 0;               // keep_proposer_up's rotation
  double capture_s_since_progress_ = 0.0;  // graph captures of completed steps since the switch last heard
  // Structured output's grammar compiler, made on first use (building its
  // vocabulary index takes a moment), from any thread.
  mutable std::once_flag grammar_once_;
  mutable std::shared_ptr<structured::GrammarCompiler> grammar_compiler_;
  // Set once grammar_compiler_ exists, for readers that must not create it (stats()).
  mutable std::atomic<bool> grammar_ready_{false};
  // Fills the token masks of large batches in parallel (made on first use).
  std::unique_ptr<cpu::ThreadPool> mask_pool_;

  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Live>> requests_;
  std::vector<uint64_t> aborted_;
  std::vector<uint64_t> kv_loading_;  // requests whose prefix the disk tier is reading
  std::unordered_map<uint64_t, RequestSummary> finished_summaries_;
  EngineStats stats_;
  uint64_t next_step_id_ = 1;
  std::unique_ptr<InflightStep> inflight_;  // the launched step not yet completed (pipelined loop)
  bool group_busy_ = false;     // data parallel: some rank had work at the last vote
  bool leaving_ = false;        // data parallel: this rank votes `leaving` (drain_group)
  bool group_leaving_ = false;  // data parallel: some rank voted `leaving` at the last vote
  bool group_all_leaving_ = false;
  bool group_forward_ = false;  // data parallel with experts: every rank runs this step's forward
};

}  // namespace deepinfer
