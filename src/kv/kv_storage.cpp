#include "kv/kv_storage.h"

#include <vector>

#include "core/error.h"

namespace deepinfer {

size_t KvCacheSpec::bytes_per_page() const { return bytes_per_block(n_layers); }

size_t KvCacheSpec::bytes_per_block(int32_t slots) const {
  const size_t tensors = latent_v_dim > 0 ? 1 : 2;
  return tensors * static_cast<size_t>(slots) * page_size * row_bytes(dtype, int64_t{n_heads_kv} * head_dim);
}

KvStorage::KvStorage(Backend& backend, const KvCacheSpec& spec, int32_t num_pages)
    : KvStorage(backend, spec, num_pages, KvLayout::single(spec.n_layers)) {}

KvStorage::KvStorage(Backend& backend, const KvCacheSpec& spec, int32_t num_pages, KvLayout layout)
    : backend_(backend), spec_(spec), layout_(std::move(layout)), num_pages_(num_pages) {
  DI_CHECK(num_pages > 0, "KV cache needs at least one page, got {}", num_pages);
  DI_CHECK(spec.page_size > 0 && spec.n_layers > 0 && spec.n_heads_kv > 0 && spec.head_dim > 0,
           "invalid KV cache shape");
  DI_CHECK(layout_.num_layers() == spec.n_layers && layout_.slots_per_block > 0 &&
               layout_.slots_per_block <= spec.n_layers,
           "KV layout of {} layers ({} slots per block) does not fit a cache of {} layers", layout_.num_layers(),
           layout_.slots_per_block, spec.n_layers);
  DI_CHECK(spec.latent_v_dim >= 0 && spec.latent_v_dim <= spec.head_dim,
           "KV cache: latent value size {} must be in [0, head size {}]", spec.latent_v_dim, spec.head_dim);
  const size_t block_bytes = spec.bytes_per_block(layout_.slots_per_block);
  buffer_ = Buffer(backend, block_bytes * (static_cast<size_t>(num_pages) + 1));
  const size_t page_bytes = static_cast<size_t>(spec.page_size) * row_bytes(spec.dtype, int64_t{spec.n_heads_kv} * spec.head_dim);
  std::vector<char> zeros(page_bytes, 0);
  const Tensor zero_page(zeros.data(), spec.dtype, {1, spec.page_size, spec.n_heads_kv, spec.head_dim});
  for (int32_t slot = 0; slot < layout_.slots_per_block; ++slot) {
    const KvCacheLayer l = slot_view(slot);
    backend.copy(l.k.slice_rows(padding_page(), 1), zero_page);
    if (spec.latent_v_dim == 0) backend.copy(l.v.slice_rows(padding_page(), 1), zero_page);
  }
}

KvCacheLayer KvStorage::layer(int32_t index) const {
  DI_CHECK(index >= 0 && index < spec_.n_layers, "KV layer {} out of range", index);
  return slot_view(layout_.slot_of_layer[static_cast<size_t>(index)]);
}

size_t KvStorage::num_parts() const {
  const size_t tensors = spec_.latent_v_dim > 0 ? 1 : 2;
  return tensors * static_cast<size_t>(layout_.slots_per_block);
}

size_t KvStorage::part_bytes() const { return buffer_.size() / num_parts(); }

size_t KvStorage::page_bytes() const {
  return static_cast<size_t>(spec_.page_size) * row_bytes(spec_.dtype, int64_t{spec_.n_heads_kv} * spec_.head_dim);
}

// The buffer is num_parts() parts (each slot's K, then its V) of
// num_pages + 1 pages: a block's pages are one page apart from part to part.
void KvStorage::save_block(int32_t block, void* host) const {
  DI_CHECK(block >= 0 && block < num_pages_, "KV storage: block {} out of range", block);
  const auto* base = static_cast<const char*>(buffer_.data()) + static_cast<size_t>(block) * page_bytes();
  backend_.copy_rows_async(host, page_bytes(), base, part_bytes(), page_bytes(), num_parts());
}

void KvStorage::save_block(int32_t block, void* host, CopyStream& stream) const {
  DI_CHECK(block >= 0 && block < num_pages_, "KV storage: block {} out of range", block);
  const auto* base = static_cast<const char*>(buffer_.data()) + static_cast<size_t>(block) * page_bytes();
  stream.copy_rows(host, page_bytes(), base, part_bytes(), page_bytes(), num_parts());
}

void KvStorage::load_block(int32_t block, const void* host) {
  DI_CHECK(block >= 0 && block < num_pages_, "KV storage: block {} out of range", block);
  auto* base = static_cast<char*>(buffer_.data()) + static_cast<size_t>(block) * page_bytes();
  backend_.copy_rows_async(base, part_bytes(), host, page_bytes(), page_bytes(), num_parts());
}

void KvStorage::load_blocks(std::span<const std::pair<int32_t, const void*>> blocks) {
  std::vector<Backend::BlockCopy> copies;
  copies.reserve(blocks.size());
  for (const auto& [block, src] : blocks) {
    DI_CHECK(block >= 0 && block < num_pages_, "KV storage: block {} out of range", block);
    copies.push_back({static_cast<char*>(buffer_.data()) + static_cast<size_t>(block) * page_bytes(), src});
  }
  backend_.copy_blocks_async(copies, part_bytes(), page_bytes(), page_bytes(), num_parts());
}

KvCacheLayer KvStorage::slot_view(int32_t index) const {
  const size_t tensors = spec_.latent_v_dim > 0 ? 1 : 2;
  // One slot's K (or V) bytes.
  const size_t part = part_bytes();
  std::initializer_list<int64_t> shape = {num_pages_ + 1, spec_.page_size, spec_.n_heads_kv,
                                          spec_.head_dim};
  KvCacheLayer l;
  l.k = buffer_.view(spec_.dtype, shape, tensors * static_cast<size_t>(index) * part);
  l.v = spec_.latent_v_dim > 0 ? l.k.narrow(3, 0, spec_.latent_v_dim)
                               : buffer_.view(spec_.dtype, shape, (2 * static_cast<size_t>(index) + 1) * part);
  return l;
}

}  // namespace deepinfer
