// KvStorage: the backend memory holding every layer's K and V pages. Which
// pages belong to which sequence is decided elsewhere (BlockPool, scheduler);
// this class only owns the memory and hands out per-layer views.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

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
};

class KvStorage {
 public:
  KvStorage(Backend& backend, const KvCacheSpec& spec, int32_t num_pages);

  const KvCacheSpec& spec() const { return spec_; }
  // Pages handed out by the BlockPool: [0, num_pages()).
  int32_t num_pages() const { return num_pages_; }
  // One extra zero-filled page that padding rows of a fixed-size (graph) step
  // attend to and write nothing into; never owned by a sequence.
  int32_t padding_page() const { return num_pages_; }
  int32_t page_size() const { return spec_.page_size; }
  KvCacheLayer layer(int32_t index) const;
  size_t bytes() const { return buffer_.size(); }

 private:
  KvCacheSpec spec_;
  int32_t num_pages_;
  Buffer buffer_;
};

}  // namespace deepinfer
