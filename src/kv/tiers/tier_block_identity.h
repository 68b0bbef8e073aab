// How the tiers name a prompt block (kv/tiers/kv_tiers.h): internal to the
// tiers' sources.
#pragma once

#include <span>
#include <string_view>

#include "kv/tiers/kv_tiers.h"

namespace deepinfer {

// Block `index` of `group` as the tiers name it: its key, and its parent's
// key (later blocks) or the salt (block 0) for the content check.
inline KvBlockIdentity block_identity(BlockHash hash, BlockHash parent, int32_t index, int32_t group,
                                      std::string_view salt, std::span<const int32_t> tokens) {
  return {KvTiers::tier_key(hash, group), index == 0 ? 0 : KvTiers::tier_key(parent, group), index == 0, salt, tokens};
}

inline BlockHash parent_hash(const KvTierQuery& q, int32_t index) {
  return index == 0 ? BlockHash{} : q.hashes[static_cast<size_t>(index - 1)];
}

}  // namespace deepinfer
