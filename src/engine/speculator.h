// Speculator: the engine's side of speculative decoding. Before a step it
// asks the proposer for drafts of the requests that are decoding, turns each
// draft token's raw confidence into a calibrated acceptance probability and,
// with the dynamic verify length on, keeps only the drafts whose expected
// gain is worth their verification time on the measured step-time curve
// (spec/verify_length.h). After a step it learns from what was accepted and
// how long the step took. Token-level verification itself happens in
// Engine::complete (a draft is accepted when the target samples it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "spec/acceptance_calibrator.h"
#include "spec/proposer.h"
#include "spec/speculation_switch.h"
#include "spec/speculative_config.h"
#include "spec/step_time_curve.h"

namespace deepinfer {
namespace cpu {
class ThreadPool;
}

class Request;

struct SpecDecodeStats {
  int64_t num_drafts = 0;           // verifications (requests x steps that verified drafts)
  int64_t num_proposed_tokens = 0;  // drafted by the proposer, before the verify-length choice
  int64_t num_draft_tokens = 0;     // verified
  int64_t num_accepted_tokens = 0;  // verified and accepted
  // acceptance_lengths[n]: verifications that accepted exactly n drafts.
  std::vector<int64_t> acceptance_lengths;
  // The dynamic policy's throughput switch: measurement windows so far, and
  // those that speculated.
  int64_t windows = 0;
  int64_t speculative_windows = 0;
  int64_t parallel_drafting_rounds = 0;  // rounds whose drafting ran on several threads
  // Steps the dynamic policy took without consulting the switch (speculation
  // left the device idle under SpeculativeConfig::switch_idle_share of the time).
  int64_t unswitched_steps = 0;
  // What the dynamic policy decided with, as of now: the step-time curve's
  // prediction (ms) for steps of 1 .. num_speculative_tokens + 1 tokens (a
  // batch-1 verify step's range; empty before any measurement) and the
  // measured cost of drafting beyond the device time.
  std::vector<double> small_step_ms;
  double drafting_overhead_ms = 0.0;
  // The curve's measured bins, (tokens, ms): what the choice read at the
  // batch's own step sizes.
  std::vector<std::pair<int32_t, double>> measured_step_ms;
};

class Speculator {
 public:
  // The proposer of config.method (the engine builds it: some run models).
  Speculator(spec::SpeculativeConfig config, std::unique_ptr<spec::Proposer> proposer);
  ~Speculator();
  const spec::SpeculativeConfig& config() const { return config_; }

  // Whether the next step should draft. Drafting costs the pipelined loop
  // (the step in flight is finished first); when the dynamic policy verified
  // nothing in its last round and the host's costs are not small
  // (host_costs_small), the engine keeps pipelining and only probes again
  // every kProbeInterval steps (fixed K always drafts). A probe
  // verifies at least each request's first draft, so that the calibration
  // keeps learning: one unlucky round must not switch drafting off for good.
  // Likewise every kProbeInterval-th drafting round verifies one draft more
  // per request than chosen, so positions the policy has cut keep being measured.
  // With the dynamic policy, a SpeculationSwitch first decides from measured
  // throughput whether this window of steps speculates at all, unless the
  // costs it exists for are absent: it guards against what the per-step
  // verify-length choice cannot see (host work that leaves the device idle:
  // drafting, planning around verification, steps without graphs), so while
  // speculative steps keep the device idle under config().switch_idle_share
  // of the time (default 5%; batch 1 on a GPU: 1-3%), the per-step choice
  // decides alone. Window rates also follow what the requests write, and at
  // batch 1 a stretch of poor drafts switched speculation off through the
  // copied spans that followed (fixed K = 5 ran 1.1-1.4x faster than the
  // switched policy on the H100).
  static constexpr int kProbeInterval = 8;
  bool should_propose();
  // Before every engine step: output tokens and computed prompt tokens so
  // far, the wall clock (seconds), the requests running, and the seconds
  // spent capturing graphs since the last call (the switch's measurements).
  void record_progress(int64_t output_tokens, int64_t prompt_tokens, double now_s, int32_t running,
                       double one_time_s);
  // Between drafting rounds (plain steps, pipelined): gives the proposer up
  // to max_tokens of the tokens it has not seen, so that the next drafting
  // round does not stall on a backlog (a suffix tree takes ~4 us per token).
  void keep_up(std::span<const Request* const> requests, int64_t max_tokens);
  // Sets draft_ids of each candidate (requests decoding with nothing in
  // flight or being verified, in a stable order); base_tokens: the step's
  // other query tokens (about one per running request).
  void propose(std::span<Request* const> candidates, int32_t base_tokens);
  // Whether the runner runs a verify step of `seqs` sequences, the longest of
  // `longest` tokens and `tokens` in all, padded to the longest (a CUDA graph
  // of small enough a model: ModelRunner::pads_verify_step). Drafts up to
  // the longest verified length then cost nothing, and the dynamic policy
  // verifies them too. Unset: no step is padded.
  using PaddingRule = std::function<bool(int32_t seqs, int32_t longest, int64_t tokens)>;
  void set_padding_rule(PaddingRule pads) { pads_ = std::move(pads); }
  // A verification ended: of `verified` drafts the first `accepted` were;
  // `rejected` when the next one was sampled differently (not when the
  // request ended first, by a stop, its length or a fault).
  void record_verification(const Request& r, int32_t verified, int32_t accepted, bool rejected);
  // A completed step: its query tokens, device time, the device's idle time
  // before it (negative: unknown), and whether it was planned after drafting
  // (which finishes the step before it first, so that idle is host work).
  void record_step(int32_t tokens, double device_ms, double idle_ms_before, bool drafting);
  // Idle before a drafting step beyond the idle before a pipelined one (ms).
  double drafting_overhead_ms() const;
  void finish(uint64_t request_id);

  SpecDecodeStats stats() const;
  const spec::StepTimeCurve& curve() const { return curve_; }

 private:
  struct Tracked {
    int32_t fed = 0;                     // tokens of the request given to the proposer
    std::vector<float> raw_confidence;   // of the drafts being verified
  };
  // Gives the proposer the tokens of r it has not seen; returns how many.
  int64_t feed(const Request& r);
  // feed() in two halves: start() for a request new to the proposer (one
  // thread: its request table changes), then the appends, which may run for
  // different requests at once.
  Tracked& start_if_new(const Request& r, int64_t& fed);
  int64_t append_new(const Request& r, Tracked& t);
  // The threads to draft `candidates` requests with; nullptr: this thread.
  cpu::ThreadPool* drafting_pool(size_t candidates);
  bool switched() const { return config_.dynamic && config_.switch_window_steps > 0; }
  // Whether speculating steps are measured to leave the device idle under
  // config().switch_idle_share of the time: the host's costs of speculating
  // (drafting, the pipelining it gives up, planning around verification) are
  // then small, and neither the switch nor backing off after a round that
  // verified nothing is needed.
  bool host_costs_small() const;
  // Whether the current steps may speculate: no switch, the switch not
  // consulted (host_costs_small), or its window speculating.
  bool speculating_window() const;

  spec::SpeculativeConfig config_;
  std::unique_ptr<spec::Proposer> proposer_;
  spec::AcceptanceCalibrator calibrator_;
  spec::StepTimeCurve curve_;
  spec::SpeculationSwitch switch_;
  std::unordered_map<uint64_t, Tracked> tracked_;
  SpecDecodeStats stats_;
  std::vector<spec::Draft> drafts_;  // this round's proposals, per candidate
  PaddingRule pads_;
  std::unique_ptr<cpu::ThreadPool> pool_;  // drafting threads, made on first use
  int64_t last_round_drafts_ = 1;  // drafts the last propose() left to verify
  int steps_since_probe_ = 0;
  bool probing_ = false;  // this round drafts because the probe interval passed
  int64_t rounds_ = 0;    // drafting rounds with a dynamic choice
  // Mean idle before drafting and before pipelined steps (EWMA; < 0: none seen).
  double idle_drafting_ms_ = -1.0, idle_pipelined_ms_ = -1.0;
  // Mean device time and idle before it of steps taken while speculating (EWMA; idle < 0: none seen).
  double speculating_busy_ms_ = 0.0, speculating_idle_ms_ = -1.0;
};

}  // namespace deepinfer
