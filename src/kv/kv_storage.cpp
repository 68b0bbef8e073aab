#include "kv/kv_storage.h"

#include <vector>

#include "core/error.h"

namespace deepinfer {

size_t KvCacheSpec::bytes_per_page() const {
  const size_t tensors = latent_v_dim > 0 ? 1 : 2;
  return tensors * n_layers * page_size * row_bytes(dtype, int64_t{n_heads_kv} * head_dim);
}

KvStorage::KvStorage(Backend& backend, const KvCacheSpec& spec, int32_t num_pages)
    : spec_(spec), num_pages_(num_pages) {
  DI_CHECK(num_pages > 0, "KV cache needs at least one page, got {}", num_pages);
  DI_CHECK(spec.page_size > 0 && spec.n_layers > 0 && spec.n_heads_kv > 0 && spec.head_dim > 0,
           "invalid KV cache shape");
  DI_CHECK(spec.latent_v_dim >= 0 && spec.latent_v_dim <= spec.head_dim,
           "KV cache: latent value size {} must be in [0, head size {}]", spec.latent_v_dim, spec.head_dim);
  buffer_ = Buffer(backend, spec.bytes_per_page() * (static_cast<size_t>(num_pages) + 1));
  const size_t page_bytes = static_cast<size_t>(spec.page_size) * row_bytes(spec.dtype, int64_t{spec.n_heads_kv} * spec.head_dim);
  std::vector<char> zeros(page_bytes, 0);
  const Tensor zero_page(zeros.data(), spec.dtype, {1, spec.page_size, spec.n_heads_kv, spec.head_dim});
  for (int32_t i = 0; i < spec.n_layers; ++i) {
    const KvCacheLayer l = layer(i);
    backend.copy(l.k.slice_rows(padding_page(), 1), zero_page);
    if (spec.latent_v_dim == 0) backend.copy(l.v.slice_rows(padding_page(), 1), zero_page);
  }
}

KvCacheLayer KvStorage::layer(int32_t index) const {
  DI_CHECK(index >= 0 && index < spec_.n_layers, "KV layer {} out of range", index);
  const size_t tensors = spec_.latent_v_dim > 0 ? 1 : 2;
  const size_t part = buffer_.size() / tensors / spec_.n_layers;  // one layer's K (or V) bytes
  std::initializer_list<int64_t> shape = {num_pages_ + 1, spec_.page_size, spec_.n_heads_kv,
                                          spec_.head_dim};
  KvCacheLayer l;
  l.k = buffer_.view(spec_.dtype, shape, tensors * static_cast<size_t>(index) * part);
  l.v = spec_.latent_v_dim > 0 ? l.k.narrow(3, 0, spec_.latent_v_dim)
                               : buffer_.view(spec_.dtype, shape, (2 * static_cast<size_t>(index) + 1) * part);
  return l;
}

}  // namespace deepinfer
