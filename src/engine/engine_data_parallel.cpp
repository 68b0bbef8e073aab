// The Engine's part in a data-parallel group (EngineConfig::data_parallel_size):
// the vote before each step that decides what the step may schedule and
// whether every rank runs a forward (sched/group_vote.h), and leaving the
// group together.
#include "core/error.h"
#include "dist/gloo_communicator.h"
#include "engine/engine.h"
#include "sched/group_vote.h"
#include "sched/scheduler.h"

namespace deepinfer {

ScheduledBatch Engine::schedule() {
  if (!parts_.group_vote) return parts_.scheduler->schedule();
  GroupVote& vote = *parts_.group_vote;
  const Scheduler& sched = *parts_.scheduler;
  GroupVote::LocalState local;
  // A request reading its prefix from a KV tier is prefill work to come.
  local.waiting_prefill_tokens = sched.pending_prompt_tokens() + static_cast<int64_t>(kv_loading_.size());
  local.has_waiting_prefill = local.waiting_prefill_tokens > 0;
  // A step in flight is work too: its results are read by a later step().
  local.has_running_decodes = sched.has_decodes() || inflight_ != nullptr;
  local.leaving = leaving_;
  ScheduledBatch batch;
  bool prefill = false;
  const StepType proposed = vote.propose(local);
  ++stats_.group_votes;
  if (proposed == StepType::Prefill) {
    batch = parts_.scheduler->schedule(true);
    // No rank got prefill work (no KV memory): the group decodes, and this
    // rank's batch, which then holds no prompt chunk, is its decode step.
    prefill = vote.confirm(batch.num_prompt_tokens > 0).type == StepType::Prefill;
  } else {
    batch = parts_.scheduler->schedule(false);
  }
  bool decodes = false, waiting = false;
  for (const GroupVote::RankVote& v : vote.votes()) {
    decodes = decodes || v.has_running_decodes;
    waiting = waiting || v.has_waiting_prefill;
  }
  group_busy_ = decodes || waiting;
  group_leaving_ = vote.any_leaving();
  group_all_leaving_ = vote.all_leaving();
  // With experts spread over the group, every rank runs the forward of a step
  // in which any rank computes something (the MoE layers' collectives); all
  // ranks derive this from the same gathered votes.
  group_forward_ = parts_.config.enable_expert_parallel && (prefill || decodes);
  DI_CHECK(batch.empty() || prefill || decodes,
           "data parallel: rank {} scheduled {} tokens in a step its group voted empty",
           parts_.data_parallel_group->rank(), batch.num_tokens);
  return batch;
}

std::optional<Engine::DataParallelRank> Engine::data_parallel() const {
  const GlooCommunicator* group = parts_.data_parallel_group.get();
  if (group == nullptr) return std::nullopt;
  return DataParallelRank{group->rank(), group->size(), parts_.data_parallel_group.get(),
                          parts_.group_vote != nullptr};
}

void Engine::drain_group() {
  if (!parts_.group_vote) return;
  // Every rank votes at least once here, so that a rank that had no work
  // (and never stepped) meets the others' votes; all ranks leave after the
  // same vote, the first in which every rank is leaving and none has work
  // (a rank still serving keeps the leaving ones stepping, padding steps
  // included, until it leaves too). The outputs are of this rank's own
  // requests, if any are left, which the caller no longer reads.
  leaving_ = true;
  do {
    step();
  } while (has_unfinished() || group_busy_ || !group_all_leaving_);
  // Every rank left at this vote: the group may start over (a second
  // LLM::generate) with nobody leaving.
  leaving_ = group_leaving_ = group_all_leaving_ = false;
}

}  // namespace deepinfer
