// KvStorage: the backend memory holding every layer's K and V pages. Which
// pages belong to which sequence is decided elsewhere (KvCacheManager); this
// class only owns the memory and hands out per-layer views. A block (page id)
// holds one page for each of the layout's slots_per_block layer slots; layers
// of different groups that share a slot share its memory, and the manager
// never gives one block to two groups at once (kv_layout.h).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_layout.h"

namespace deepinfer {

struct KvCacheSpec {
  int32_t n_layers = 0;
  int32_t n_heads_kv = 0;
  int32_t head_dim = 0;
  int32_t page_size = 16;  // token slots per page
  DType dtype = DType::F32;
  // MLA (DeepSeek): 0 = separate K and V pages of head_dim. Otherwise each
  // token stores one row of head_dim (latent, then the roped key part) and V
  // is a view of its first latent_v_dim channels: no V pages exist.
  int32_t latent_v_dim = 0;

  size_t bytes_per_page() const;  // all layers, K and V
  // One block of a layout: a page for each of `slots` layer slots, K and V.
  size_t bytes_per_block(int32_t slots) const;
};

class KvStorage {
 public:
  // The layout's layers must be the spec's; by default one group of all layers.
  KvStorage(Backend& backend, const KvCacheSpec& spec, int32_t num_pages);
  KvStorage(Backend& backend, const KvCacheSpec& spec, int32_t num_pages, KvLayout layout);

  const KvCacheSpec& spec() const { return spec_; }
  const KvLayout& layout() const { return layout_; }
  // Which page table (group) a layer's attention reads.
  int32_t group_of_layer(int32_t layer) const { return layout_.group_of_layer[static_cast<size_t>(layer)]; }
  // Pages handed out by the BlockPool: [0, num_pages()).
  int32_t num_pages() const { return num_pages_; }
  // One extra zero-filled page that padding rows of a fixed-size (graph) step
  // attend to and write nothing into; never owned by a sequence.
  int32_t padding_page() const { return num_pages_; }
  int32_t page_size() const { return spec_.page_size; }
  // The view of a layer's slot: page ids index it like any other layer's.
  KvCacheLayer layer(int32_t index) const;
  size_t bytes() const { return buffer_.size(); }

  // One block's pages of every slot as one contiguous run of
  // bytes_per_block() bytes (slot 0's K page, its V page, slot 1's, ...), to
  // or from host memory from Backend::allocate_host; enqueued in order with
  // the backend's ops (the host side is valid or reusable once a later event
  // completes).
  size_t bytes_per_block() const { return spec_.bytes_per_block(layout_.slots_per_block); }
  void save_block(int32_t block, void* host) const;
  // save_block on a copy stream (the caller orders it after the step writing the block).
  void save_block(int32_t block, void* host, CopyStream& stream) const;
  void load_block(int32_t block, const void* host);
  // load_block for several blocks at once (Backend::copy_blocks_async): from
  // device memory (another engine's shared pool) in one launch.
  void load_blocks(std::span<const std::pair<int32_t, const void*>> blocks);

 private:
  KvCacheLayer slot_view(int32_t slot) const;
  size_t page_bytes() const;
  // Bytes between one slot's K (or V) pages and the next's.
  size_t part_bytes() const;
  size_t num_parts() const;

  Backend& backend_;
  KvCacheSpec spec_;
  KvLayout layout_;
  int32_t num_pages_;
  Buffer buffer_;
};

}  // namespace deepinfer
