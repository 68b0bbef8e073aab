// Data-parallel engines (EngineConfig::data_parallel_size, src/engine/engine.h):
// every rank a whole Engine on a thread of this process, the group joined
// through a fresh file:// rendezvous. The ranks take their requests at
// scripted steps (a rank may get none at all); with expert parallelism their
// MoE layers form one group, a vote before every step keeps the steps
// aligned, and a rank without work runs one-padding-token forwards. Checked:
// every request's greedy tokens equal those of one engine running the prompt
// alone; every rank held the same votes and ran the same forwards; EPLB
// re-placement mid-run changes no token; an empty group leaves at its first
// vote; a rank that stops stepping makes its peer's step() throw within the
// group's timeout instead of hanging.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "sched/group_vote.h"
#include "../../support/greedy_reference.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::greedy_params;
using Clock = std::chrono::steady_clock;

const fs::path kTiny = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";

// A fresh rendezvous directory per group, removed at the end.
class RendezvousDir {
 public:
  RendezvousDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("deepinfer_dp_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~RendezvousDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string init_method() const { return "file://" + path_.string(); }

 private:
  fs::path path_;
};

// Small and batch-invariant: a row's logits do not depend on what else is in
// its batch (on this rank or, through the expert-parallel MoE layers, on the
// others), so each request's greedy tokens must equal those of one engine
// running its prompt alone. A budget of 4 tokens a step chunks every prompt.
EngineConfig base_config(const std::string& model) {
  EngineConfig c;
  c.model_path = (kTiny / model).string();
  c.tokenizer_path = (kTiny / "tokenizer.json").string();
  c.num_threads = 1;
  c.max_model_len = 128;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 4;
  c.kv_cache_tokens = 1024;
  c.batch_invariant = true;
  return c;
}

std::vector<int32_t> make_prompt(int32_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((i * 37 + salt * 101 + 11) % 300 + 3);
  return p;
}

struct Arrival {
  int step;
  int rank;
  std::vector<int32_t> prompt;
  int32_t max_tokens;
};

int last_arrival_step(const std::vector<Arrival>& script) {
  int last = 0;
  for (const Arrival& a : script) last = std::max(last, a.step);
  return last;
}

// Rank 0 gets two prompts at step 0, rank 1 one at step 3, rank 2 one at
// steps 5 and 9 (rank 1 takes those with 2 ranks); rank 3 never gets any.
std::vector<Arrival> scripted_arrivals(int ranks) {
  std::vector<Arrival> s;
  s.push_back({0, 0, make_prompt(13, 0), 10});
  s.push_back({0, 0, make_prompt(6, 1), 8});
  s.push_back({3, 1, make_prompt(18, 2), 10});
  const int late = ranks > 2 ? 2 : 1;
  s.push_back({5, late, make_prompt(9, 3), 12});
  s.push_back({9, late, make_prompt(5, 4), 10});
  return s;
}

// Each prompt alone, one after the other, on one engine without a group.
std::vector<std::vector<int32_t>> one_rank_reference(const EngineConfig& config, const std::vector<Arrival>& script) {
  Engine engine(config);
  EXPECT_FALSE(engine.data_parallel().has_value());
  std::vector<std::vector<int32_t>> tokens;
  for (const Arrival& a : script) {
    engine.add_request(a.prompt, greedy_params(a.max_tokens));
    std::vector<int32_t>& t = tokens.emplace_back();
    while (engine.has_unfinished()) {
      for (const RequestOutput& o : engine.step()) {
        for (const TokenOutput& tok : o.new_tokens) t.push_back(tok.token);
      }
    }
    EXPECT_EQ(t.size(), static_cast<size_t>(a.max_tokens));
  }
  engine.check_integrity();
  return tokens;
}

struct RankResult {
  EngineStats stats;
  int last_step = -1;  // the step after which the rank left
  std::string error;
};

struct GroupRun {
  std::vector<std::vector<int32_t>> tokens;  // per script entry
  std::vector<RankResult> ranks;
  double seconds = 0;
};

// Every rank on its own thread with its own Engine; each adds its share of
// the script at its step and steps until, past the script's last arrival,
// neither it nor the group has work left.
GroupRun run_group(EngineConfig config, int ranks, const std::vector<Arrival>& script,
                   std::chrono::milliseconds timeout = 30s) {
  RendezvousDir dir;
  const int last = last_arrival_step(script);
  constexpr int kMaxSteps = 500;  // far more than the script needs: a group that never settles fails
  GroupRun run;
  run.tokens.resize(script.size());
  run.ranks.resize(static_cast<size_t>(ranks));
  std::mutex mu;
  const auto t0 = Clock::now();
  auto rank_main = [&](int r) {
    RankResult& res = run.ranks[static_cast<size_t>(r)];
    try {
      EngineConfig c = config;
      c.data_parallel_size = ranks;
      c.dist.rank = r;
      c.dist.world_size = ranks;
      c.dist.local_rank = r;
      c.dist.init_method = dir.init_method();
      c.dist.timeout = timeout;
      Engine engine(c);
      const std::optional<Engine::DataParallelRank> dp = engine.data_parallel();
      DI_CHECK(dp && dp->rank == r && dp->size == ranks, "rank {}: data_parallel() does not name it", r);
      std::map<uint64_t, size_t> entry_of;  // request id -> script entry
      std::map<size_t, std::vector<int32_t>> mine;
      for (int step = 0;; ++step) {
        DI_CHECK(step < kMaxSteps, "rank {}: the group still had work after {} steps", r, kMaxSteps);
        for (size_t i = 0; i < script.size(); ++i) {
          if (script[i].step == step && script[i].rank == r) {
            entry_of[engine.add_request(script[i].prompt, greedy_params(script[i].max_tokens))] = i;
          }
        }
        for (const RequestOutput& o : engine.step()) {
          DI_CHECK(o.error.empty(), "rank {}: request {} failed: {}", r, o.request_id, o.error);
          auto it = entry_of.find(o.request_id);
          DI_CHECK(it != entry_of.end(), "rank {}: output of unknown request {}", r, o.request_id);
          for (const TokenOutput& t : o.new_tokens) mine[it->second].push_back(t.token);
        }
        if (step >= last && !engine.has_unfinished() && !engine.group_busy()) {
          res.last_step = step;
          break;
        }
      }
      engine.check_integrity();
      res.stats = engine.stats();
      std::lock_guard lock(mu);
      for (auto& [i, t] : mine) run.tokens[i] = std::move(t);
    } catch (const std::exception& e) {
      res.error = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return run;
}

void print_group(const char* label, const GroupRun& run) {
  std::printf("[dp] %s: %.2f s\n", label, run.seconds);
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const EngineStats& s = run.ranks[r].stats;
    std::printf("[dp]   rank %zu: left after step %d, votes %lld, steps %lld, padding steps %lld, eplb "
                "re-placements %lld\n",
                r, run.ranks[r].last_step, static_cast<long long>(s.group_votes), static_cast<long long>(s.steps),
                static_cast<long long>(s.padding_steps), static_cast<long long>(s.eplb_replacements));
  }
}

// Every rank finished without error, left after the same vote, and every
// request's tokens equal the one-rank reference's.
void expect_tokens_and_votes(const GroupRun& run, const std::vector<std::vector<int32_t>>& reference,
                             const std::vector<Arrival>& script) {
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    ASSERT_EQ(run.ranks[r].error, "") << "rank " << r;
  }
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    EXPECT_EQ(run.ranks[r].last_step, run.ranks[0].last_step) << "rank " << r;
    EXPECT_EQ(run.ranks[r].stats.group_votes, run.ranks[0].stats.group_votes) << "rank " << r;
    // One vote per step() call: each rank stepped exactly until it left.
    EXPECT_EQ(run.ranks[r].stats.group_votes, run.ranks[r].last_step + 1) << "rank " << r;
    EXPECT_EQ(run.ranks[r].stats.num_running + run.ranks[r].stats.num_waiting, 0u) << "rank " << r;
  }
  ASSERT_EQ(run.tokens.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_EQ(run.tokens[i], reference[i]) << "request " << i << " (rank " << script[i].rank << ", arrived at step "
                                           << script[i].step << ")";
  }
}

struct ExpertCase {
  const char* model;
  int ranks;
  VoteMode mode;
  bool eplb;
};

std::string case_label(const ExpertCase& c) {
  return std::string(c.model) + "_" + std::to_string(c.ranks) + "ranks_" + vote_mode_name(c.mode) +
         (c.eplb ? "_eplb" : "");
}
std::string case_name(const ::testing::TestParamInfo<ExpertCase>& info) { return case_label(info.param); }
// For gtest's messages and ctest's names (instead of the bytes of the struct).
void PrintTo(const ExpertCase& c, std::ostream* os) { *os << case_label(c); }

class ExpertParallelGroup : public ::testing::TestWithParam<ExpertCase> {};

TEST_P(ExpertParallelGroup, ExpertParallelGroupMatchesOneRank) {
  const ExpertCase& p = GetParam();
  const std::vector<Arrival> script = scripted_arrivals(p.ranks);
  const EngineConfig base = base_config(p.model);
  const std::vector<std::vector<int32_t>> reference = one_rank_reference(base, script);

  EngineConfig c = base;
  c.enable_expert_parallel = true;
  c.data_parallel_vote.mode = p.mode;
  if (p.eplb) {
    c.eplb_window_steps = 4;
    c.eplb_interval_steps = 3;
    c.eplb_redundant_slots = 1;
  }
  const GroupRun run = run_group(c, p.ranks, script);
  print_group(case_label(p).c_str(), run);
  expect_tokens_and_votes(run, reference, script);
  if (HasFatalFailure()) return;

  // Every forward aligned: a rank without work in a step its group computes
  // runs a padding forward, so all ranks ran the same number of forwards.
  const EngineStats& s0 = run.ranks[0].stats;
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const EngineStats& s = run.ranks[r].stats;
    EXPECT_EQ(s.steps + s.padding_steps, s0.steps + s0.padding_steps) << "rank " << r;
    EXPECT_GT(s.steps + s.padding_steps, 0) << "rank " << r;
  }
  // Rank 0 computed its prompts from step 0 while rank 1 had nothing yet.
  EXPECT_GT(run.ranks[1].stats.padding_steps, 0);
  EXPECT_GT(s0.steps, 0);
  if (p.ranks > 3) {
    // Rank 3 never had a request: it only voted and padded.
    const EngineStats& idle = run.ranks[3].stats;
    EXPECT_EQ(idle.steps, 0);
    EXPECT_GT(idle.padding_steps, 0);
    EXPECT_EQ(idle.prompt_tokens + idle.generation_tokens, 0);
  }
  if (p.eplb) {
    for (size_t r = 0; r < run.ranks.size(); ++r) {
      const EngineStats& s = run.ranks[r].stats;
      EXPECT_TRUE(s.eplb) << "rank " << r;
      EXPECT_GT(s.eplb_replacements, 0) << "rank " << r;
      // The monitors see the group's all-reduced counts: the same re-placements everywhere.
      EXPECT_EQ(s.eplb_replacements, s0.eplb_replacements) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    TinyMoe, ExpertParallelGroup,
    ::testing::Values(ExpertCase{"mixtral", 2, VoteMode::Any, false}, ExpertCase{"mixtral", 2, VoteMode::All, false},
                      ExpertCase{"mixtral", 4, VoteMode::Any, false}, ExpertCase{"mixtral", 4, VoteMode::All, false},
                      ExpertCase{"mixtral", 2, VoteMode::Any, true}, ExpertCase{"mixtral", 4, VoteMode::All, true},
                      ExpertCase{"qwen3_moe", 2, VoteMode::Any, false},
                      ExpertCase{"deepseek_v3", 2, VoteMode::All, false}),
    case_name);

TEST(DataParallel, DenseGroupMatchesOneRankWithoutPaddingSteps) {
  const std::vector<Arrival> script = scripted_arrivals(2);
  const EngineConfig base = base_config("llama");
  const std::vector<std::vector<int32_t>> reference = one_rank_reference(base, script);
  const GroupRun run = run_group(base, 2, script);
  print_group("llama 2 ranks, no expert parallelism", run);
  expect_tokens_and_votes(run, reference, script);
  if (HasFatalFailure()) return;
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    // No collective inside the forward: a rank without work runs nothing.
    EXPECT_EQ(run.ranks[r].stats.padding_steps, 0) << "rank " << r;
    EXPECT_GT(run.ranks[r].stats.steps, 0) << "rank " << r;
  }
}

TEST(DataParallel, AnEmptyGroupLeavesAtItsFirstVote) {
  RendezvousDir dir;
  std::vector<std::string> errors(2);
  std::vector<EngineStats> stats(2);
  std::vector<int> busy(2, 1);
  auto rank_main = [&](int r) {
    try {
      EngineConfig c = base_config("mixtral");
      c.enable_expert_parallel = true;
      c.data_parallel_size = 2;
      c.dist = {r, 2, r, dir.init_method(), 30s, ""};
      Engine engine(c);
      EXPECT_FALSE(engine.group_busy());
      engine.drain_group();
      busy[static_cast<size_t>(r)] = engine.group_busy() || engine.has_unfinished() ? 1 : 0;
      stats[static_cast<size_t>(r)] = engine.stats();
      engine.check_integrity();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(busy[r], 0) << "rank " << r;
    EXPECT_EQ(stats[r].group_votes, 1) << "rank " << r;
    EXPECT_EQ(stats[r].steps, 0) << "rank " << r;
    EXPECT_EQ(stats[r].padding_steps, 0) << "rank " << r;
  }
}

// A rank that is done early and drains (a server's SIGTERM, the end of its
// share of a batch) keeps stepping - padding steps - while another rank
// still serves; that rank learns from the vote that the group is stopping,
// finishes its request with the tokens it would have had alone, drains too,
// and both leave after the same vote.
TEST(DataParallel, ADrainingRankWaitsForTheOthersWhoLearnOfIt) {
  RendezvousDir dir;
  const std::vector<int32_t> short_prompt = make_prompt(7, 1), long_prompt = make_prompt(11, 2);
  const EngineConfig base = base_config("mixtral");
  const std::vector<std::vector<int32_t>> reference =
      one_rank_reference(base, {{0, 0, short_prompt, 3}, {0, 1, long_prompt, 24}});
  std::vector<std::string> errors(2);
  std::vector<EngineStats> stats(2);
  std::vector<std::vector<int32_t>> tokens(2);
  bool rank1_saw_leaving_while_working = false;
  auto rank_main = [&](int r) {
    try {
      EngineConfig c = base;
      c.enable_expert_parallel = true;
      c.data_parallel_size = 2;
      c.dist = {r, 2, r, dir.init_method(), 30s, ""};
      Engine engine(c);
      engine.add_request(r == 0 ? short_prompt : long_prompt, greedy_params(r == 0 ? 3 : 24));
      while (engine.has_unfinished()) {
        for (const RequestOutput& o : engine.step()) {
          for (const TokenOutput& t : o.new_tokens) tokens[static_cast<size_t>(r)].push_back(t.token);
        }
        if (r == 1 && engine.group_leaving() && engine.has_unfinished()) rank1_saw_leaving_while_working = true;
      }
      engine.drain_group();
      EXPECT_FALSE(engine.group_leaving()) << "rank " << r << ": a drained group starts over";
      stats[static_cast<size_t>(r)] = engine.stats();
      engine.check_integrity();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(tokens[0], reference[0]);
  EXPECT_EQ(tokens[1], reference[1]);
  EXPECT_TRUE(rank1_saw_leaving_while_working);
  EXPECT_EQ(stats[0].group_votes, stats[1].group_votes) << "both leave after the same vote";
  EXPECT_GT(stats[0].padding_steps, 10) << "rank 0 stepped with rank 1 while it worked";
  std::printf("[dp] drain: %lld votes, rank 0 %lld padding steps\n", static_cast<long long>(stats[0].group_votes),
              static_cast<long long>(stats[0].padding_steps));
}

// A rank that leaves the group mid-run (stops calling step(), keeping its
// engine, or destroys its engine): its peer, which still has a request, must
// get an Error from step() within the group's timeout, not hang.
enum class Departure { StopsStepping, DestroysEngine };

std::string departure_name(Departure d) {
  return d == Departure::StopsStepping ? "StopsStepping" : "DestroysEngine";
}
void PrintTo(Departure d, std::ostream* os) { *os << departure_name(d); }

class ARankLeaves : public ::testing::TestWithParam<Departure> {};

TEST_P(ARankLeaves, ThePeersStepThrowsWithinTheTimeout) {
  const Departure how = GetParam();
  constexpr auto kTimeout = 3s;
  constexpr int kStepsTogether = 3;
  RendezvousDir dir;
  std::mutex mu;
  std::condition_variable cv;
  bool rank0_done = false;
  std::optional<Clock::time_point> left_at;  // when rank 1 stopped stepping
  std::string rank0_error, rank1_error;
  bool rank0_threw_error = false, rank0_comm_error = false, rank0_threw_other = false;
  int rank0_steps_after = 0;
  double seconds_to_throw = -1;

  auto common = [&](int r) {
    EngineConfig c = base_config("mixtral");
    c.enable_expert_parallel = true;
    c.data_parallel_size = 2;
    c.dist = {r, 2, r, dir.init_method(), kTimeout, ""};
    return c;
  };
  std::thread t1([&] {
    try {
      auto engine = std::make_unique<Engine>(common(1));
      engine->add_request(make_prompt(8, 7), greedy_params(32));
      for (int s = 0; s < kStepsTogether; ++s) engine->step();
      {
        std::lock_guard lock(mu);
        left_at = Clock::now();
      }
      if (how == Departure::DestroysEngine) engine.reset();
      // Keep the engine (or the thread) until rank 0 has failed; a watchdog
      // ends the wait, so a rank 0 that hangs fails the test instead of hanging it.
      std::unique_lock lock(mu);
      cv.wait_for(lock, 30s, [&] { return rank0_done; });
      lock.unlock();
      engine.reset();
    } catch (const std::exception& e) {
      rank1_error = e.what();
    }
  });
  std::thread t0([&] {
    std::unique_ptr<Engine> engine;
    try {
      engine = std::make_unique<Engine>(common(0));
      engine->add_request(make_prompt(12, 5), greedy_params(32));
      for (int s = 0; s < kStepsTogether; ++s) engine->step();
      // Rank 1 is gone now, or soon; rank 0 has work left and goes on.
      while (engine->has_unfinished() || engine->group_busy()) {
        engine->step();
        ++rank0_steps_after;
      }
    } catch (const Error& e) {
      rank0_threw_error = true;
      rank0_comm_error = dynamic_cast<const CommError*>(&e) != nullptr;
      rank0_error = e.what();
    } catch (const std::exception& e) {
      rank0_threw_other = true;
      rank0_error = e.what();
    }
    const auto now = Clock::now();
    {
      std::lock_guard lock(mu);
      if (left_at) seconds_to_throw = std::chrono::duration<double>(now - *left_at).count();
      rank0_done = true;
    }
    cv.notify_all();
    engine.reset();
  });
  t0.join();
  t1.join();
  std::printf("[dp] rank 1 %s: rank 0 threw %s after %.2f s (%d steps alone): %s\n",
              how == Departure::StopsStepping ? "stopped stepping" : "destroyed its engine",
              rank0_comm_error ? "CommError" : "an exception", seconds_to_throw, rank0_steps_after,
              rank0_error.c_str());
  EXPECT_EQ(rank1_error, "");
  EXPECT_TRUE(rank0_threw_error) << (rank0_threw_other ? "not a deepinfer::Error: " + rank0_error
                                                       : std::string("rank 0 finished without an error"));
  ASSERT_GE(seconds_to_throw, 0.0);
  // Within the timeout, plus slack for a loaded machine (the watchdog is at 30 s).
  EXPECT_LT(seconds_to_throw, std::chrono::duration<double>(kTimeout).count() + 7.0);
  // Rank 0's own request needs far more steps than it could take alone.
  EXPECT_LT(rank0_steps_after, 32);
}

INSTANTIATE_TEST_SUITE_P(DataParallel, ARankLeaves,
                         ::testing::Values(Departure::StopsStepping, Departure::DestroysEngine),
                         [](const ::testing::TestParamInfo<Departure>& info) { return departure_name(info.param); });

}  // namespace
}  // namespace deepinfer
