// Scheduler: the request queues plus the two stages (CapacityScheduler, then
// BatchPlanner). schedule() returns the step's batch; commit() records what the
// step computed (the KV cache manager caches full blocks and releases pages
// windows have passed); finish() releases a request's memory.
#pragma once

#include <deque>
#include <optional>
#include <vector>

#include "sched/batch_planner.h"
#include "sched/capacity_scheduler.h"

namespace deepinfer {

struct SchedulerConfig {
  CapacityConfig capacity;
  PlannerConfig planner;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, KvCacheManager& kv);

  // Throws deepinfer::Error when the request could never fit the KV cache.
  void add(Request* request);
  // Without `prefill`, a decode-only step: no admissions, no prompt chunks
  // (the step type a data-parallel group voted for, sched/group_vote.h).
  ScheduledBatch schedule(bool prefill = true);
  // After the step was launched: advance num_computed_tokens.
  void commit(const ScheduledBatch& batch);
  // After the results of a step that verified the request's drafts were
  // read and its accepted tokens appended: the drafts are gone, and the K/V
  // of every token but the newest counts as computed (rejected drafts' slots
  // are rolled back; accepted ones enter the prefix cache).
  void accept_drafts(Request& request);
  // Removes a request from the queues and frees its pages (finish or abort).
  // When a step still in flight uses them (hold_until_step), they return to
  // the pool only once the KV manager's release_deferred() reports that step
  // complete.
  void finish(Request* request, std::optional<uint64_t> hold_until_step = std::nullopt);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  // Prompt tokens not computed yet, of waiting requests and of running ones
  // mid-prompt (what a prefill step could work on).
  int64_t pending_prompt_tokens() const;
  // A running request past its prompt (what a decode step works on).
  bool has_decodes() const;
  const SchedulerConfig& config() const { return config_; }

 private:
  SchedulerConfig config_;
  KvCacheManager& kv_;
  CapacityScheduler capacity_;
  BatchPlanner planner_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
};

}  // namespace deepinfer
