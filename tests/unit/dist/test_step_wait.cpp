// wait_for_step (dist/step_wait.h): a step whose collectives never finish
// (a peer died after they were enqueued) ends in CommError within the
// timeout, with the groups aborted, instead of hanging; a group that reports
// an error ends the wait at once; a step that completes returns normally.
// With fakes: a device event and a group whose behaviour the test sets.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "dist/step_wait.h"

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

class FakeEvent final : public DeviceEvent {
 public:
  explicit FakeEvent(int ready_after_polls) : ready_after_(ready_after_polls) {}
  void record() override {}
  void synchronize() override { synchronized = true; }
  bool ready() override { return ready_after_ >= 0 && ++polls > ready_after_; }
  double elapsed_ms_since(const DeviceEvent&) const override { return 0.0; }
  int polls = 0;
  bool synchronized = false;

 private:
  int ready_after_;  // -1: never
};

class FakeGroup final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "fake"; }
  void all_reduce(Tensor, ReduceOp) override {}
  void all_gather(const Tensor&, Tensor) override {}
  void reduce_scatter(const Tensor&, Tensor) override {}
  void all_to_all(const Tensor&, std::span<const int64_t>, Tensor, std::span<const int64_t>) override {}
  void broadcast(Tensor, int) override {}
  void barrier() override {}
  void check_health() override {
    ++health_checks;
    if (peer_lost) throw CommError("fake: the peer is gone");
  }
  [[noreturn]] void abort(const std::string& reason) override {
    ++aborts;
    throw CommError("fake aborted: " + reason);
  }
  bool peer_lost = false;
  int health_checks = 0, aborts = 0;
};

TEST(StepWait, ACompletedStepReturns) {
  FakeEvent done(3);
  FakeGroup group;
  std::vector<Communicator*> groups = {&group};
  wait_for_step(done, groups, 5s);
  EXPECT_EQ(done.polls, 4);
  EXPECT_EQ(group.aborts, 0);
}

TEST(StepWait, WithoutGroupsItIsAPlainSynchronize) {
  FakeEvent done(-1);
  wait_for_step(done, {}, 5s);
  EXPECT_TRUE(done.synchronized);
  FakeEvent no_timeout(-1);
  FakeGroup group;
  std::vector<Communicator*> groups = {&group};
  wait_for_step(no_timeout, groups, 0ms);
  EXPECT_TRUE(no_timeout.synchronized);
}

TEST(StepWait, AStepThatNeverCompletesAbortsEveryGroupWithinTheTimeout) {
  FakeEvent never(-1);
  FakeGroup a, b;
  std::vector<Communicator*> groups = {&a, &b};
  const Clock::time_point start = Clock::now();
  try {
    wait_for_step(never, groups, 300ms);
    FAIL() << "returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("did not complete within 300 ms"), std::string::npos) << e.what();
  }
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3s);
  EXPECT_EQ(a.aborts, 1);
  EXPECT_EQ(b.aborts, 1);
  EXPECT_GT(a.health_checks, 10) << "the groups' health is polled while waiting";
}

TEST(StepWait, AGroupThatSawItsPeerGoEndsTheWaitAtOnce) {
  FakeEvent never(-1);
  FakeGroup group;
  group.peer_lost = true;
  std::vector<Communicator*> groups = {&group};
  const Clock::time_point start = Clock::now();
  EXPECT_THROW(wait_for_step(never, groups, 60s), CommError);
  EXPECT_LT(Clock::now() - start, 1s);
}

}  // namespace
}  // namespace deepinfer
