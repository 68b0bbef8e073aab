// Helpers the KV unit tests share: token runs, a small cache layout, the
// tiers' reference to a prompt's block, and a KvStorage block's bytes set
// from a seed and read back whole.
#pragma once

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "kv/kv_storage.h"
#include "kv/kv_tier_link.h"

namespace deepinfer::kv_test {

inline std::vector<int32_t> iota_tokens(int32_t n, int32_t from = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), from);
  return t;
}

// Two layers of two f32 heads of 8, 16-token pages: blocks of 4 KiB.
inline KvCacheSpec small_kv_spec() {
  KvCacheSpec spec;
  spec.n_layers = 2;
  spec.n_heads_kv = 2;
  spec.head_dim = 8;
  spec.page_size = 16;
  spec.dtype = DType::F32;
  return spec;
}

// Block b (16 tokens, group 0, no salt) of a prompt as the prefix cache registers it.
inline KvBlockRef prompt_block_ref(std::span<const int32_t> prompt, std::span<const BlockHash> hashes, int32_t b) {
  const auto i = static_cast<size_t>(b);
  return {0, b, hashes[i], b ? hashes[i - 1] : BlockHash{}, "", prompt.subspan(i * 16, 16)};
}

// Every byte of a block's pages, K and V of each layer, set from `seed`.
inline void fill_block(KvStorage& kv, int32_t block, uint8_t seed) {
  for (int32_t l = 0; l < kv.spec().n_layers; ++l) {
    const KvCacheLayer layer = kv.layer(l);
    for (const Tensor* t : {&layer.k, &layer.v}) {
      const Tensor page = t->slice_rows(block, 1);
      auto* p = static_cast<uint8_t*>(page.data());
      for (size_t i = 0; i < page.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed + i * 3 + l);
    }
  }
}

inline std::vector<uint8_t> block_bytes(const KvStorage& kv, int32_t block) {
  std::vector<uint8_t> out;
  for (int32_t l = 0; l < kv.spec().n_layers; ++l) {
    const KvCacheLayer layer = kv.layer(l);
    for (const Tensor* t : {&layer.k, &layer.v}) {
      const Tensor page = t->slice_rows(block, 1);
      const auto* p = static_cast<const uint8_t*>(page.data());
      out.insert(out.end(), p, p + page.nbytes());
    }
  }
  return out;
}

}  // namespace deepinfer::kv_test
