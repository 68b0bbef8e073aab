// The group vote's collective (sched/group_vote.h) over a Gloo group: the
// votes are a few bytes of host data, so they travel on the host control
// plane, not on the device communicator the MoE layer uses. It lives in
// src/engine because src/sched does not link src/dist.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/group_vote.h"

namespace deepinfer {

class GlooCommunicator;

class GlooVoteChannel final : public VoteChannel {
 public:
  // Every rank of comm's group must vote through it, and nothing else may use
  // comm between a vote's rounds on one rank and another's (collectives are
  // matched by order). comm's timeout bounds each round; a late or gone peer
  // makes all_gather throw CommError.
  explicit GlooVoteChannel(GlooCommunicator& comm) : comm_(comm) {}

  std::vector<int64_t> all_gather(int64_t mine) override;

 private:
  GlooCommunicator& comm_;
};

}  // namespace deepinfer
