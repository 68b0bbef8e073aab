// Scheduler: the request queues plus the two stages (CapacityScheduler, then
// BatchPlanner). schedule() returns the step's batch; commit() records what the
// step computed (and registers newly filled blocks with the prefix cache);
// finish() releases a request's memory.
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
  // When every layer attends within this many tokens (0 = some layer sees the
  // whole context), blocks that fall out of the window are released early.
  int32_t sliding_window = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockPool& pool, PrefixCache* prefix_cache);

  void add(Request* request);
  ScheduledBatch schedule();
  // After the step ran: advance num_computed_tokens and cache full blocks.
  void commit(const ScheduledBatch& batch);
  // Removes a request from the queues and frees its blocks (finish or abort).
  // DeferredRelease: when a step still in flight uses the blocks
  // (hold_until_step), they return to the pool only once
  // release_deferred() reports that step complete.
  void finish(Request* request, std::optional<uint64_t> hold_until_step = std::nullopt);
  void release_deferred(uint64_t completed_step);
  size_t num_deferred_blocks() const;

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  const SchedulerConfig& config() const { return config_; }

 private:
  void register_full_blocks(Request& request);
  void release_out_of_window_blocks(Request& request);

  SchedulerConfig config_;
  BlockPool& pool_;
  PrefixCache* prefix_cache_;
  CapacityScheduler capacity_;
  BatchPlanner planner_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  struct DeferredBlocks {
    uint64_t step;
    std::vector<int32_t> blocks;
  };
  std::vector<DeferredBlocks> deferred_;
};

}  // namespace deepinfer
