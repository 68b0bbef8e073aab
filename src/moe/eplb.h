// Expert-parallel load balancing (EPLB): where the experts of one MoE layer live.
//
// Pure functions: given each logical expert's load over a window, decide how many
// replicas each expert gets and which rank (GPU) slot holds which replica. Hot
// experts are replicated first, then replicas are packed onto ranks so every
// rank carries about the same load. Tokens routed to an expert are shared equally
// among its replicas, so a rank's load is the sum of load/replica_count over the
// replicas it holds. moe_lb = slowest rank's load / mean rank load (1 = perfect).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::moe {

struct EplbConfig {
  int32_t num_ranks = 1;
  // Extra slots per rank beyond num_logical / num_ranks, filled with replicas of hot experts.
  int32_t redundant_slots_per_rank = 0;
  // Hierarchical placement when num_nodes > 1 and num_groups % num_nodes == 0:
  // whole expert groups are assigned to nodes (so group-limited routing stays
  // inside a node) and replication/packing happens within each node. Otherwise
  // the placement is global over all ranks.
  int32_t num_nodes = 1;
  int32_t num_groups = 1;
};

// One layer's placement: rank r holds physical slots [r*slots_per_rank, (r+1)*slots_per_rank).
class ExpertPlacement {
 public:
  ExpertPlacement() = default;
  // Validates the map (every slot holds a logical expert in range, every expert
  // has at least one replica) and builds the logical->physical index.
  ExpertPlacement(int32_t num_logical, int32_t num_ranks, int32_t slots_per_rank,
                  std::vector<int32_t> physical_to_logical);

  int32_t num_logical() const { return num_logical_; }
  int32_t num_ranks() const { return num_ranks_; }
  int32_t slots_per_rank() const { return slots_per_rank_; }
  int32_t num_physical() const { return num_ranks_ * slots_per_rank_; }
  int32_t rank_of(int32_t physical) const { return physical / slots_per_rank_; }

  const std::vector<int32_t>& physical_to_logical() const { return physical_to_logical_; }
  const std::vector<int32_t>& replica_counts() const { return replica_count_; }
  int32_t replica_count(int32_t logical) const { return replica_count_.at(logical); }
  // Physical slots holding `logical`, ascending. Routing picks one of them per
  // token (round-robin or by token index) so each replica gets an equal share.
  std::span<const int32_t> replicas(int32_t logical) const;
  // Replica for the n-th token routed to `logical` (equal shares by rotation).
  int32_t route(int32_t logical, uint64_t n) const;

 private:
  int32_t num_logical_ = 0;
  int32_t num_ranks_ = 0;
  int32_t slots_per_rank_ = 0;
  std::vector<int32_t> physical_to_logical_;
  std::vector<int32_t> replica_count_;
  std::vector<int32_t> logical_offsets_;  // CSR into logical_to_physical_
  std::vector<int32_t> logical_to_physical_;
};

// Replica counts summing to `num_physical` (each >= 1): every extra replica goes
// to the expert with the highest load per replica, never beyond `max_replicas`
// per expert while another expert can still take one.
std::vector<int32_t> replicate_experts(std::span<const double> load, int32_t num_physical, int32_t max_replicas);

// The balancing policy; hierarchical or global according to EplbConfig.
// Requires load.size() % num_ranks == 0 and finite non-negative loads.
ExpertPlacement place_experts(std::span<const double> load, const EplbConfig& config);
// Global variant: replicate over all slots, then pack replicas onto all ranks.
ExpertPlacement place_experts_global(std::span<const double> load, int32_t num_ranks,
                                     int32_t redundant_slots_per_rank);
// Hierarchical variant (see EplbConfig); throws unless groups divide across nodes.
ExpertPlacement place_experts_hierarchical(std::span<const double> load, const EplbConfig& config);

// The unbalanced baseline: expert e on rank e / (num_logical / num_ranks), no replicas.
ExpertPlacement contiguous_placement(int32_t num_logical, int32_t num_ranks);

// Load of each rank when every expert's load is split equally among its replicas.
std::vector<double> rank_loads(std::span<const double> load, const ExpertPlacement& placement);
// max rank load / mean rank load; 1.0 when there is no load at all.
double moe_lb(std::span<const double> load, const ExpertPlacement& placement);

}  // namespace deepinfer::moe
