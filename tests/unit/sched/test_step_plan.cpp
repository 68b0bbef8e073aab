// StepPlan building and the scheduler around it, on host data only: chunks,
// joins, finishes, preemption, tokens in flight, several rows per sequence,
// per-group page tables.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "sched/request.h"
#include "sched/scheduler.h"
#include "sched/step_plan_builder.h"

namespace deepinfer {
namespace {

std::unique_ptr<Request> make_request(uint64_t id, int32_t prompt_len, float temperature = 0.0f) {
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  std::iota(prompt.begin(), prompt.end(), static_cast<int32_t>(1000 * id));
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = 64;
  auto r = std::make_unique<Request>(id, std::move(prompt), p, 77 + id);
  r->token_limit = prompt_len + 64;
  return r;
}

KvManagerConfig manager_config(int32_t step_tokens) {
  KvManagerConfig c;
  c.block_size = 16;
  c.max_step_tokens = step_tokens;
  return c;
}

TEST(StepPlan, PrefillChunkThenDecodeWithATokenInFlight) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0, 0}), 64, manager_config(32));
  auto r = make_request(1, 40);
  ASSERT_TRUE(kv.admit(r->id(), r->all_tokens(), "", 0).has_value());

  ScheduledBatch chunk;
  chunk.seqs.push_back({r.get(), 0, 32, 0});
  chunk.num_tokens = 32;
  const StepPlan p1 = build_step_plan(chunk, kv, sampling_row);
  ASSERT_EQ(p1.seqs.size(), 1u);
  EXPECT_EQ(p1.num_tokens(), 32);
  EXPECT_EQ(p1.num_rows(), 0);
  EXPECT_FALSE(p1.decode_only());
  EXPECT_EQ(p1.tokens[5].id, 1005);
  EXPECT_FALSE(p1.tokens[5].on_device());
  ASSERT_EQ(p1.groups.size(), 1u);
  EXPECT_EQ(p1.groups[0].pages.size(), 2u);
  EXPECT_EQ(p1.groups[0].first_pos[0], 0);

  // The rest of the prompt and its first sample, then a decode whose input
  // is that sample, still on the device (slot 2, row 0).
  r->num_computed_tokens = 40;
  r->inflight.push_back({2, 0});
  ASSERT_TRUE(kv.allocate_slots(r->id(), 40, 1, 0));
  ScheduledBatch decode;
  decode.seqs.push_back({r.get(), 40, 1, 1});
  decode.num_tokens = 1;
  const StepPlan p2 = build_step_plan(decode, kv, sampling_row);
  EXPECT_TRUE(p2.decode_only());
  ASSERT_TRUE(p2.tokens[0].on_device());
  EXPECT_EQ(p2.tokens[0].device.slot, 2);
  EXPECT_EQ(p2.tokens[0].device.row, 0);
  ASSERT_EQ(p2.num_rows(), 1);
  EXPECT_EQ(p2.rows[0].query, 0);
  // The sampled token is the second output: one token already in flight.
  EXPECT_EQ(p2.rows[0].sampling.params.position, 1);
  EXPECT_EQ(p2.rows[0].sampling.params.seed, 78u);
  EXPECT_EQ(p2.groups[0].pages.size(), 3u);
}

TEST(StepPlan, SeveralRowsPerSequenceSampleTheLastQueryTokens) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 64, manager_config(64));
  auto r = make_request(3, 10, 0.7f);
  ASSERT_TRUE(kv.admit(r->id(), r->all_tokens(), "", 0).has_value());
  r->num_computed_tokens = 10;
  r->append_output(5);
  r->inflight = {{0, 4}, {1, 2}};  // two more outputs sampled, not read yet
  ASSERT_TRUE(kv.allocate_slots(r->id(), 10, 3, 2));
  // Verify-style step: three query tokens (the known output and the two in
  // flight), three rows.
  ScheduledBatch b;
  b.seqs.push_back({r.get(), 10, 3, 3});
  b.num_tokens = 3;
  const StepPlan p = build_step_plan(b, kv, sampling_row);
  ASSERT_EQ(p.num_tokens(), 3);
  EXPECT_EQ(p.tokens[0].id, 5);
  EXPECT_EQ(p.tokens[1].device.slot, 0);
  EXPECT_EQ(p.tokens[1].device.row, 4);
  EXPECT_EQ(p.tokens[2].device.slot, 1);
  ASSERT_EQ(p.num_rows(), 3);
  for (int32_t j = 0; j < 3; ++j) {
    EXPECT_EQ(p.rows[static_cast<size_t>(j)].query, j);
    EXPECT_EQ(p.rows[static_cast<size_t>(j)].sampling.params.position, 3 + j);  // 1 output + 2 in flight + j
    EXPECT_FLOAT_EQ(p.rows[static_cast<size_t>(j)].sampling.params.temperature, 0.7f);
  }
  // Beyond the tokens in flight there is nothing to read.
  b.seqs[0].num_tokens = 4;
  EXPECT_THROW(build_step_plan(b, kv, sampling_row), Error);
}

TEST(StepPlan, WindowedGroupsListOnlyLivePages) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{32, 0}), 64, manager_config(64));
  auto r = make_request(4, 100);
  ASSERT_TRUE(kv.admit(r->id(), r->all_tokens(), "", 0).has_value());
  kv.commit(r->id(), r->tokens(), 64, "");
  r->num_computed_tokens = 64;
  ASSERT_TRUE(kv.allocate_slots(r->id(), 64, 36, 0));
  ScheduledBatch b;
  b.seqs.push_back({r.get(), 64, 36, 1});
  b.num_tokens = 36;
  const StepPlan p = build_step_plan(b, kv, sampling_row);
  ASSERT_EQ(p.groups.size(), 2u);
  // Windowed: the query at 64 reads from 33 on, so pages from block 2 (position 32).
  EXPECT_EQ(p.groups[0].first_pos[0], 32);
  EXPECT_EQ(p.groups[0].pages.size(), 5u);  // blocks 2..6 for positions up to 99
  EXPECT_EQ(p.groups[1].first_pos[0], 0);
  EXPECT_EQ(p.groups[1].pages.size(), 7u);
  // A plan for an earlier chunk would read released pages: refused.
  b.seqs[0] = {r.get(), 32, 32, 0};
  b.num_tokens = 32;
  EXPECT_THROW(build_step_plan(b, kv, sampling_row), Error);
}

TEST(StepPlan, SchedulerJoinsChunksFinishesAndPreempts) {
  // Room for 8 blocks: two 40-token prompts (3 blocks each) fit, a third waits.
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 8, manager_config(48));
  SchedulerConfig sc;
  sc.capacity.max_num_seqs = 8;
  sc.capacity.watermark_blocks = 1;
  sc.planner.max_num_batched_tokens = 48;
  Scheduler s(sc, kv);
  auto a = make_request(1, 40), b = make_request(2, 40), c = make_request(3, 40);
  s.add(a.get());
  s.add(b.get());
  s.add(c.get());

  ScheduledBatch s1 = s.schedule();
  // a's whole prompt, then the first 8 tokens of b's under the 48-token budget.
  ASSERT_EQ(s1.seqs.size(), 2u);
  EXPECT_EQ(s1.seqs[0].num_tokens, 40);
  EXPECT_EQ(s1.seqs[0].num_sample_rows, 1);
  EXPECT_EQ(s1.seqs[1].num_tokens, 8);
  EXPECT_EQ(s1.seqs[1].num_sample_rows, 0);
  EXPECT_EQ(s.num_waiting(), 1u);  // c does not fit next to a and b
  const StepPlan p1 = build_step_plan(s1, kv, sampling_row);
  EXPECT_EQ(p1.num_rows(), 1);
  EXPECT_EQ(p1.seqs[1].start, 0);
  s.commit(s1);
  a->inflight.push_back({0, 0});

  // a decodes its in-flight token, b finishes its prompt.
  ScheduledBatch s2 = s.schedule();
  ASSERT_EQ(s2.seqs.size(), 2u);
  EXPECT_EQ(s2.seqs[0].request, a.get());
  EXPECT_EQ(s2.seqs[0].num_tokens, 1);
  EXPECT_EQ(s2.seqs[1].start, 8);
  EXPECT_EQ(s2.seqs[1].num_tokens, 32);
  const StepPlan p2 = build_step_plan(s2, kv, sampling_row);
  EXPECT_TRUE(p2.tokens[0].on_device());
  s.commit(s2);
  kv.check_integrity();

  // a finishes: its pages go back and c is admitted.
  a->inflight.clear();
  s.finish(a.get());
  b->inflight.clear();
  b->append_output(1);
  ScheduledBatch s3 = s.schedule();
  ASSERT_EQ(s3.seqs.size(), 2u);
  EXPECT_EQ(s3.seqs[1].request, c.get());
  s.commit(s3);
  kv.check_integrity();

  // b grows until the pool runs dry: the newest (c) is preempted, not failed.
  for (int i = 0; i < 60 && s3.preempted.empty(); ++i) {
    b->append_output(2);
    s3 = s.schedule();
    if (!s3.preempted.empty()) break;
    s.commit(s3);
  }
  ASSERT_EQ(s3.preempted.size(), 1u);
  EXPECT_EQ(s3.preempted[0], c.get());
  EXPECT_EQ(c->state, RequestState::Preempted);
  EXPECT_EQ(c->num_computed_tokens, 0);
  EXPECT_FALSE(kv.holds(c->id()));
  kv.check_integrity();
  s.finish(b.get());
  s.finish(c.get());
  EXPECT_EQ(kv.pool().num_free(), 8);
}

TEST(StepPlan, RefusesARequestThatCanNeverFit) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 4, manager_config(64));
  Scheduler s(SchedulerConfig{}, kv);
  auto big = make_request(9, 100);
  EXPECT_THROW(s.add(big.get()), Error);
}

}  // namespace
}  // namespace deepinfer
