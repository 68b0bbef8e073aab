// DeepSeek's published EPLB algorithm (github.com/deepseek-ai/EPLB), written
// from its description as a baseline for the simulator and tests:
//  - replication: repeatedly give one more replica to the expert whose load per
//    replica is highest (no cap on replicas);
//  - balanced packing: items sorted by weight, heaviest first, each to the
//    lightest pack that still has a free slot (no co-location rule, no swaps);
//  - hierarchical when num_groups % num_nodes == 0: pack expert groups to nodes,
//    replicate each node's experts within the node, pack the node's replicas to
//    its GPUs. Otherwise the same with one group and one node.
#pragma once

#include <span>

#include "moe/eplb.h"

namespace deepinfer::moe {

ExpertPlacement deepseek_eplb_placement(std::span<const double> load, const EplbConfig& config);

}  // namespace deepinfer::moe
