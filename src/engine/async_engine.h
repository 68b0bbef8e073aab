// AsyncEngine: an Engine driven by its own thread, for callers on other
// threads (the HTTP server). Requests are submitted in groups (the n samples of
// one API request are admitted or refused together); each request's outputs go
// to its sink, called on the engine thread right after the step that made them,
// so a sink must only hand the event on (e.g. post it to an I/O executor).
//
// Admission is bounded: at most max_num_seqs + max_waiting sequences are in
// flight; a group beyond that is refused at once (the server answers 429) rather
// than queued without limit. The loop sleeps on a condition variable when idle.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace deepinfer {

struct AsyncEngineOptions {
  size_t max_waiting = 1024;  // sequences admitted beyond --max-num-seqs
  // Runs on the engine thread once the engine is built, before its first
  // step: the place for a data-parallel rank's exchanges with its group over
  // Engine::data_parallel()'s control channel, which the steps use after it.
  // An exception there fails the loading.
  std::function<void(Engine&)> on_loaded;
  // A data-parallel rank whose group is idle votes again after at most
  // group_idle_poll, doubling while the group stays idle up to
  // group_idle_poll_max (a vote costs syscalls on every rank: an idle group
  // polling every 2 ms kept a fifth of a core busy per rank). New work on
  // another rank waits at most about that long for the group.
  std::chrono::microseconds group_idle_poll{2000};
  std::chrono::microseconds group_idle_poll_max{50000};
};

// One delivery to a request's sink.
struct EngineEvent {
  RequestOutput output;                   // output.request_id is the AsyncEngine id
  std::optional<RequestSummary> summary;  // set when output.finished
  std::string error;                      // the engine refused or lost the request (then finished)
  Clock::time_point time;                 // when the step that made it ended
};
using EngineSink = std::function<void(EngineEvent&&)>;

struct EngineSubmission {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;  // n must be 1
  std::string cache_salt;
  std::string kv_source;  // Engine::add_request's kv_source
  EngineSink sink;
};

enum class SubmitStatus : uint8_t { Accepted, QueueFull, ShuttingDown, NotReady };

struct SubmitResult {
  SubmitStatus status = SubmitStatus::NotReady;
  std::vector<uint64_t> ids;  // one per submission when accepted
};

struct AsyncEngineStats {
  EngineStats engine;     // as of the last step
  size_t num_in_flight = 0;  // admitted and not finished
  size_t num_queued = 0;     // admitted, not yet handed to the engine
};

class AsyncEngine {
 public:
  // Starts the engine thread, which loads the model; ready() tells when it has.
  AsyncEngine(EngineConfig config, AsyncEngineOptions options);
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Loaded and the loop is running.
  // Loaded, running and not draining: readiness turns false the moment a
  // graceful shutdown begins, so load balancers stop sending at once.
  bool ready() const { return state_.load() == State::Running && !draining_.load(); }
  bool draining() const { return draining_.load(); }
  // Loading failed or the loop died on an internal error.
  bool dead() const { return state_.load() == State::Dead; }
  // A data-parallel group that steps together is stopping: some rank is
  // leaving (Engine::group_leaving). This rank cannot step without it and
  // should shut down too; its loop leaves with the others once stopped.
  bool group_leaving() const { return group_leaving_.load(); }
  std::string error() const;
  // Blocks until the model is loaded or loading failed; returns ready().
  bool wait_until_loaded();
  // The engine, for its tokenizer and configuration (immutable and safe to use
  // from any thread); null until loaded.
  const Engine* engine() const { return loaded_.load() ? engine_.get() : nullptr; }

  // Engine::attach_kv_peer once loaded (a decode engine told where a
  // request's KV is); false before.
  bool attach_kv_peer(std::string_view pool_name) { return loaded_.load() && engine_->attach_kv_peer(pool_name); }

  SubmitResult submit(std::vector<EngineSubmission> group);
  // Stops a request; its KV is freed before the next step and its sink gets a
  // final Abort output. Unknown or finished ids are ignored.
  void abort(uint64_t id);

  AsyncEngineStats stats() const;

  // Graceful shutdown: refuses new requests, lets those in flight finish for up to
  // `timeout`, aborts the rest and stops the loop. Returns how many were aborted.
  size_t drain(std::chrono::duration<double> timeout);

 private:
  enum class State : uint8_t { Loading, Running, Dead, Stopped };
  struct Pending {
    uint64_t id;
    EngineSubmission submission;
  };
  void run(EngineConfig config);
  void loop();
  void fail_all(const std::string& message);
  void stop_loop();

  AsyncEngineOptions options_;
  std::unique_ptr<Engine> engine_;
  std::atomic<State> state_{State::Loading};
  std::atomic<bool> draining_{false};
  std::atomic<bool> group_leaving_{false};
  std::atomic<bool> loaded_{false};
  size_t capacity_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable wake_;      // engine thread: work arrived / stop
  std::condition_variable changed_;   // waiters: loaded / a request finished
  std::string error_;
  bool stop_ = false;
  bool abort_all_ = false;
  uint64_t next_id_ = 1;
  std::deque<Pending> pending_;
  std::vector<uint64_t> aborts_;
  size_t in_flight_ = 0;
  AsyncEngineStats stats_;

  // Engine thread only.
  struct Live {
    uint64_t engine_id;
    EngineSink sink;
  };
  std::unordered_map<uint64_t, Live> live_;            // AsyncEngine id -> request
  std::unordered_map<uint64_t, uint64_t> by_engine_id_;  // engine id -> AsyncEngine id

  std::thread thread_;
};

}  // namespace deepinfer
