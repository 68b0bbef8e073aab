// StepPlan building and the scheduler around it, on host data only: chunks,
// joins, finishes, preemption, tokens in flight, several rows per sequence,
// per-group page tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "kv/prefix_cache.h"
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
  // Positions 64..99 go into the last three listed pages of each group.
  std::vector<int32_t> written;
  for (const GroupPages& g : p.groups) written.insert(written.end(), g.pages.end() - 3, g.pages.end());
  std::sort(written.begin(), written.end());
  written.erase(std::unique(written.begin(), written.end()), written.end());
  EXPECT_EQ(p.written_pages(), written);
  EXPECT_LE(written.size(), 6u);
  // A plan for an earlier chunk would read released pages: refused.
  b.seqs[0] = {r.get(), 32, 32, 0};
  b.num_tokens = 32;
  EXPECT_THROW(build_step_plan(b, kv, sampling_row), Error);
}

TEST(StepPlan, WrittenPagesAreThoseOfTheNewPositions) {
  StepPlan p;
  p.page_size = 16;
  // Sequence 0: a chunk at 10..39 (pages 0-2 of its table); sequence 1: a
  // decode at 100, its windowed table starting at position 64.
  p.seqs = {{1, 10, 30, 0, 0, 1}, {2, 100, 1, 30, 1, 1}};
  GroupPages full;
  full.indptr = {0, 3, 10};
  full.pages = {7, 8, 9, 20, 21, 22, 23, 24, 25, 26};
  full.first_pos = {0, 0};
  GroupPages window;
  window.indptr = {0, 3, 6};
  window.pages = {40, 41, 42, 50, 51, 52};
  window.first_pos = {0, 64};
  p.groups = {full, window};
  // Full: 7, 8, 9 and page 6 of sequence 1 (96..111) = 26; windowed: 40-42
  // and (100 - 64) / 16 = listed page 2 = 52.
  EXPECT_EQ(p.written_pages(), (std::vector<int32_t>{7, 8, 9, 26, 40, 41, 42, 52}));
  p.seqs[1].num_tokens = 0;
  EXPECT_EQ(p.written_pages(), (std::vector<int32_t>{7, 8, 9, 40, 41, 42}));
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

// A data-parallel group's decode step (schedule(false)): the decodes only —
// no admission, no prompt chunk — and the facts a rank votes with.
TEST(StepPlan, DecodeOnlyStepsAdmitNobodyAndChunkNothing) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 16, manager_config(48));
  SchedulerConfig sc;
  sc.planner.max_num_batched_tokens = 48;
  Scheduler s(sc, kv);
  auto a = make_request(1, 20), b = make_request(2, 70);
  s.add(a.get());
  EXPECT_EQ(s.pending_prompt_tokens(), 20);
  EXPECT_FALSE(s.has_decodes());

  // A decode step with only waiting work: nobody admitted, nothing scheduled.
  ScheduledBatch d0 = s.schedule(false);
  EXPECT_TRUE(d0.empty());
  EXPECT_EQ(s.num_waiting(), 1u);

  // A prefill step admits a and computes its prompt; then b arrives.
  ScheduledBatch p1 = s.schedule(true);
  ASSERT_EQ(p1.seqs.size(), 1u);
  EXPECT_EQ(p1.num_prompt_tokens, 20);
  s.commit(p1);
  a->append_output(5);
  s.add(b.get());
  EXPECT_TRUE(s.has_decodes());
  EXPECT_EQ(s.pending_prompt_tokens(), 70);

  // Decode steps: a decodes, b stays waiting however often they run.
  for (int i = 0; i < 3; ++i) {
    ScheduledBatch d = s.schedule(false);
    ASSERT_EQ(d.seqs.size(), 1u);
    EXPECT_EQ(d.seqs[0].request, a.get());
    EXPECT_EQ(d.num_prompt_tokens, 0);
    EXPECT_EQ(s.num_waiting(), 1u);
    s.commit(d);
    a->append_output(6 + i);
  }

  // A prefill step: a's decode and b's first chunk (47 of its 70 tokens).
  ScheduledBatch p2 = s.schedule(true);
  ASSERT_EQ(p2.seqs.size(), 2u);
  EXPECT_EQ(p2.num_prompt_tokens, 47);
  s.commit(p2);
  a->append_output(9);
  // b is mid-prompt: prefill work still pending, which a decode step leaves.
  EXPECT_EQ(s.pending_prompt_tokens(), 23);
  ScheduledBatch d2 = s.schedule(false);
  ASSERT_EQ(d2.seqs.size(), 1u);
  EXPECT_EQ(d2.seqs[0].request, a.get());
  s.commit(d2);
  kv.check_integrity();
  s.finish(a.get());
  s.finish(b.get());
  EXPECT_EQ(kv.pool().num_free(), 16);
}

// Blocks of `tokens` the prefix cache holds (full blocks only).
size_t cached_blocks(const KvCacheManager& kv, const std::vector<int32_t>& tokens) {
  const auto hashes = PrefixCache::compute_block_hashes(tokens, kv.block_size());
  return kv.prefix_cache()->lookup(hashes, tokens).size();
}

TEST(StepPlan, DraftsAreVerifiedThenRolledBackAndOnlyAcceptedTokensAreCached) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 16, manager_config(64));
  Scheduler s(SchedulerConfig{}, kv);
  auto r = make_request(4, 14);
  s.add(r.get());
  ScheduledBatch prefill = s.schedule();
  s.commit(prefill);
  r->append_output(7);  // position 14; the step below computes it
  // Drafts for positions 15..19: the first one completes block 0.
  r->draft_ids = {8, 9, 10, 11, 12};
  ScheduledBatch verify = s.schedule();
  ASSERT_EQ(verify.seqs.size(), 1u);
  EXPECT_EQ(verify.seqs[0].start, 14);
  EXPECT_EQ(verify.seqs[0].num_tokens, 6);
  EXPECT_EQ(verify.seqs[0].num_sample_rows, 6);
  EXPECT_EQ(verify.seqs[0].num_draft_tokens, 5);
  const StepPlan plan = build_step_plan(verify, kv, sampling_row);
  ASSERT_EQ(plan.num_tokens(), 6);
  EXPECT_EQ(plan.tokens[0].id, 7);
  EXPECT_EQ(plan.tokens[1].id, 8);
  EXPECT_EQ(plan.tokens[5].id, 12);
  ASSERT_EQ(plan.num_rows(), 6);
  for (int32_t j = 0; j < 6; ++j) {
    EXPECT_EQ(plan.rows[static_cast<size_t>(j)].query, j);
    EXPECT_EQ(plan.rows[static_cast<size_t>(j)].sampling.params.position, 1 + j) << "output index of row " << j;
  }
  EXPECT_EQ(plan.groups[0].pages.size(), 2u) << "the drafts' slots reach into block 1";
  s.commit(verify);
  EXPECT_TRUE(r->verifying);
  EXPECT_FALSE(r->schedulable()) << "nothing is planned until the verification is read";
  EXPECT_EQ(r->num_computed_tokens, 15) << "only the known token counts as computed";
  const std::vector<int32_t> with_draft = [&] {
    std::vector<int32_t> t = r->all_tokens();
    t.push_back(8);
    return t;
  }();
  EXPECT_EQ(cached_blocks(kv, with_draft), 0u) << "a draft is not cached before it is accepted";

  // The target sampled 5 instead of the first draft: rejected, and 5 is the
  // new output. Block 0's last position holds the rejected draft's K/V, so
  // it must not be cached until 5 has been computed there.
  r->append_output(5);
  s.accept_drafts(*r);
  EXPECT_FALSE(r->verifying);
  EXPECT_TRUE(r->draft_ids.empty());
  EXPECT_EQ(r->num_computed_tokens, 15);
  EXPECT_EQ(cached_blocks(kv, r->all_tokens()), 0u);
  EXPECT_EQ(cached_blocks(kv, with_draft), 0u);
  ScheduledBatch decode = s.schedule();
  ASSERT_EQ(decode.seqs.size(), 1u);
  EXPECT_EQ(decode.seqs[0].start, 15);
  EXPECT_EQ(decode.seqs[0].num_tokens, 1);
  EXPECT_EQ(decode.seqs[0].num_draft_tokens, 0);
  s.commit(decode);
  EXPECT_EQ(cached_blocks(kv, r->all_tokens()), 1u) << "block 0 with the accepted token";
  EXPECT_EQ(cached_blocks(kv, with_draft), 0u) << "never the rejected draft";

  // Accepted drafts: three of four, then the target's own token.
  r->append_output(6);
  r->draft_ids = {20, 21, 22, 23};
  ScheduledBatch v2 = s.schedule();
  ASSERT_EQ(v2.seqs[0].num_draft_tokens, 4);
  s.commit(v2);
  for (int32_t t : {20, 21, 22, 30}) r->append_output(t);
  s.accept_drafts(*r);
  EXPECT_EQ(r->num_computed_tokens, r->num_tokens() - 1);
  kv.check_integrity();
  s.finish(r.get());
  EXPECT_EQ(kv.pool().num_free(), 16);
}

TEST(StepPlan, DraftsGiveWayToTheBudgetAndToMemory) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 3, manager_config(64));
  SchedulerConfig sc;
  sc.capacity.watermark_blocks = 0;
  sc.planner.max_num_batched_tokens = 3;
  Scheduler s(sc, kv);
  auto r = make_request(5, 3);
  s.add(r.get());
  s.commit(s.schedule());
  r->append_output(1);
  r->draft_ids = {2, 3, 4, 5};
  // The budget of 3 tokens keeps the known token and two drafts.
  ScheduledBatch b = s.schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].num_draft_tokens, 2);
  EXPECT_EQ(r->draft_ids, (std::vector<int32_t>{2, 3}));
  s.commit(b);
  for (int32_t t : {2, 3, 9}) r->append_output(t);
  s.accept_drafts(*r);
  // 3 blocks of 16 tokens hold 48: 45 more drafts do not fit; they are dropped, not
  // the request preempted.
  r->draft_ids.assign(45, 1);
  ScheduledBatch c = s.schedule();
  EXPECT_TRUE(c.preempted.empty());
  ASSERT_EQ(c.seqs.size(), 1u);
  EXPECT_EQ(c.seqs[0].num_draft_tokens, 0);
  EXPECT_TRUE(r->draft_ids.empty());
  s.commit(c);
  kv.check_integrity();
  s.finish(r.get());
}

TEST(StepPlan, RefusesARequestThatCanNeverFit) {
  KvCacheManager kv(KvLayout::from_windows(std::vector<int32_t>{0}), 4, manager_config(64));
  Scheduler s(SchedulerConfig{}, kv);
  auto big = make_request(9, 100);
  EXPECT_THROW(s.add(big.get()), Error);
}

}  // namespace
}  // namespace deepinfer
