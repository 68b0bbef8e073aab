// GroupVote (src/sched/group_vote.h): data-parallel ranks as threads of this
// process voting on each step's type, over an in-memory channel and over real
// Gloo groups. The trace tests run four ranks, each with a tiny scheduler,
// over 30 scripted steps and check every step: one step type on every rank,
// empty prefill steps where a rank had nothing, the modes' waiting rules, and
// exactly one "MoE collective" per rank per step whose gathered values prove
// every rank was in the same step of the same type. Every collective has a
// timeout, so a misaligned group fails the test instead of hanging it.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "dist/gloo_communicator.h"
#include "engine/gloo_vote_channel.h"
#include "sched/group_vote.h"

namespace deepinfer {
namespace {

using namespace std::chrono_literals;

// N ranks' all-gathers meeting in memory: a reusable barrier that hands every
// rank all values of the round. A rank that waits longer than the timeout
// fails, and so does every rank after it (abort()), so a test whose ranks
// disagree ends with an error, never a hang.
class FakeGroup {
 public:
  FakeGroup(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout), slots_(static_cast<size_t>(size)) {}

  std::vector<int64_t> all_gather(int rank, int64_t mine) {
    std::unique_lock lock(mu_);
    if (!aborted_.empty()) throw Error("fake group aborted: " + aborted_);
    slots_[static_cast<size_t>(rank)] = mine;
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      result_ = slots_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return result_;
    }
    const bool done = cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || !aborted_.empty(); });
    if (generation_ == generation) {
      if (!done) {
        aborted_ = "rank " + std::to_string(rank) + " timed out in an all-gather";
        cv_.notify_all();
      }
      throw Error("fake group aborted: " + aborted_);
    }
    return result_;
  }

  void abort(const std::string& why) {
    std::lock_guard lock(mu_);
    if (aborted_.empty()) aborted_ = why;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<int64_t> slots_;
  std::vector<int64_t> result_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;
};

class FakeChannel final : public VoteChannel {
 public:
  FakeChannel(FakeGroup& group, int rank) : group_(group), rank_(rank) {}
  std::vector<int64_t> all_gather(int64_t mine) override { return group_.all_gather(rank_, mine); }

 private:
  FakeGroup& group_;
  int rank_;
};

// Counts the rounds a rank runs.
class CountingChannel final : public VoteChannel {
 public:
  explicit CountingChannel(VoteChannel& inner) : inner_(inner) {}
  std::vector<int64_t> all_gather(int64_t mine) override {
    ++calls_;
    return inner_.all_gather(mine);
  }
  int calls() const { return calls_; }

 private:
  VoteChannel& inner_;
  int calls_ = 0;
};

enum class ChannelKind { Fake, Gloo };

const char* channel_name(ChannelKind k) { return k == ChannelKind::Fake ? "fake" : "gloo"; }

// body(rank, vote channel, moe channel) on a thread per rank, each with two
// channels of its own group: the vote's, and a stand-in for the MoE layer's
// collectives. Rethrows the first error any rank threw, after all have ended.
using RankBody = std::function<void(int rank, VoteChannel& vote, VoteChannel& moe)>;

void run_group(ChannelKind kind, int size, const RankBody& body, std::chrono::milliseconds timeout = 10s) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  FakeGroup fake_vote(size, timeout), fake_moe(size, timeout);
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const GlooTransport loopback{"", "127.0.0.1"};
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (kind == ChannelKind::Fake) {
          FakeChannel vote(fake_vote, r), moe(fake_moe, r);
          body(r, vote, moe);
        } else {
          GlooCommunicator vote_comm(store, "vote", r, size, timeout, loopback);
          GlooCommunicator moe_comm(store, "moe", r, size, timeout, loopback);
          GlooVoteChannel vote(vote_comm), moe(moe_comm);
          body(r, vote, moe);
          // Nobody leaves while a peer may still be reading from it.
          vote_comm.barrier();
          moe_comm.barrier();
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        // The cause goes along: a peer waiting in the other group reports it,
        // whichever rank's error is rethrown.
        const std::string why = "rank " + std::to_string(r) + " failed: " + e.what();
        fake_vote.abort(why);
        fake_moe.abort(why);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------
// The rules, a few steps at a time (in-memory channel).

using Local = GroupVote::LocalState;

Local waiting(int64_t tokens, bool running = true) { return Local{true, tokens, running}; }
Local decoding() { return Local{false, 0, true}; }
Local idle() { return Local{false, 0, false}; }

// Every rank proposes its state; the ones whose proposal is Prefill confirm
// `got[rank]`. Returns each rank's step type and empty flag, as "P", "P-" (empty) or "D".
std::vector<std::string> one_step(std::vector<GroupVote>& votes, const std::vector<Local>& states,
                                  const std::vector<bool>& got, std::vector<StepType>* proposals = nullptr) {
  const int n = static_cast<int>(votes.size());
  std::vector<std::string> out(static_cast<size_t>(n));
  std::vector<StepType> proposed(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        const auto i = static_cast<size_t>(r);
        proposed[i] = votes[i].propose(states[i]);
        if (proposed[i] == StepType::Decode) {
          out[i] = "D";
          return;
        }
        const GroupVote::Decision d = votes[i].confirm(got[i]);
        out[i] = d.type == StepType::Decode ? "D" : d.empty_step ? "P-" : "P";
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (proposals) *proposals = proposed;
  return out;
}

// Ranks that keep their GroupVote across steps (one_step runs each step on
// fresh threads; the fake group is the same throughout).
struct FakeRanks {
  FakeRanks(int n, GroupVoteConfig config) : group(n, 5s) {
    for (int r = 0; r < n; ++r) channels.push_back(std::make_unique<FakeChannel>(group, r));
    votes.reserve(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) votes.emplace_back(config, *channels[static_cast<size_t>(r)]);
  }
  FakeGroup group;
  std::vector<std::unique_ptr<FakeChannel>> channels;
  std::vector<GroupVote> votes;
};

using Row = std::vector<std::string>;

TEST(GroupVoteRules, AnyPrefillsForOneRanksWorkAndTheOthersRunEmpty) {
  FakeRanks g(3, {VoteMode::Any, 1, 1, 0});
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(17), decoding()}, {false, true, false}), (Row{"P-", "P", "P-"}));
  EXPECT_EQ(g.votes[0].waiting_tokens(), 17);
  EXPECT_TRUE(g.votes[2].votes()[1].has_waiting_prefill);
  EXPECT_FALSE(g.votes[2].votes()[0].has_waiting_prefill);
  EXPECT_EQ(one_step(g.votes, {decoding(), decoding(), decoding()}, {false, false, false}), (Row{"D", "D", "D"}));
  for (const GroupVote& v : g.votes) EXPECT_EQ(v.step(), 2);
}

// A rank that is stopping says so in its vote; the others read it, the
// token count beside it is unchanged, and the group knows when all are leaving.
TEST(GroupVoteRules, LeavingIsVotedAndSeenByEveryRank) {
  FakeRanks g(3, {VoteMode::Any, 1, 1, 0});
  Local leaving = waiting(123456789);
  leaving.leaving = true;
  EXPECT_EQ(one_step(g.votes, {decoding(), leaving, decoding()}, {false, true, false}), (Row{"P-", "P", "P-"}));
  for (const GroupVote& v : g.votes) {
    EXPECT_TRUE(v.votes()[1].leaving);
    EXPECT_FALSE(v.votes()[0].leaving);
    EXPECT_EQ(v.votes()[1].waiting_prefill_tokens, 123456789);
    EXPECT_TRUE(v.any_leaving());
    EXPECT_FALSE(v.all_leaving());
  }
  Local idle{false, 0, false};
  idle.leaving = true;
  EXPECT_EQ(one_step(g.votes, {idle, idle, idle}, {false, false, false}), (Row{"D", "D", "D"}));
  for (const GroupVote& v : g.votes) EXPECT_TRUE(v.all_leaving());
  EXPECT_EQ(one_step(g.votes, {decoding(), decoding(), decoding()}, {false, false, false}), (Row{"D", "D", "D"}));
  for (const GroupVote& v : g.votes) EXPECT_FALSE(v.any_leaving());
}

TEST(GroupVoteRules, AllWaitsForEveryRankButNotForIdleOnes) {
  FakeRanks g(3, {VoteMode::All, 1, 1, 0});
  std::vector<StepType> proposed;
  // Rank 2 decodes with nothing waiting: not ready, so no prefill vote at all.
  EXPECT_EQ(one_step(g.votes, {waiting(5), waiting(6), decoding()}, {true, true, false}, &proposed),
            (Row{"D", "D", "D"}));
  EXPECT_EQ(proposed, (std::vector<StepType>(3, StepType::Decode)));
  // Rank 2 has nothing at all: it never holds the group back.
  EXPECT_EQ(one_step(g.votes, {waiting(5), waiting(6), idle()}, {true, true, false}), (Row{"P", "P", "P-"}));
  EXPECT_EQ(one_step(g.votes, {waiting(5), waiting(6), waiting(1)}, {true, true, true}), (Row{"P", "P", "P"}));
  // With all_max_wait_steps = 0 the group waits however long it takes.
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(one_step(g.votes, {waiting(5), decoding(), decoding()}, {true, false, false}), (Row{"D", "D", "D"}))
        << "step " << i;
  }
  EXPECT_EQ(g.votes[0].waiting_steps(), 50);
}

TEST(GroupVoteRules, AllMaxWaitForcesThePrefill) {
  FakeRanks g(2, {VoteMode::All, 1, 1, 3});
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(one_step(g.votes, {waiting(5), decoding()}, {true, false}), (Row{"D", "D"})) << "step " << i;
    ASSERT_EQ(g.votes[1].waiting_steps(), i + 1);
  }
  EXPECT_EQ(one_step(g.votes, {waiting(5), decoding()}, {true, false}), (Row{"P", "P-"}));
  EXPECT_EQ(g.votes[0].waiting_steps(), 0);
}

TEST(GroupVoteRules, IntervalSpacesPrefillVotesAndIsWaivedWithoutDecodes) {
  FakeRanks g(2, {VoteMode::Any, 1, 3, 0});
  EXPECT_EQ(one_step(g.votes, {waiting(4), decoding()}, {true, false}), (Row{"P", "P-"}));  // step 0
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(4)}, {false, true}), (Row{"D", "D"}));   // step 1: too soon
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(4)}, {false, true}), (Row{"D", "D"}));   // step 2: too soon
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(4)}, {false, true}), (Row{"P-", "P"}));  // step 3
  // No decodes anywhere: nothing to protect, so the interval does not apply.
  EXPECT_EQ(one_step(g.votes, {idle(), waiting(4, false)}, {false, true}), (Row{"P-", "P"}));  // step 4
}

TEST(GroupVoteRules, ConfirmWithoutWorkReturnsToDecodeAndCountsForTheInterval) {
  FakeRanks g(3, {VoteMode::Any, 1, 2, 0});
  std::vector<StepType> proposed;
  // Rank 1 had work but could not schedule it (no KV memory): nobody prefills.
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(9), decoding()}, {false, false, false}, &proposed),
            (Row{"D", "D", "D"}));
  EXPECT_EQ(proposed, (std::vector<StepType>(3, StepType::Prefill)));
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(9), decoding()}, {false, true, false}, &proposed),
            (Row{"D", "D", "D"}));
  EXPECT_EQ(proposed, (std::vector<StepType>(3, StepType::Decode))) << "the failed vote started the interval";
  EXPECT_EQ(one_step(g.votes, {decoding(), waiting(9), decoding()}, {false, true, false}), (Row{"P-", "P", "P-"}));
}

TEST(GroupVoteRules, ARankOutOfStepIsAnErrorOnEveryRank) {
  FakeGroup group(2, 5s);
  FakeChannel c0(group, 0), c1(group, 1);
  GroupVote v0({VoteMode::Any, 1, 1, 0}, c0);
  std::string e0, e1;
  // Rank 1 skipped its vote and is already in another collective.
  std::thread t1([&] { e1 = error_of([&] { c1.all_gather(12345); }); });
  e0 = error_of([&] { v0.propose(waiting(3)); });
  t1.join();
  EXPECT_NE(e0.find("rank 1 is out of step"), std::string::npos) << e0;
  EXPECT_EQ(e1, "");

  // Rank 0 is in the confirm round of step 0 while rank 1 votes on step 1.
  FakeGroup group2(2, 5s);
  FakeChannel d0(group2, 0), d1(group2, 1);
  GroupVote w0({VoteMode::Any, 1, 1, 0}, d0), w1({VoteMode::Any, 1, 1, 0}, d1);
  std::thread t2([&] { EXPECT_EQ(w1.propose(decoding()), StepType::Prefill); });
  EXPECT_EQ(w0.propose(waiting(3)), StepType::Prefill);
  t2.join();
  std::thread t3([&] { e1 = error_of([&] { d1.all_gather((int64_t{1} << 3) | 2); }); });
  e0 = error_of([&] { w0.confirm(true); });
  t3.join();
  EXPECT_NE(e0.find("rank 1 is out of step (its vote round of step tag 1, this rank's confirm round of step tag 0)"),
            std::string::npos)
      << e0;
}

TEST(GroupVoteRules, MisuseAndBadConfigAreErrors) {
  FakeGroup group(1, 1s);
  FakeChannel c(group, 0);
  EXPECT_NE(error_of([&] { GroupVote({VoteMode::Any, 1, 0, 0}, c); }).find("any_interval_steps"), std::string::npos);
  EXPECT_NE(error_of([&] { GroupVote({VoteMode::All, 0, 1, 0}, c); }).find("all_interval_steps"), std::string::npos);
  EXPECT_NE(error_of([&] { GroupVote({VoteMode::All, 1, 1, -1}, c); }).find("all_max_wait_steps"), std::string::npos);
  GroupVote v({}, c);
  EXPECT_NE(error_of([&] { v.confirm(true); }).find("without a prefill proposal"), std::string::npos);
  EXPECT_NE(error_of([&] { v.propose({true, -1, false}); }).find("negative"), std::string::npos);
  EXPECT_EQ(v.propose(waiting(8, false)), StepType::Prefill);
  EXPECT_TRUE(v.awaiting_confirm());
  EXPECT_NE(error_of([&] { v.propose(idle()); }).find("waits for confirm()"), std::string::npos);
  const GroupVote::Decision d = v.confirm(true);
  EXPECT_EQ(d.type, StepType::Prefill);
  EXPECT_FALSE(d.empty_step);
  EXPECT_EQ(v.propose(idle()), StepType::Decode);
  EXPECT_EQ(v.step(), 2);
}

TEST(GroupVoteRules, ChannelsFailInsteadOfHanging) {
  for (ChannelKind kind : {ChannelKind::Fake, ChannelKind::Gloo}) {
    // Rank 1 never votes: rank 0's round must end in an error.
    const std::string e = error_of([&] {
      run_group(
          kind, 2,
          [](int rank, VoteChannel& vote, VoteChannel&) {
            if (rank == 0) {
              GroupVote v({}, vote);
              v.propose(waiting(1));
            } else {
              std::this_thread::sleep_for(700ms);
            }
          },
          300ms);
    });
    EXPECT_NE(e.find(kind == ChannelKind::Fake ? "rank 0 timed out" : "gloo all_gather failed on rank 0"),
              std::string::npos)
        << channel_name(kind) << ": " << e;
  }
}

// ---------------------------------------------------------------------------
// The scripted trace: 4 ranks, 30 steps, each rank a tiny scheduler.

struct Prompt {
  int64_t tokens;
  int32_t decode_steps;
};

struct Script {
  int n_ranks = 4;
  int n_steps = 30;
  std::map<int, std::vector<std::pair<int, Prompt>>> arrivals;  // step -> (rank, prompt)
  std::map<int, std::set<int>> refused;                         // rank -> steps its scheduler finds no KV memory
};

// Every rank starts a long request at step 0, so all ranks keep decoding for
// the whole trace (the intervals apply throughout). Then: rank 2 gets a prompt
// at step 3, ranks 0 and 1 at step 7, all ranks at step 12, rank 1 at step 20,
// rank 0 at step 27. Rank 3 has no KV memory for a prefill at steps 12-16 and
// 23, rank 1 at steps 20-23.
Script the_script() {
  Script s;
  for (int r = 0; r < 4; ++r) s.arrivals[0].push_back({r, {64, 100}});
  s.arrivals[3] = {{2, {30, 50}}};
  s.arrivals[7] = {{0, {20, 50}}, {1, {21, 50}}};
  for (int r = 0; r < 4; ++r) s.arrivals[12].push_back({r, {10 + r, 50}});
  s.arrivals[20] = {{1, {40, 50}}};
  s.arrivals[27] = {{0, {8, 50}}};
  s.refused[3] = {12, 13, 14, 15, 16, 23};
  s.refused[1] = {20, 21, 22, 23};
  return s;
}

struct StepRecord {
  StepType type = StepType::Decode;
  bool empty = false;
  bool confirm_round = false;
  bool had_waiting = false;
  bool had_running = false;
  int64_t prefilled_tokens = 0;
  int vote_rounds = 0;
  int moe_rounds = 0;
  bool moe_aligned = false;
};

struct RankTrace {
  std::vector<StepRecord> steps;
  size_t waiting_at_end = 0;
};

RankTrace run_rank(int rank, const Script& s, const GroupVoteConfig& config, VoteChannel& vote_channel,
                   VoteChannel& moe_channel) {
  CountingChannel votes(vote_channel), moe(moe_channel);
  GroupVote vote(config, votes);
  std::deque<Prompt> waiting;
  std::vector<int32_t> running;  // decode steps left per request
  const auto refused = s.refused.find(rank);
  RankTrace trace;
  for (int step = 0; step < s.n_steps; ++step) {
    if (auto a = s.arrivals.find(step); a != s.arrivals.end()) {
      for (const auto& [r, p] : a->second) {
        if (r == rank) waiting.push_back(p);
      }
    }
    StepRecord rec;
    rec.had_waiting = !waiting.empty();
    rec.had_running = !running.empty();
    int64_t tokens = 0;
    for (const Prompt& p : waiting) tokens += p.tokens;
    const int votes_before = votes.calls(), moe_before = moe.calls();

    const StepType proposed = vote.propose({rec.had_waiting, tokens, rec.had_running});
    GroupVote::Decision d{proposed, false};
    bool got = false;
    if (proposed == StepType::Prefill) {
      rec.confirm_round = true;
      got = rec.had_waiting && !(refused != s.refused.end() && refused->second.count(step));
      d = vote.confirm(got);
    }
    rec.type = d.type;
    rec.empty = d.empty_step;
    if (d.type == StepType::Prefill && got) {
      for (const Prompt& p : waiting) {
        running.push_back(p.decode_steps);
        rec.prefilled_tokens += p.tokens;
      }
      waiting.clear();
    } else if (d.type == StepType::Decode) {
      for (int32_t& left : running) --left;
      std::erase(running, 0);
    }

    // The MoE layer: one collective per step, which meets only if every rank
    // is in this step running this step type.
    const int64_t tag = int64_t{step} * 2 + (d.type == StepType::Prefill ? 1 : 0);
    const std::vector<int64_t> all = moe.all_gather(tag);
    rec.moe_aligned = static_cast<int>(all.size()) == s.n_ranks &&
                      std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == tag; });
    rec.vote_rounds = votes.calls() - votes_before;
    rec.moe_rounds = moe.calls() - moe_before;
    trace.steps.push_back(rec);
  }
  trace.waiting_at_end = waiting.size();
  return trace;
}

std::vector<RankTrace> run_trace(ChannelKind kind, const Script& s, const GroupVoteConfig& config) {
  std::vector<RankTrace> traces(static_cast<size_t>(s.n_ranks));
  run_group(kind, s.n_ranks, [&](int rank, VoteChannel& vote, VoteChannel& moe) {
    traces[static_cast<size_t>(rank)] = run_rank(rank, s, config, vote, moe);
  });
  return traces;
}

// "step 12: P P P P  waiting: 0 1 2 3  refused: 3  empty: 3", a line per step:
// each rank's step type, the ranks with prefill work waiting at the vote, the
// ones whose scheduler found no memory for it, and the ones that ran empty.
std::string table(const std::vector<RankTrace>& traces, int n_steps) {
  std::ostringstream out;
  for (int step = 0; step < n_steps; ++step) {
    std::string types, waiting_ranks, refused_ranks, empty_ranks;
    bool confirm = false;
    for (size_t r = 0; r < traces.size(); ++r) {
      const StepRecord& rec = traces[r].steps[static_cast<size_t>(step)];
      types += rec.type == StepType::Prefill ? " P" : " D";
      if (rec.had_waiting) waiting_ranks += " " + std::to_string(r);
      if (rec.confirm_round && rec.had_waiting && rec.prefilled_tokens == 0) refused_ranks += " " + std::to_string(r);
      if (rec.empty) empty_ranks += " " + std::to_string(r);
      confirm |= rec.confirm_round;
    }
    out << "  step " << (step < 10 ? " " : "") << step << ":" << types;
    if (!waiting_ranks.empty()) out << "  waiting:" << waiting_ranks;
    if (!refused_ranks.empty()) out << "  refused:" << refused_ranks;
    if (!empty_ranks.empty()) out << "  empty:" << empty_ranks;
    if (confirm && traces[0].steps[static_cast<size_t>(step)].type == StepType::Decode) {
      out << "  (prefill vote, no rank got work: decode)";
    }
    out << "\n";
  }
  return out.str();
}

struct Expected {
  std::map<int, std::set<int>> prefills;  // step -> the ranks that ran it empty
  std::set<int> votes_without_work;       // prefill votes whose confirm found no work
  std::vector<size_t> waiting_at_end;
};

// Worked out by hand from the rules in group_vote.h.
Expected expected_any() {  // ANY, interval 4
  Expected e;
  e.prefills = {{0, {}}, {4, {0, 1, 3}}, {8, {2, 3}}, {12, {3}}, {20, {0, 1, 2}}, {24, {0, 2, 3}}, {28, {1, 2, 3}}};
  e.votes_without_work = {16};
  e.waiting_at_end = {0, 0, 0, 0};
  return e;
}

// ALL, interval 1, max wait 10. Rank 2 waits from step 3 and ranks 0 and 1
// from step 7 until every rank is ready at step 12 (9 steps: the max wait is
// not reached). Rank 3, refused at 12, then waits alone: steps 13-22 make 10
// waiting steps, so step 23 forces a vote, whose confirm finds no work (ranks 1
// and 3 both refused); step 24 is still forced and both prefill. Rank 0's
// prompt of step 27 is still waiting at the end.
Expected expected_all() {
  Expected e;
  e.prefills = {{0, {}}, {12, {3}}, {24, {0, 2}}};
  e.votes_without_work = {23};
  e.waiting_at_end = {1, 0, 0, 0};
  return e;
}

class GroupVoteTrace : public ::testing::TestWithParam<std::tuple<ChannelKind, VoteMode>> {};

TEST_P(GroupVoteTrace, FourRanksThirtySteps) {
  const auto [kind, mode] = GetParam();
  const Script s = the_script();
  const GroupVoteConfig config{mode, 1, 4, 10};
  const Expected expected = mode == VoteMode::Any ? expected_any() : expected_all();
  const std::vector<RankTrace> traces = run_trace(kind, s, config);
  ASSERT_EQ(traces.size(), 4u);
  for (const RankTrace& t : traces) ASSERT_EQ(t.steps.size(), static_cast<size_t>(s.n_steps));
  std::cout << vote_mode_name(mode) << " mode (intervals: all " << config.all_interval_steps << ", any "
            << config.any_interval_steps << "; all max wait " << config.all_max_wait_steps << ") over "
            << channel_name(kind) << ":\n"
            << table(traces, s.n_steps);

  std::optional<int> last_vote;
  for (int step = 0; step < s.n_steps; ++step) {
    const auto i = static_cast<size_t>(step);
    const StepRecord& r0 = traces[0].steps[i];
    bool all_ready = true, any_waiting = false, any_prefilled = false;
    std::set<int> empties;
    for (int r = 0; r < s.n_ranks; ++r) {
      const StepRecord& rec = traces[static_cast<size_t>(r)].steps[i];
      SCOPED_TRACE("step " + std::to_string(step) + " rank " + std::to_string(r));
      // One step type and one protocol on every rank.
      EXPECT_EQ(rec.type, r0.type);
      EXPECT_EQ(rec.confirm_round, r0.confirm_round);
      EXPECT_EQ(rec.vote_rounds, rec.confirm_round ? 2 : 1);
      // Exactly one MoE collective, met by every rank in the same step and type.
      EXPECT_EQ(rec.moe_rounds, 1);
      EXPECT_TRUE(rec.moe_aligned);
      // Empty exactly when the group prefills and this rank has nothing to prefill.
      EXPECT_EQ(rec.empty, rec.type == StepType::Prefill && rec.prefilled_tokens == 0);
      const bool refused = s.refused.count(r) && s.refused.at(r).count(step);
      if (rec.type == StepType::Prefill && rec.had_waiting && !refused) { EXPECT_GT(rec.prefilled_tokens, 0); }
      if (step > 0) { EXPECT_TRUE(rec.had_running); }
      if (rec.empty) empties.insert(r);
      all_ready &= rec.had_waiting || !rec.had_running;
      any_waiting |= rec.had_waiting;
      any_prefilled |= rec.prefilled_tokens > 0;
    }
    SCOPED_TRACE("step " + std::to_string(step));
    if (r0.confirm_round && r0.type == StepType::Decode) { EXPECT_FALSE(any_prefilled); }
    if (mode == VoteMode::Any) {
      // Any rank's waiting work triggers a vote once the interval has passed.
      const bool due = !last_vote || step - *last_vote >= config.any_interval_steps;
      EXPECT_EQ(r0.confirm_round, any_waiting && due);
    } else {
      // Every rank ready means a vote (interval 1); not all ready means none,
      // unless the max wait forces it (the steps named in expected_all()).
      if (any_waiting && all_ready) { EXPECT_TRUE(r0.confirm_round); }
      if (!all_ready && r0.confirm_round) { EXPECT_TRUE(step == 23 || step == 24); }
    }
    if (r0.confirm_round) last_vote = step;

    const auto p = expected.prefills.find(step);
    EXPECT_EQ(r0.type, p != expected.prefills.end() ? StepType::Prefill : StepType::Decode);
    if (p != expected.prefills.end()) { EXPECT_EQ(empties, p->second); }
    EXPECT_EQ(r0.confirm_round && r0.type == StepType::Decode, expected.votes_without_work.count(step) == 1);
  }
  for (int r = 0; r < s.n_ranks; ++r) {
    EXPECT_EQ(traces[static_cast<size_t>(r)].waiting_at_end, expected.waiting_at_end[static_cast<size_t>(r)])
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    ChannelsAndModes, GroupVoteTrace,
    ::testing::Combine(::testing::Values(ChannelKind::Fake, ChannelKind::Gloo),
                       ::testing::Values(VoteMode::Any, VoteMode::All)),
    [](const auto& info) {
      return std::string(channel_name(std::get<0>(info.param))) + "_" + vote_mode_name(std::get<1>(info.param));
    });

// The harness can fail: a rank that runs its own step type instead of the
// group's (it skips the confirm round when it has nothing to prefill) leaves
// collectives unmatched, and the group ends in errors, not in a hang.
TEST(GroupVoteTraceHarness, ARankIgnoringTheGroupFailsTheRun) {
  for (ChannelKind kind : {ChannelKind::Fake, ChannelKind::Gloo}) {
    const std::string e = error_of([&] {
      run_group(
          kind, 2,
          [](int rank, VoteChannel& vote_channel, VoteChannel& moe) {
            GroupVote vote({VoteMode::Any, 1, 1, 0}, vote_channel);
            for (int step = 0; step < 5; ++step) {
              const bool has_work = rank == 0 && step == 2;
              StepType type = vote.propose({has_work, has_work ? 5 : 0, true});
              if (type == StepType::Prefill && (has_work || rank == 0)) type = vote.confirm(has_work).type;
              else type = StepType::Decode;
              moe.all_gather(int64_t{step} * 2 + (type == StepType::Prefill ? 1 : 0));
            }
          },
          500ms);
    });
    EXPECT_NE(e.find(kind == ChannelKind::Fake ? "timed out" : "gloo all_gather failed"), std::string::npos)
        << channel_name(kind) << ": " << e;
  }
}

}  // namespace
}  // namespace deepinfer
