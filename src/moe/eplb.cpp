#include "moe/eplb.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace deepinfer::moe {
namespace {

// Generous bounds so that products below cannot overflow int32.
constexpr int64_t kMaxSlots = int64_t{1} << 24;

void check_load(std::span<const double> load) {
  DI_CHECK(!load.empty(), "EPLB: no experts in the load vector");
  DI_CHECK(static_cast<int64_t>(load.size()) <= kMaxSlots, "EPLB: {} experts is too many", load.size());
  for (size_t i = 0; i < load.size(); ++i) {
    DI_CHECK(std::isfinite(load[i]) && load[i] >= 0.0, "EPLB: load of expert {} is {} (must be finite and >= 0)", i,
             load[i]);
  }
}

int32_t slots_per_rank_for(size_t num_logical, int32_t num_ranks, int32_t redundant) {
  DI_CHECK(num_ranks >= 1, "EPLB: num_ranks must be >= 1, got {}", num_ranks);
  DI_CHECK(redundant >= 0, "EPLB: redundant slots per rank must be >= 0, got {}", redundant);
  DI_CHECK(num_logical % static_cast<size_t>(num_ranks) == 0,
           "EPLB: {} experts do not divide evenly across {} ranks", num_logical, num_ranks);
  const int64_t slots = static_cast<int64_t>(num_logical) / num_ranks + redundant;
  DI_CHECK(slots * num_ranks <= kMaxSlots, "EPLB: {} ranks x {} slots is too many", num_ranks, slots);
  return static_cast<int32_t>(slots);
}

struct Item {
  int32_t logical;
  double weight;
};

bool bin_holds(const std::vector<int32_t>& bin, const std::vector<Item>& items, int32_t logical) {
  for (int32_t i : bin) {
    if (items[i].logical == logical) return true;
  }
  return false;
}

// Balanced packing with a slot-count constraint: heaviest item first, each to the
// least-loaded bin that has a free slot and, where possible, no copy of the same
// expert yet (two replicas on one rank would split load without spreading it).
// Then pairwise swaps out of the heaviest bin while they lower its load, since
// the greedy pass alone can leave the maximum a whole small item above the mean.
std::vector<std::vector<int32_t>> pack(const std::vector<Item>& items, int32_t num_bins, int32_t slots_per_bin) {
  std::vector<int32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return items[a].weight > items[b].weight; });
  std::vector<std::vector<int32_t>> bins(num_bins);
  std::vector<double> bin_load(num_bins, 0.0);
  for (int32_t it : order) {
    int32_t best = -1;
    int32_t fallback = -1;
    for (int32_t b = 0; b < num_bins; ++b) {
      if (static_cast<int32_t>(bins[b].size()) >= slots_per_bin) continue;
      if (fallback < 0 || bin_load[b] < bin_load[fallback]) fallback = b;
      if (bin_holds(bins[b], items, items[it].logical)) continue;
      if (best < 0 || bin_load[b] < bin_load[best]) best = b;
    }
    if (best < 0) best = fallback;
    bins[best].push_back(it);
    bin_load[best] += items[it].weight;
  }

  const double total = std::accumulate(bin_load.begin(), bin_load.end(), 0.0);
  const double eps = 1e-12 * std::max(total, 1e-300);
  for (int64_t iter = 0; iter < 64 * static_cast<int64_t>(items.size()); ++iter) {
    const int32_t hi = static_cast<int32_t>(std::max_element(bin_load.begin(), bin_load.end()) - bin_load.begin());
    double best_peak = bin_load[hi] - eps;
    int32_t best_a = -1, best_b = -1, best_c = -1;
    for (size_t ai = 0; ai < bins[hi].size(); ++ai) {
      const Item& a = items[bins[hi][ai]];
      for (int32_t b = 0; b < num_bins; ++b) {
        if (b == hi || bin_holds(bins[b], items, a.logical)) continue;
        for (size_t ci = 0; ci < bins[b].size(); ++ci) {
          const Item& c = items[bins[b][ci]];
          const double delta = a.weight - c.weight;
          if (delta <= 0.0 || bin_holds(bins[hi], items, c.logical)) continue;
          const double peak = std::max(bin_load[hi] - delta, bin_load[b] + delta);
          if (peak < best_peak) {
            best_peak = peak;
            best_a = static_cast<int32_t>(ai);
            best_b = b;
            best_c = static_cast<int32_t>(ci);
          }
        }
      }
    }
    if (best_a < 0) break;
    const double delta = items[bins[hi][best_a]].weight - items[bins[best_b][best_c]].weight;
    std::swap(bins[hi][best_a], bins[best_b][best_c]);
    bin_load[hi] -= delta;
    bin_load[best_b] += delta;
  }
  return bins;
}

// Replicates the experts `logical_ids` (loads from `load`) into
// num_bins * slots_per_bin replicas and packs them; writes the result into
// physical_to_logical starting at bin `first_bin`.
void place_within(std::span<const double> load, const std::vector<int32_t>& logical_ids, int32_t num_bins,
                  int32_t slots_per_bin, int32_t first_bin, std::vector<int32_t>& physical_to_logical) {
  std::vector<double> local_load(logical_ids.size());
  for (size_t i = 0; i < logical_ids.size(); ++i) local_load[i] = load[logical_ids[i]];
  const std::vector<int32_t> counts = replicate_experts(local_load, num_bins * slots_per_bin, num_bins);
  std::vector<Item> items;
  items.reserve(static_cast<size_t>(num_bins) * slots_per_bin);
  for (size_t i = 0; i < logical_ids.size(); ++i) {
    for (int32_t r = 0; r < counts[i]; ++r) items.push_back({logical_ids[i], local_load[i] / counts[i]});
  }
  std::vector<std::vector<int32_t>> bins = pack(items, num_bins, slots_per_bin);
  for (int32_t b = 0; b < num_bins; ++b) {
    std::vector<int32_t> held;
    for (int32_t it : bins[b]) held.push_back(items[it].logical);
    std::sort(held.begin(), held.end());
    std::copy(held.begin(), held.end(),
              physical_to_logical.begin() + static_cast<size_t>(first_bin + b) * slots_per_bin);
  }
}

}  // namespace

ExpertPlacement::ExpertPlacement(int32_t num_logical, int32_t num_ranks, int32_t slots_per_rank,
                                 std::vector<int32_t> physical_to_logical)
    : num_logical_(num_logical),
      num_ranks_(num_ranks),
      slots_per_rank_(slots_per_rank),
      physical_to_logical_(std::move(physical_to_logical)) {
  DI_CHECK(num_logical >= 1 && num_ranks >= 1 && slots_per_rank >= 1,
           "ExpertPlacement: bad shape ({} experts, {} ranks, {} slots per rank)", num_logical, num_ranks,
           slots_per_rank);
  DI_CHECK(static_cast<int64_t>(num_ranks) * slots_per_rank <= kMaxSlots, "ExpertPlacement: too many slots");
  DI_CHECK(physical_to_logical_.size() == static_cast<size_t>(num_ranks) * slots_per_rank,
           "ExpertPlacement: {} slots given, expected {} ranks x {} slots", physical_to_logical_.size(), num_ranks,
           slots_per_rank);
  replica_count_.assign(num_logical, 0);
  for (size_t p = 0; p < physical_to_logical_.size(); ++p) {
    const int32_t e = physical_to_logical_[p];
    DI_CHECK(e >= 0 && e < num_logical, "ExpertPlacement: slot {} holds expert {} (valid: 0..{})", p, e,
             num_logical - 1);
    ++replica_count_[e];
  }
  logical_offsets_.assign(num_logical + 1, 0);
  for (int32_t e = 0; e < num_logical; ++e) {
    DI_CHECK(replica_count_[e] > 0, "ExpertPlacement: expert {} has no replica", e);
    logical_offsets_[e + 1] = logical_offsets_[e] + replica_count_[e];
  }
  logical_to_physical_.assign(physical_to_logical_.size(), 0);
  std::vector<int32_t> next(logical_offsets_.begin(), logical_offsets_.end() - 1);
  for (size_t p = 0; p < physical_to_logical_.size(); ++p) {
    logical_to_physical_[next[physical_to_logical_[p]]++] = static_cast<int32_t>(p);
  }
}

std::span<const int32_t> ExpertPlacement::replicas(int32_t logical) const {
  DI_CHECK(logical >= 0 && logical < num_logical_, "ExpertPlacement: expert {} out of range", logical);
  return {logical_to_physical_.data() + logical_offsets_[logical], static_cast<size_t>(replica_count_[logical])};
}

int32_t ExpertPlacement::route(int32_t logical, uint64_t n) const {
  std::span<const int32_t> r = replicas(logical);
  return r[n % r.size()];
}

std::vector<int32_t> replicate_experts(std::span<const double> load, int32_t num_physical, int32_t max_replicas) {
  check_load(load);
  const int32_t num_logical = static_cast<int32_t>(load.size());
  DI_CHECK(num_physical >= num_logical, "EPLB: {} physical slots cannot hold {} experts", num_physical,
           num_logical);
  DI_CHECK(max_replicas >= 1, "EPLB: max_replicas must be >= 1, got {}", max_replicas);
  std::vector<int32_t> counts(num_logical, 1);
  for (int32_t extra = num_logical; extra < num_physical; ++extra) {
    int32_t best = -1;
    int32_t best_any = 0;
    for (int32_t e = 0; e < num_logical; ++e) {
      const double per = load[e] / counts[e];
      if (per > load[best_any] / counts[best_any]) best_any = e;
      if (counts[e] < max_replicas && (best < 0 || per > load[best] / counts[best])) best = e;
    }
    ++counts[best < 0 ? best_any : best];
  }
  return counts;
}

ExpertPlacement place_experts_global(std::span<const double> load, int32_t num_ranks,
                                     int32_t redundant_slots_per_rank) {
  check_load(load);
  const int32_t slots = slots_per_rank_for(load.size(), num_ranks, redundant_slots_per_rank);
  std::vector<int32_t> ids(load.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<int32_t> p2l(static_cast<size_t>(num_ranks) * slots);
  place_within(load, ids, num_ranks, slots, 0, p2l);
  return ExpertPlacement(static_cast<int32_t>(load.size()), num_ranks, slots, std::move(p2l));
}

ExpertPlacement place_experts_hierarchical(std::span<const double> load, const EplbConfig& config) {
  check_load(load);
  const int32_t num_logical = static_cast<int32_t>(load.size());
  const int32_t slots = slots_per_rank_for(load.size(), config.num_ranks, config.redundant_slots_per_rank);
  const int32_t nodes = config.num_nodes;
  const int32_t groups = config.num_groups;
  DI_CHECK(nodes >= 1 && config.num_ranks % nodes == 0, "EPLB: {} ranks do not divide across {} nodes",
           config.num_ranks, nodes);
  DI_CHECK(groups >= 1 && num_logical % groups == 0, "EPLB: {} experts do not form {} equal groups", num_logical,
           groups);
  DI_CHECK(groups % nodes == 0, "EPLB: {} expert groups do not divide across {} nodes", groups, nodes);
  const int32_t group_size = num_logical / groups;
  const int32_t ranks_per_node = config.num_ranks / nodes;

  std::vector<Item> group_items(groups);
  for (int32_t g = 0; g < groups; ++g) {
    double sum = 0.0;
    for (int32_t i = 0; i < group_size; ++i) sum += load[g * group_size + i];
    group_items[g] = {g, sum};
  }
  const std::vector<std::vector<int32_t>> node_groups = pack(group_items, nodes, groups / nodes);

  std::vector<int32_t> p2l(static_cast<size_t>(config.num_ranks) * slots);
  for (int32_t n = 0; n < nodes; ++n) {
    std::vector<int32_t> ids;
    for (int32_t g : node_groups[n]) {
      for (int32_t i = 0; i < group_size; ++i) ids.push_back(g * group_size + i);
    }
    std::sort(ids.begin(), ids.end());
    place_within(load, ids, ranks_per_node, slots, n * ranks_per_node, p2l);
  }
  return ExpertPlacement(num_logical, config.num_ranks, slots, std::move(p2l));
}

ExpertPlacement place_experts(std::span<const double> load, const EplbConfig& config) {
  DI_CHECK(config.num_nodes >= 1 && config.num_groups >= 1, "EPLB: num_nodes and num_groups must be >= 1");
  if (config.num_nodes > 1 && config.num_groups % config.num_nodes == 0) {
    return place_experts_hierarchical(load, config);
  }
  return place_experts_global(load, config.num_ranks, config.redundant_slots_per_rank);
}

ExpertPlacement contiguous_placement(int32_t num_logical, int32_t num_ranks) {
  DI_CHECK(num_logical >= 1, "EPLB: need at least one expert");
  const int32_t slots = slots_per_rank_for(static_cast<size_t>(num_logical), num_ranks, 0);
  std::vector<int32_t> p2l(num_logical);
  std::iota(p2l.begin(), p2l.end(), 0);
  return ExpertPlacement(num_logical, num_ranks, slots, std::move(p2l));
}

std::vector<double> rank_loads(std::span<const double> load, const ExpertPlacement& placement) {
  DI_CHECK(static_cast<int64_t>(load.size()) == placement.num_logical(),
           "EPLB: load vector has {} experts, placement has {}", load.size(), placement.num_logical());
  std::vector<double> ranks(placement.num_ranks(), 0.0);
  const auto& p2l = placement.physical_to_logical();
  for (size_t p = 0; p < p2l.size(); ++p) {
    const int32_t e = p2l[p];
    ranks[placement.rank_of(static_cast<int32_t>(p))] += load[e] / placement.replica_count(e);
  }
  return ranks;
}

double moe_lb(std::span<const double> load, const ExpertPlacement& placement) {
  const std::vector<double> ranks = rank_loads(load, placement);
  const double total = std::accumulate(ranks.begin(), ranks.end(), 0.0);
  if (!(total > 0.0)) return 1.0;
  return *std::max_element(ranks.begin(), ranks.end()) / (total / static_cast<double>(ranks.size()));
}

}  // namespace deepinfer::moe
