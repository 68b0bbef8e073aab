// GroupVote: the step type of a data-parallel group whose ranks share an
// expert-parallel MoE layer. Each rank schedules its own requests, but every
// step all ranks must run the same kind of step (prefill or decode), or the
// MoE layer's collectives would not meet. Each rank calls, every step:
//
//   StepType t = vote.propose(local);          // one collective: the vote
//   if (t == StepType::Prefill) {
//     bool got = <schedule a prefill for real>; // may fail: no KV memory
//     GroupVote::Decision d = vote.confirm(got); // one collective: the confirm
//     // d.type == Prefill: run a prefill step, an empty one if d.empty_step.
//     // d.type == Decode: no rank got prefill work; run a decode step.
//   }
//
// Whether a confirm round happens is derived from the vote alone, which every
// rank has gathered, so all ranks agree on it: at most two small collectives
// a step, one when the vote says Decode. Every decision is a pure function of
// the gathered values and of state every rank updates identically (the step
// count, the last prefill vote), so the ranks never diverge.
//
// Modes (SPEC §2):
// - ALL: the group prefills when every rank is ready: it has prefill work
//   waiting, or it has nothing at all (no waiting work, no decodes) — a rank
//   with nothing to lose never holds the group back. So that a rank's waiting
//   prompt does not wait on another rank's long decode forever, the prefill is
//   forced once some rank's work has waited all_max_wait_steps steps.
// - ANY: any rank's waiting work triggers a group prefill; the ranks without
//   work run an empty prefill step.
//
// The trigger interval of a mode is how many steps apart the group may hold
// prefill votes that pass: after a step whose vote said Prefill (whether or
// not the confirm found work), the next vote may say Prefill no earlier than
// `interval` steps later. 1 = every step; ANY's larger default keeps a stream
// of arrivals on many ranks from interrupting the group's decodes every step.
// The interval exists to protect running decodes, so it is waived when no rank
// has any: an idle group prefills at once.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deepinfer {

enum class VoteMode : uint8_t { All, Any };

enum class StepType : uint8_t { Decode, Prefill };

const char* vote_mode_name(VoteMode m);

struct GroupVoteConfig {
  VoteMode mode = VoteMode::Any;
  // Minimum steps between two passing prefill votes, per mode (see above).
  // ALL waits for every rank anyway, so it may prefill every step it is due.
  int32_t all_interval_steps = 1;
  // At most one group prefill in 4 steps: an arrival waits at most 3 steps.
  int32_t any_interval_steps = 4;
  // ALL only: after this many consecutive steps in which some rank had prefill
  // work waiting without a group prefill, the group prefills without waiting
  // for the other ranks. 0 = wait for every rank however long it takes.
  int32_t all_max_wait_steps = 32;
};

// The one small collective a vote round needs: every rank's value, in rank
// order, on every rank. Called by every rank of the group in the same order.
// An implementation that cannot complete (a peer gone or late) must throw,
// never block forever.
class VoteChannel {
 public:
  virtual ~VoteChannel() = default;
  virtual std::vector<int64_t> all_gather(int64_t mine) = 0;
};

class GroupVote {
 public:
  // What this rank would do this step if it ran alone.
  struct LocalState {
    bool has_waiting_prefill = false;
    int64_t waiting_prefill_tokens = 0;  // reported to the group (waiting_tokens())
    bool has_running_decodes = false;
    // The rank is stopping: it takes no new work and leaves with the others
    // once every rank says so (Engine::drain_group). The others learn of it
    // from the vote and stop too: the group cannot step without it.
    bool leaving = false;
  };
  struct Decision {
    StepType type = StepType::Decode;
    // A prefill step in which this rank scheduled no prefill work: it runs the
    // step with no prefill tokens of its own, so the collectives stay aligned.
    bool empty_step = false;
  };
  // One rank's vote as the group saw it.
  struct RankVote {
    bool has_waiting_prefill = false;
    bool has_running_decodes = false;
    bool leaving = false;
    int64_t waiting_prefill_tokens = 0;
  };

  // Throws deepinfer::Error on a config it cannot honour (intervals < 1,
  // negative max wait).
  GroupVote(GroupVoteConfig config, VoteChannel& channel);

  // Every rank, every step: the group's tentative step type. Decode ends the
  // step's protocol; Prefill must be followed by confirm().
  StepType propose(const LocalState& local);
  // After a Prefill proposal and this rank's real scheduling: the group's step.
  Decision confirm(bool got_prefill_work);

  const GroupVoteConfig& config() const { return config_; }
  // Steps completed (each propose() that said Decode, each confirm()).
  int64_t step() const { return step_; }
  bool awaiting_confirm() const { return awaiting_confirm_; }
  // The latest vote of every rank, in rank order: for logs and metrics, and
  // for a planner that wants the ranks' prefill chunks of similar size.
  const std::vector<RankVote>& votes() const { return votes_; }
  int64_t waiting_tokens() const;
  // Whether some rank / every rank voted `leaving` in the latest vote.
  bool any_leaving() const;
  bool all_leaving() const;
  // Consecutive steps with prefill work waiting somewhere and no group prefill.
  int32_t waiting_steps() const { return waiting_steps_; }

 private:
  std::vector<int64_t> gather(int64_t payload, bool confirm_round);
  bool vote_passes() const;
  void finish_step(bool prefilled);

  GroupVoteConfig config_;
  VoteChannel& channel_;
  int64_t step_ = 0;
  bool awaiting_confirm_ = false;
  std::optional<int64_t> last_prefill_vote_step_;
  int32_t waiting_steps_ = 0;
  std::vector<RankVote> votes_;
};

}  // namespace deepinfer
