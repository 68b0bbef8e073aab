// SpeculationSwitch: decides, from measured throughput, whether the engine
// speculates at all. The dynamic verify length (verify_length.h) weighs each
// draft against the device's step-time curve, but speculation also costs what
// that model does not see: the pipelined loop is given up while drafting (the
// host's work between steps becomes device idle), proposers take host time,
// steps whose requests verify different draft lengths run without CUDA
// graphs. At large batches those costs can outweigh every accepted draft.
//
// So the engine runs in windows of a fixed number of steps, each either
// speculating or plain, and measures each window's output tokens per second
// of wall time. Each mode keeps an exponentially weighted mean of its
// windows' rates; the next window takes the better mode, except that the
// other mode is tried again every `explore` windows (a mode without a rate
// yet is tried first). Plain decoding counts as better only when it beats
// speculation by more than `plain_margin`: a window's rate also follows what
// the requests are writing (at batch 1, a stretch the proposer finds no
// drafts for runs nearly as plain decoding does, a hair slower), and without
// the margin such a stretch made speculation "lose" and kept it off, doubling
// its exploration interval, through the copied spans that follow, where it
// doubles the rate. Where speculation truly loses, it costs at most the
// margin. When the explored mode loses again, its interval doubles up to a
// bound (a saturated server pays at most one window in max_explore for
// re-checking that speculation still does not pay); when it wins, the
// interval resets. Rates are compared only between windows that
// produced tokens and were not dominated by prompt processing (more prompt
// tokens computed than kPrefillRatio times the outputs: a burst of new
// requests, whose window would count against whichever mode it fell to).
// One-time work inside a window (graph captures: tens of milliseconds in a
// window of a few hundred) is timed and taken out of the window's time, so
// that the mode that captured neither looks slow nor has to be measured
// again (discarding such windows instead left a mode unmeasured, and so
// chosen, for as long as its windows kept capturing new shapes).
//
// Throughput with and without speculation depends on the batch: rates,
// intervals and the current winner are kept per batch-size bucket (powers of
// two of the running requests at the window's start), so a server that goes
// from 256 requests to 1 finds speculation again without waiting out an
// interval learnt at 256. Speculation pays less as the batch grows, so a
// bucket where it has not measured plain decoding yet, below a bucket where
// speculation won, takes that bucket's verdict: its plain rate is estimated
// from its speculative rate and the larger bucket's ratio of the two, until
// a re-check measures it. Otherwise a draining batch (requests finishing one
// by one at different steps) would spend a plain window in every bucket it
// passes through, a tenth of a short run's windows.
#pragma once

#include <cstdint>

namespace deepinfer::spec {

struct SwitchConfig {
  int32_t window_steps = 24;   // engine steps per speculating window
  int32_t min_explore = 8;     // windows between explorations, at first
  int32_t max_explore = 128;   // ... and at most
  double alpha = 0.5;          // weight of a mode's newest window in its mean
  double plain_margin = 0.03;  // plain decoding wins only above (1 + this) x speculation's rate
  // Engine steps per plain window. Plain decoding's steps (the pipelined
  // loop, one token a request) vary little, so fewer of them measure its
  // rate; where speculation wins, each plain step spent measuring or
  // re-checking costs most of a step's tokens (a short run's one plain window
  // of 24 steps was ~10% of its steps, docs/benchmarks.md run 94).
  int32_t plain_window_steps = 8;
};

class SpeculationSwitch {
 public:
  explicit SpeculationSwitch(SwitchConfig config = {});

  // Whether the current window speculates.
  bool speculating() const { return speculating_; }
  // After every engine step: the engine's output tokens and computed prompt
  // tokens so far, the wall-clock time in seconds (any monotonic origin), the
  // requests running, and the seconds of one-time work (CUDA graph
  // captures) that fell into the step, which the window's time leaves out.
  void record_step(int64_t output_tokens, int64_t prompt_tokens, double now_s, int32_t running,
                   double one_time_s = 0.0);
  // Drops the open window unmeasured (its owner stopped consulting the
  // switch); the next record_step opens a new one.
  void pause() { window_open_ = false; }
  static constexpr int64_t kPrefillRatio = 4;

  // Mean output tokens per second of each mode's windows at a batch size (0
  // before any).
  double speculative_rate(int32_t running) const { return buckets_[bucket_of(running)].rate[1]; }
  double plain_rate(int32_t running) const { return buckets_[bucket_of(running)].rate[0]; }
  int32_t explore_interval(int32_t running) const { return buckets_[bucket_of(running)].explore; }
  // Whether plain_rate(running) is an estimate from a larger batch's verdict.
  bool plain_rate_estimated(int32_t running) const { return buckets_[bucket_of(running)].plain_estimated; }
  int64_t windows() const { return windows_; }
  int64_t speculative_windows() const { return speculative_windows_; }

  static constexpr int kBuckets = 16;
  static int bucket_of(int32_t running);

 private:
  struct Bucket {
    double rate[2] = {0.0, 0.0};  // [plain, speculative] tokens/s
    int32_t explore = 0;          // windows between explorations (0: min_explore)
    int32_t since_explore = 0;
    bool plain_estimated = false;  // rate[0] was taken from a larger bucket, not measured
  };
  // The nearest bucket above `bucket` with both rates measured, or nullptr.
  const Bucket* larger_measured(int bucket) const;
  bool speculation_wins(const Bucket& b) const;
  void end_window(int64_t output_tokens, int64_t prompt_tokens, double now_s);
  void open_window(int64_t output_tokens, int64_t prompt_tokens, double now_s, int32_t running);

  SwitchConfig config_;
  Bucket buckets_[kBuckets];
  bool speculating_ = true;  // the first window speculates
  bool window_open_ = false;
  bool exploring_ = false;   // the current window re-checks its bucket's losing mode
  double window_one_time_s_ = 0.0;  // one-time work inside the current window
  int window_bucket_ = 0;
  int32_t steps_in_window_ = 0;
  int64_t window_tokens_ = 0, window_prompt_tokens_ = 0;
  double window_start_s_ = 0.0;
  int64_t windows_ = 0, speculative_windows_ = 0;
};

}  // namespace deepinfer::spec
