// GlooCommunicator when ranks fail: a rank that never joins a collective
// (timeout), a rank process that dies (closed connections), a rank that never
// joins the group, and groups made from a DistConfig.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <latch>

#include "dist_test_util.h"

namespace deepinfer {
namespace {

using namespace dist_test;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

TEST(GlooFailures, RankThatNeverJoinsACollectiveTimesOut) {
  constexpr auto kTimeout = 1s;
  TestStores stores(StoreKind::Hash, 3, kTimeout);
  std::latch others_done(2);
  std::vector<std::string> errors(3);
  std::vector<Clock::duration> waited(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      GlooCommunicator comm(stores.for_rank(r), "stuck", r, 3, kTimeout, kLoopback);
      if (r == 2) {  // joined the group, never joins the collective
        others_done.wait();
        return;
      }
      std::vector<float> data(16, 1.0f);
      const Clock::time_point start = Clock::now();
      try {
        comm.all_reduce(Tensor(data.data(), DType::F32, {16}));
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
      waited[r] = Clock::now() - start;
      // Broken for good: the next call says so at once.
      try {
        comm.barrier();
      } catch (const CommError& e) {
        errors[r] += std::string(" | ") + e.what();
      }
      others_done.count_down();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(contains(errors[r], "gloo all_reduce failed on rank " + std::to_string(r) + " of group 'stuck'"))
        << errors[r];
    EXPECT_TRUE(contains(errors[r], "broke earlier")) << errors[r];
    EXPECT_LT(waited[r], 10s);
  }
  // The first to give up waited the timeout (the other may hear of it from
  // that rank's closed connections a little sooner than its own deadline).
  EXPECT_GE(std::max(waited[0], waited[1]), 950ms);
}

TEST(GlooFailures, RankThatNeverJoinsTheGroupIsCommError) {
  TestStores stores(StoreKind::Tcp, 2, 1s);
  const Clock::time_point start = Clock::now();
  try {
    GlooCommunicator alone(stores.for_rank(1), "half", 1, 2, 1s, kLoopback);
    FAIL() << "joined a group without its other rank";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "rank 1 could not join group 'half' of 2 ranks")) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 10s);
}

// Forks a child that joins `group` as rank 1 over a FileStore in `dir`, runs
// one barrier, waits `linger`, and exits with code 1 (3 if joining failed).
// Forked before this process makes any gloo object for the test.
pid_t fork_rank_that_dies(const std::string& dir, std::chrono::milliseconds linger) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  try {
    auto store = std::make_shared<gloo::rendezvous::FileStore>(dir);
    GlooCommunicator comm(store, "dies", 1, 2, 30s, kLoopback);
    comm.barrier();
    std::this_thread::sleep_for(linger);
  } catch (...) {
    _exit(3);
  }
  _exit(1);  // no destructors: as if the process crashed
}

void expect_peer_gone_detected(std::chrono::milliseconds child_linger, std::chrono::milliseconds parent_delay) {
  TempDir dir;
  const pid_t child = fork_rank_that_dies(dir.path().string(), child_linger);
  ASSERT_GT(child, 0);
  std::string error;
  Clock::duration waited{};
  {
    auto store = std::make_shared<gloo::rendezvous::FileStore>(dir.path().string());
    // A long timeout: the failure must come from the closed connection.
    GlooCommunicator comm(store, "dies", 0, 2, 30s, kLoopback);
    comm.barrier();
    std::this_thread::sleep_for(parent_delay);
    std::vector<int64_t> data(8, 1);
    const Clock::time_point start = Clock::now();
    try {
      comm.all_reduce(Tensor(data.data(), DType::I64, {8}));
    } catch (const CommError& e) {
      error = e.what();
    }
    waited = Clock::now() - start;
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << "the child rank did not get through its barrier";
  EXPECT_TRUE(contains(error, "gloo all_reduce failed on rank 0 of group 'dies' (2 ranks)")) << error;
  EXPECT_LT(waited, 10s) << "noticed by the timeout, not the closed connection";
}

TEST(GlooFailures, PeerProcessGoneBeforeTheCollective) { expect_peer_gone_detected(0ms, 300ms); }

TEST(GlooFailures, PeerProcessGoneDuringTheCollective) { expect_peer_gone_detected(300ms, 0ms); }

uint16_t free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// The launch path: a DistConfig per rank, the store opened from init_method.
void run_from_config(const std::string& init_method) {
  constexpr int kSize = 3;
  std::vector<int64_t> results(kSize, -1);
  std::vector<std::exception_ptr> errors(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistConfig config;
        config.rank = r;
        config.world_size = kSize;
        config.local_rank = r;
        config.init_method = init_method;
        config.timeout = 20s;
        GlooCommunicator control(config, "control");
        GlooCommunicator tp(control.store(), "tp", r, kSize, config.timeout, gloo_transport_for(config));
        results[r] = control.all_reduce_max(r * 3) + tp.all_reduce_min(r + 100);
        tp.barrier();
        control.barrier();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (int r = 0; r < kSize; ++r) EXPECT_EQ(results[r], 6 + 100) << "rank " << r;
}

TEST(GlooFromConfig, TcpRendezvous) { run_from_config("tcp://127.0.0.1:" + std::to_string(free_port())); }

TEST(GlooFromConfig, FileRendezvous) {
  TempDir dir;
  run_from_config("file://" + (dir.path() / "rdzv").string());  // created on demand
}

TEST(GlooFromConfig, TransportFollowsTheRouteToTheRendezvousHost) {
  DistConfig config;
  config.world_size = 2;
  config.init_method = "tcp://127.0.0.1:29500";
  EXPECT_EQ(gloo_transport_for(config).hostname, "127.0.0.1");
  config.ifname = "lo";
  EXPECT_EQ(gloo_transport_for(config).ifname, "lo");
  EXPECT_EQ(gloo_transport_for(config).hostname, "");
}

}  // namespace
}  // namespace deepinfer
