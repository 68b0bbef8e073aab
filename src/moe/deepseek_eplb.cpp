#include "moe/deepseek_eplb.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace deepinfer::moe {
namespace {

// pack_of[i] for each weight: heaviest first into the lightest non-full pack
// (lowest index on ties).
std::vector<int32_t> balanced_packing(const std::vector<double>& weight, int32_t num_packs) {
  const int32_t per_pack = static_cast<int32_t>(weight.size()) / num_packs;
  std::vector<int32_t> order(weight.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return weight[a] > weight[b]; });
  std::vector<double> pack_weight(num_packs, 0.0);
  std::vector<int32_t> pack_items(num_packs, 0);
  std::vector<int32_t> pack_of(weight.size(), -1);
  for (int32_t i : order) {
    int32_t best = -1;
    for (int32_t p = 0; p < num_packs; ++p) {
      if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
    }
    pack_of[i] = best;
    pack_weight[best] += weight[i];
    ++pack_items[best];
  }
  return pack_of;
}

}  // namespace

ExpertPlacement deepseek_eplb_placement(std::span<const double> load, const EplbConfig& config) {
  const int32_t num_logical = static_cast<int32_t>(load.size());
  const int32_t gpus = config.num_ranks;
  DI_CHECK(num_logical >= 1 && gpus >= 1 && config.redundant_slots_per_rank >= 0 && num_logical % gpus == 0,
           "DeepSeek EPLB: {} experts on {} GPUs with {} redundant slots is not a valid layout", num_logical, gpus,
           config.redundant_slots_per_rank);
  int32_t nodes = config.num_nodes;
  int32_t groups = config.num_groups;
  DI_CHECK(nodes >= 1 && groups >= 1, "DeepSeek EPLB: num_nodes and num_groups must be >= 1");
  if (groups % nodes != 0) {
    nodes = 1;
    groups = 1;
  }
  DI_CHECK(gpus % nodes == 0 && num_logical % groups == 0, "DeepSeek EPLB: groups/nodes do not divide evenly");
  const int32_t slots = num_logical / gpus + config.redundant_slots_per_rank;
  const int32_t group_size = num_logical / groups;
  const int32_t gpus_per_node = gpus / nodes;

  std::vector<double> group_load(groups, 0.0);
  for (int32_t e = 0; e < num_logical; ++e) group_load[e / group_size] += load[e];
  const std::vector<int32_t> node_of_group = balanced_packing(group_load, nodes);

  std::vector<int32_t> p2l(static_cast<size_t>(gpus) * slots);
  for (int32_t n = 0; n < nodes; ++n) {
    std::vector<int32_t> experts;
    for (int32_t g = 0; g < groups; ++g) {
      if (node_of_group[g] != n) continue;
      for (int32_t i = 0; i < group_size; ++i) experts.push_back(g * group_size + i);
    }
    const int32_t node_slots = gpus_per_node * slots;
    std::vector<int32_t> count(experts.size(), 1);
    for (int32_t r = static_cast<int32_t>(experts.size()); r < node_slots; ++r) {
      size_t best = 0;
      for (size_t i = 1; i < experts.size(); ++i) {
        if (load[experts[i]] / count[i] > load[experts[best]] / count[best]) best = i;
      }
      ++count[best];
    }
    std::vector<int32_t> replica_expert;
    std::vector<double> replica_load;
    for (size_t i = 0; i < experts.size(); ++i) {
      for (int32_t c = 0; c < count[i]; ++c) {
        replica_expert.push_back(experts[i]);
        replica_load.push_back(load[experts[i]] / count[i]);
      }
    }
    const std::vector<int32_t> gpu_of = balanced_packing(replica_load, gpus_per_node);
    std::vector<int32_t> filled(gpus_per_node, 0);
    for (size_t i = 0; i < replica_expert.size(); ++i) {
      const int32_t gpu = n * gpus_per_node + gpu_of[i];
      p2l[static_cast<size_t>(gpu) * slots + filled[gpu_of[i]]++] = replica_expert[i];
    }
  }
  return ExpertPlacement(num_logical, gpus, slots, std::move(p2l));
}

}  // namespace deepinfer::moe
