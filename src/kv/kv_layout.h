// KvLayout: how a model's layers share the KV block pool.
//
// Layers that attend the same way (full context, or one sliding window W)
// need the same pages at the same time, so they form a kind. A sliding kind
// only needs the last W positions of a sequence; a full kind needs all of
// them. Giving every kind its own page table per sequence lets a windowed
// layer drop pages its window has passed while a full layer keeps them.
//
// All kinds draw on one pool of equal blocks, so memory moves freely between
// them as the mix of sequence lengths changes. A block holds one page for
// `slots_per_block` layers; each kind is cut into groups of that many layers
// (the last group of a kind may leave slots unused), and each group has its own
// page table per sequence. Layer l stores its page p of group g at
// slot_of_layer[l] of block table_g[p]. slots_per_block is the layer count of
// the smallest kind, so a model with one kind has one group holding every
// layer, exactly the classic layout.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer {

struct KvGroup {
  int32_t window = 0;           // 0: full attention; else the layers' sliding window
  std::vector<int32_t> layers;  // model layer indices, at slots 0, 1, ... of each block
};

struct KvLayout {
  std::vector<KvGroup> groups;
  std::vector<int32_t> group_of_layer;
  std::vector<int32_t> slot_of_layer;
  int32_t slots_per_block = 0;

  // One group per slots_per_block layers of each attention kind; kinds in
  // order of first appearance. layer_window[l] is 0 for full attention.
  static KvLayout from_windows(std::span<const int32_t> layer_window);
  // Every layer in one group with full-length page tables (no early release):
  // for callers that manage pages by hand (tests, benchmarks).
  static KvLayout single(int32_t n_layers);

  int32_t num_groups() const { return static_cast<int32_t>(groups.size()); }
  int32_t num_layers() const { return static_cast<int32_t>(group_of_layer.size()); }
};

}  // namespace deepinfer
