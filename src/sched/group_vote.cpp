#include "sched/group_vote.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

namespace {

// One gathered int64 per rank per round:
//   bits 0-1   the round's flags (vote: waiting, running; confirm: got work)
//   bit  2     the round (0 vote, 1 confirm)
//   bits 3-10  the step number mod 256
//   bit  11    leaving (vote only)
//   bits 12-62 the waiting prefill tokens (vote only), saturated
// The round and step tag let every rank check that all ranks are in the same
// round of the same step: a rank that skipped or repeated a round would
// otherwise be read as a plausible vote, and the group would run on with
// mismatched collectives.
constexpr int64_t kWaitingBit = 1;
constexpr int64_t kRunningBit = 2;
constexpr int64_t kGotWorkBit = 1;
constexpr int64_t kFlagsMask = 3;
constexpr int64_t kConfirmRoundBit = 4;
constexpr int kStepTagShift = 3;
constexpr int64_t kStepTagMask = 0xff;
constexpr int64_t kLeavingBit = int64_t{1} << 11;
constexpr int kTokensShift = 12;
constexpr int64_t kMaxTokens = (int64_t{1} << 51) - 1;
constexpr int64_t kHeaderMask = (int64_t{1} << 11) - 1;

int64_t header(int64_t step, bool confirm_round) {
  return (confirm_round ? kConfirmRoundBit : 0) | ((step & kStepTagMask) << kStepTagShift);
}

}  // namespace

const char* vote_mode_name(VoteMode m) { return m == VoteMode::All ? "all" : "any"; }

GroupVote::GroupVote(GroupVoteConfig config, VoteChannel& channel) : config_(config), channel_(channel) {
  DI_CHECK(config_.all_interval_steps >= 1, "group vote: all_interval_steps must be at least 1, got {}",
           config_.all_interval_steps);
  DI_CHECK(config_.any_interval_steps >= 1, "group vote: any_interval_steps must be at least 1, got {}",
           config_.any_interval_steps);
  DI_CHECK(config_.all_max_wait_steps >= 0, "group vote: all_max_wait_steps must not be negative, got {}",
           config_.all_max_wait_steps);
}

std::vector<int64_t> GroupVote::gather(int64_t payload, bool confirm_round) {
  const int64_t mine = header(step_, confirm_round) | payload;
  std::vector<int64_t> all = channel_.all_gather(mine);
  DI_CHECK(!all.empty(), "group vote: the channel gathered no values");
  const int64_t expected = header(step_, confirm_round);
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t got = all[r] & kHeaderMask & ~kFlagsMask;
    DI_CHECK(all[r] >= 0 && got == expected,
             "group vote: rank {} is out of step (its {} round of step tag {}, this rank's {} round of step tag {})",
             r, (all[r] & kConfirmRoundBit) ? "confirm" : "vote", (all[r] >> kStepTagShift) & kStepTagMask,
             confirm_round ? "confirm" : "vote", step_ & kStepTagMask);
  }
  return all;
}

StepType GroupVote::propose(const LocalState& local) {
  DI_CHECK(!awaiting_confirm_, "group vote: propose() called while the group waits for confirm() of step {}", step_);
  DI_CHECK(local.waiting_prefill_tokens >= 0, "group vote: negative waiting prefill tokens ({})",
           local.waiting_prefill_tokens);
  const int64_t tokens = std::min(local.waiting_prefill_tokens, kMaxTokens);
  const int64_t payload = (local.has_waiting_prefill ? kWaitingBit : 0) |
                          (local.has_running_decodes ? kRunningBit : 0) | (local.leaving ? kLeavingBit : 0) |
                          (tokens << kTokensShift);
  const std::vector<int64_t> all = gather(payload, false);
  votes_.assign(all.size(), RankVote{});
  for (size_t r = 0; r < all.size(); ++r) {
    votes_[r].has_waiting_prefill = (all[r] & kWaitingBit) != 0;
    votes_[r].has_running_decodes = (all[r] & kRunningBit) != 0;
    votes_[r].leaving = (all[r] & kLeavingBit) != 0;
    votes_[r].waiting_prefill_tokens = all[r] >> kTokensShift;
  }
  if (vote_passes()) {
    last_prefill_vote_step_ = step_;
    awaiting_confirm_ = true;
    return StepType::Prefill;
  }
  finish_step(false);
  return StepType::Decode;
}

bool GroupVote::vote_passes() const {
  bool any_waiting = false, any_running = false, all_ready = true;
  for (const RankVote& v : votes_) {
    any_waiting |= v.has_waiting_prefill;
    any_running |= v.has_running_decodes;
    all_ready &= v.has_waiting_prefill || !v.has_running_decodes;
  }
  if (!any_waiting) return false;
  const int32_t interval = config_.mode == VoteMode::All ? config_.all_interval_steps : config_.any_interval_steps;
  const bool interval_elapsed = !last_prefill_vote_step_ || step_ - *last_prefill_vote_step_ >= interval;
  if (!interval_elapsed && any_running) return false;
  if (config_.mode == VoteMode::Any) return true;
  return all_ready || (config_.all_max_wait_steps > 0 && waiting_steps_ >= config_.all_max_wait_steps);
}

GroupVote::Decision GroupVote::confirm(bool got_prefill_work) {
  DI_CHECK(awaiting_confirm_, "group vote: confirm() without a prefill proposal at step {}", step_);
  const std::vector<int64_t> all = gather(got_prefill_work ? kGotWorkBit : 0, true);
  const bool any_got = std::any_of(all.begin(), all.end(), [](int64_t v) { return (v & kGotWorkBit) != 0; });
  awaiting_confirm_ = false;
  finish_step(any_got);
  if (!any_got) return Decision{StepType::Decode, false};
  return Decision{StepType::Prefill, !got_prefill_work};
}

void GroupVote::finish_step(bool prefilled) {
  const bool any_waiting =
      std::any_of(votes_.begin(), votes_.end(), [](const RankVote& v) { return v.has_waiting_prefill; });
  waiting_steps_ = prefilled || !any_waiting ? 0 : waiting_steps_ + 1;
  ++step_;
}

bool GroupVote::any_leaving() const {
  return std::any_of(votes_.begin(), votes_.end(), [](const RankVote& v) { return v.leaving; });
}

bool GroupVote::all_leaving() const {
  return !votes_.empty() && std::all_of(votes_.begin(), votes_.end(), [](const RankVote& v) { return v.leaving; });
}

int64_t GroupVote::waiting_tokens() const {
  int64_t sum = 0;
  for (const RankVote& v : votes_) sum += v.waiting_prefill_tokens;
  return sum;
}

}  // namespace deepinfer
