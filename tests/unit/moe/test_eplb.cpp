#include "moe/eplb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "core/error.h"
#include "moe/deepseek_eplb.h"

namespace deepinfer::moe {
namespace {

std::vector<double> skewed_load(int32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> load(n);
  for (int32_t i = 0; i < n; ++i) load[i] = 1000.0 / std::pow(1.0 + static_cast<double>(rng() % n), 0.7);
  return load;
}

void expect_valid(const ExpertPlacement& p, int32_t num_logical, int32_t ranks, int32_t redundant) {
  ASSERT_EQ(p.num_logical(), num_logical);
  ASSERT_EQ(p.num_ranks(), ranks);
  ASSERT_EQ(p.slots_per_rank(), num_logical / ranks + redundant);
  ASSERT_EQ(p.physical_to_logical().size(), static_cast<size_t>(ranks) * p.slots_per_rank());
  int32_t total = 0;
  for (int32_t e = 0; e < num_logical; ++e) {
    EXPECT_GE(p.replica_count(e), 1) << "expert " << e;
    total += p.replica_count(e);
    // Replicas are on distinct ranks whenever that is possible.
    std::set<int32_t> ranks_of_e;
    for (int32_t phys : p.replicas(e)) {
      EXPECT_EQ(p.physical_to_logical()[phys], e);
      ranks_of_e.insert(p.rank_of(phys));
    }
    EXPECT_EQ(ranks_of_e.size(), static_cast<size_t>(std::min(p.replica_count(e), ranks))) << "expert " << e;
  }
  EXPECT_EQ(total, p.num_physical());
}

TEST(Eplb, EveryExpertPlacedAndSlotsRespected) {
  for (int32_t ranks : {1, 4, 8, 64, 256}) {
    for (int32_t redundant : {0, 1, 4}) {
      const std::vector<double> load = skewed_load(256, ranks * 10 + redundant);
      const ExpertPlacement p = place_experts_global(load, ranks, redundant);
      SCOPED_TRACE(testing::Message() << "EP" << ranks << " redundant " << redundant);
      expect_valid(p, 256, ranks, redundant);
      const ExpertPlacement d = deepseek_eplb_placement(load, {ranks, redundant, 1, 1});
      EXPECT_EQ(d.num_physical(), p.num_physical());
    }
  }
}

TEST(Eplb, ReplicateHotExpertsByLoadPerReplica) {
  const std::vector<double> load{8, 4, 2, 2};
  // Extras go to the highest load per replica: 8 -> (4, 4 tie: lowest id) -> 8/3.
  EXPECT_EQ(replicate_experts(load, 6, 8), (std::vector<int32_t>{3, 1, 1, 1}));
  // With a cap of 2 replicas the second extra goes to the next hottest expert.
  EXPECT_EQ(replicate_experts(load, 6, 2), (std::vector<int32_t>{2, 2, 1, 1}));
  EXPECT_EQ(replicate_experts(load, 4, 2), (std::vector<int32_t>{1, 1, 1, 1}));

  std::vector<double> one_hot(64, 1.0);
  one_hot[17] = 40.0;
  const ExpertPlacement p = place_experts_global(one_hot, 16, 1);
  EXPECT_EQ(p.replica_count(17), 16);  // hot enough to take every extra slot (capped at one per rank)
  EXPECT_LT(moe_lb(one_hot, p), moe_lb(one_hot, contiguous_placement(64, 16)));
}

TEST(Eplb, MoeLbOfUniformLoadIsOne) {
  const std::vector<double> uniform(128, 5.0);
  for (int32_t ranks : {1, 2, 8, 32, 128}) {
    EXPECT_DOUBLE_EQ(moe_lb(uniform, contiguous_placement(128, ranks)), 1.0);
    EXPECT_NEAR(moe_lb(uniform, place_experts_global(uniform, ranks, 1)), 1.0, 1e-12);
  }
  const std::vector<double> zero(16, 0.0);
  EXPECT_DOUBLE_EQ(moe_lb(zero, place_experts_global(zero, 4, 2)), 1.0);
}

TEST(Eplb, MoeLbAndRankLoadsByHand) {
  const std::vector<double> load{3, 1, 1, 1};
  const ExpertPlacement c = contiguous_placement(4, 2);
  EXPECT_EQ(rank_loads(load, c), (std::vector<double>{4, 2}));
  EXPECT_DOUBLE_EQ(moe_lb(load, c), 4.0 / 3.0);
  // Expert 0 on both ranks: each replica takes half its load.
  const ExpertPlacement r(4, 2, 3, {0, 1, 2, 0, 3, 3});
  EXPECT_EQ(rank_loads(load, r), (std::vector<double>{3.5, 2.5}));
  EXPECT_EQ(r.replica_count(3), 2);
}

TEST(Eplb, BeatsDeepSeekWhereReplicasWouldShareARank) {
  // DeepSeek's algorithm gives expert 0 three replicas on two GPUs, so two of
  // them share a GPU; capping replicas at one per rank balances exactly.
  const std::vector<double> load{8, 4, 2, 2};
  const ExpertPlacement ours = place_experts_global(load, 2, 1);
  const ExpertPlacement ds = deepseek_eplb_placement(load, {2, 1, 1, 1});
  EXPECT_NEAR(moe_lb(load, ours), 1.0, 1e-12);
  EXPECT_NEAR(moe_lb(load, ds), 26.0 / 24.0, 1e-12);  // ranks 8.67 and 7.33 around a mean of 8
}

TEST(Eplb, InSampleBalanceAtLeastAsGoodAsDeepSeekOnSkewedLoads) {
  double ours_sum = 0.0, ds_sum = 0.0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<double> load = skewed_load(256, 1000 + seed);
    const ExpertPlacement ours = place_experts_global(load, 64, 1);
    const ExpertPlacement ds = deepseek_eplb_placement(load, {64, 1, 1, 1});
    EXPECT_LE(moe_lb(load, ours), moe_lb(load, ds) + 1e-9) << "seed " << seed;
    ours_sum += moe_lb(load, ours);
    ds_sum += moe_lb(load, ds);
  }
  EXPECT_LT(ours_sum / 20, 1.02);
  EXPECT_LT(ds_sum / 20, 3.0);
}

TEST(Eplb, HierarchicalKeepsGroupsOnOneNode) {
  const std::vector<double> load = skewed_load(256, 7);
  const EplbConfig config{32, 1, 4, 8};  // 4 nodes x 8 ranks, 8 groups of 32 experts
  for (bool deepseek : {false, true}) {
    const ExpertPlacement p = deepseek ? deepseek_eplb_placement(load, config) : place_experts(load, config);
    SCOPED_TRACE(deepseek ? "deepseek" : "ours");
    ASSERT_EQ(p.num_physical(), 32 * 9);
    const int32_t ranks_per_node = 8;
    std::vector<std::set<int32_t>> nodes_of_group(8);
    std::vector<std::set<int32_t>> groups_of_node(4);
    for (int32_t phys = 0; phys < p.num_physical(); ++phys) {
      const int32_t group = p.physical_to_logical()[phys] / 32;
      const int32_t node = p.rank_of(phys) / ranks_per_node;
      nodes_of_group[group].insert(node);
      groups_of_node[node].insert(group);
    }
    for (const auto& nodes : nodes_of_group) EXPECT_EQ(nodes.size(), 1u);
    for (const auto& groups : groups_of_node) EXPECT_EQ(groups.size(), 2u);
  }
  expect_valid(place_experts(load, config), 256, 32, 1);
  // Groups that do not divide across nodes: global placement.
  const ExpertPlacement global = place_experts(load, {32, 1, 3, 8});
  expect_valid(global, 256, 32, 1);
  EXPECT_THROW(place_experts_hierarchical(load, {32, 1, 3, 8}), Error);
}

TEST(Eplb, RouteSharesTokensEquallyAmongReplicas) {
  const ExpertPlacement p(3, 3, 2, {0, 1, 0, 2, 0, 1});
  std::vector<int32_t> hits(6, 0);
  for (uint64_t n = 0; n < 300; ++n) ++hits[p.route(0, n)];
  EXPECT_EQ(hits, (std::vector<int32_t>{100, 0, 100, 0, 100, 0}));
  EXPECT_EQ(std::vector<int32_t>(p.replicas(1).begin(), p.replicas(1).end()), (std::vector<int32_t>{1, 5}));
  EXPECT_THROW(p.replicas(3), Error);
}

TEST(Eplb, InvalidArgumentsThrow) {
  const std::vector<double> load(16, 1.0);
  EXPECT_THROW(place_experts_global(load, 0, 1), Error);
  EXPECT_THROW(place_experts_global(load, 3, 1), Error);  // 16 experts on 3 ranks
  EXPECT_THROW(place_experts_global(load, 4, -1), Error);
  EXPECT_THROW(place_experts_global(std::vector<double>{}, 1, 0), Error);
  EXPECT_THROW(place_experts_global(std::vector<double>{1.0, -1.0}, 1, 0), Error);
  EXPECT_THROW(place_experts_global(std::vector<double>{1.0, std::nan("")}, 1, 0), Error);
  EXPECT_THROW(place_experts(load, {4, 1, 0, 1}), Error);
  EXPECT_THROW(place_experts_hierarchical(load, {4, 1, 3, 6}), Error);  // 4 ranks on 3 nodes
  EXPECT_THROW(place_experts_hierarchical(load, {4, 1, 2, 3}), Error);  // 16 experts in 3 groups
  EXPECT_THROW(replicate_experts(load, 8, 1), Error);                   // fewer slots than experts
  EXPECT_THROW(contiguous_placement(10, 4), Error);
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 1, 2}), Error);         // wrong slot count
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 1, 1, 0}), Error);      // expert 2 missing
  EXPECT_THROW(ExpertPlacement(3, 2, 2, {0, 1, 2, 3}), Error);      // expert out of range
  EXPECT_THROW(moe_lb(std::vector<double>(8, 1.0), contiguous_placement(16, 4)), Error);
  EXPECT_THROW(deepseek_eplb_placement(load, {3, 1, 1, 1}), Error);
}

}  // namespace
}  // namespace deepinfer::moe
