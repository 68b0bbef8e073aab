// Rotary embedding, KV-cache writes and paged attention on the CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec.h"
#include "backend/cpu/vec_kernels.h"
#include "core/error.h"
#include "core/fp8.h"

namespace deepinfer::cpu {

namespace {

template <typename T = float>
T* at(const Tensor& t, int64_t i0, int64_t i1) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data()) + i0 * t.stride_bytes(0) + i1 * t.stride_bytes(1));
}

template <typename T = float>
T* at(const Tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data()) + i0 * t.stride_bytes(0) +
                              i1 * t.stride_bytes(1) + i2 * t.stride_bytes(2));
}

void rotate_heads(const Tensor& x, int64_t token, const float* cos, const float* sin, int half,
                  RopeStyle style) {
  int64_t heads = x.size(1);
  for (int64_t h = 0; h < heads; ++h) {
    float* v = at(x, token, h);
    if (style == RopeStyle::Interleaved) {
      for (int i = 0; i < half; ++i) {
        float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * cos[i] - x1 * sin[i];
        v[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cos[i] - x1 * sin[i];
        v[i + half] = x0 * sin[i] + x1 * cos[i];
      }
    }
  }
}

// The CPU cache holds f32, f16 (the default: attention reads it directly,
// converting in registers), or FP8 e4m3 that attention decodes row by row.
// store_kv rounds to the cache's type, and decoding is exact, so an f32 cache
// holding the same rounded values gives bit-identical attention.
void check_cpu_cache(const KvCacheLayer& cache) {
  const DType t = cache.k.dtype();
  DI_CHECK((t == DType::F32 || t == DType::F16 || t == DType::F8E4M3) && cache.v.dtype() == t,
           "CPU backend: KV cache must be f32, f16 or f8_e4m3, got {}", cache.k.describe());
}

// Row `head` of slot (page, offset) as f32: the cache itself, or `scratch` holding the decoded row.
const float* cache_row(const Tensor& c, int64_t page, int64_t offset, int64_t head, int64_t dim, float* scratch) {
  if (c.dtype() == DType::F32) return at(c, page, offset, head);
  if (c.dtype() == DType::F16) {
    vec::f16_to_f32_row(at<const uint16_t>(c, page, offset, head), scratch, dim);
    return scratch;
  }
  const auto* bytes = at<const uint8_t>(c, page, offset, head);
  const auto& table = f8e4m3_table();
  for (int64_t d = 0; d < dim; ++d) scratch[d] = table[bytes[d]];
  return scratch;
}

// One sequence's slice of the attention metadata, validated.
struct SeqLayout {
  int64_t q_begin = 0;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  const int32_t* pages = nullptr;
};

}  // namespace

void CpuBackend::rope(Tensor q, Tensor k, const Tensor& positions, const RopeParams& params) {
  const int32_t* pos = positions.data_as<int32_t>();
  const float* inv_freq = params.inv_freq.data_as<float>();
  int half = params.rotary_dim / 2;
  int64_t n = q.size(0);
  int64_t work_per_token = (q.size(1) + (k.defined() ? k.size(1) : 0)) * params.rotary_dim;
  pool_.parallel_for(n, [&](int64_t begin, int64_t end, int thread) {
    float* cos = thread_scratch_[static_cast<size_t>(thread)].get<float>(2 * static_cast<size_t>(half) * sizeof(float));
    float* sin = cos + half;
    for (int64_t t = begin; t < end; ++t) {
      // The angle is formed in f32 like the Hugging Face reference; cos/sin in double
      // so that large positions lose no more precision than the angle itself.
      for (int i = 0; i < half; ++i) {
        float angle = static_cast<float>(pos[t]) * inv_freq[i];
        cos[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * params.attention_factor;
        sin[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * params.attention_factor;
      }
      rotate_heads(q, t, cos, sin, half, params.style);
      if (k.defined()) rotate_heads(k, t, cos, sin, half, params.style);
    }
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(work_per_token, 1)));
}

void CpuBackend::store_kv(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                          KvCacheLayer cache) {
  check_cpu_cache(cache);
  const int32_t* slots = slot_mapping.data_as<int32_t>();
  int64_t n = k.size(0), heads = k.size(1), head_dim = k.size(2);
  int64_t page_size = cache.page_size();
  int64_t capacity = cache.k.size(0) * page_size;
  for (int64_t i = 0; i < n; ++i) {
    DI_CHECK(slots[i] < capacity, "store_kv: slot {} out of range for a cache of {} slots", slots[i], capacity);
  }
  const int64_t v_dim = v.size(2);
  const DType t = cache.k.dtype();
  auto put = [t](const Tensor& c, int64_t page, int64_t offset, int64_t h, const float* src, int64_t dim) {
    if (t == DType::F32) {
      std::memcpy(at(c, page, offset, h), src, static_cast<size_t>(dim) * sizeof(float));
    } else if (t == DType::F16) {
      vec::f32_to_f16_row(src, at<uint16_t>(c, page, offset, h), dim);
    } else {
      auto* dst = at<uint8_t>(c, page, offset, h);
      for (int64_t d = 0; d < dim; ++d) dst[d] = f32_to_f8e4m3(src[d]);
    }
  };
  // A latent cache's V is a view of K: writing K stores both.
  const bool v_in_k = cache.v.data() == cache.k.data();
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;  // padding token: nothing to store
    int64_t page = slots[i] / page_size, offset = slots[i] % page_size;
    for (int64_t h = 0; h < heads; ++h) {
      put(cache.k, page, offset, h, at(k, i, h), head_dim);
      if (!v_in_k) put(cache.v, page, offset, h, at(v, i, h), v_dim);
    }
  }
}

void CpuBackend::attention(const Tensor& q, const KvCacheLayer& cache, const AttentionMetadata& meta,
                           const AttentionParams& params, Tensor out) {
  check_cpu_cache(cache);
  int64_t n = q.size(0), heads_q = q.size(1), head_dim = q.size(2), v_dim = cache.v.size(3);
  int64_t heads_kv = cache.k.size(2), group = heads_q / heads_kv;
  int64_t page_size = cache.page_size(), num_pages = cache.k.size(0);
  int num_seqs = meta.num_seqs;
  const int32_t* q_indptr = meta.q_indptr.data_as<int32_t>();
  const int32_t* kv_indptr = meta.kv_indptr.data_as<int32_t>();
  const int32_t* page_ids = meta.kv_page_indices.data_as<int32_t>();
  const int32_t* last_len = meta.kv_last_page_len.data_as<int32_t>();
  int64_t listed_pages = meta.kv_page_indices.size(0);

  // The metadata comes from the scheduler; check it before any pointer arithmetic.
  DI_CHECK(q_indptr[0] == 0 && q_indptr[num_seqs] == n,
           "attention: q_indptr must run from 0 to the {} query rows, got {}..{}", n, q_indptr[0],
           q_indptr[num_seqs]);
  DI_CHECK(kv_indptr[0] == 0 && kv_indptr[num_seqs] <= listed_pages,
           "attention: kv_indptr must run from 0 to at most {} pages, got {}..{}", listed_pages,
           kv_indptr[0], kv_indptr[num_seqs]);
  for (int s = 0; s < num_seqs; ++s) {
    int64_t q_len = q_indptr[s + 1] - q_indptr[s];
    int64_t n_pages = kv_indptr[s + 1] - kv_indptr[s];
    DI_CHECK(q_len >= 0 && n_pages >= 0, "attention: indptr of sequence {} decreases", s);
    if (q_len == 0) continue;
    DI_CHECK(n_pages > 0 && last_len[s] >= 1 && last_len[s] <= page_size,
             "attention: sequence {} has {} pages and last page length {} (page size {})", s, n_pages,
             last_len[s], page_size);
    int64_t kv_len = (n_pages - 1) * page_size + last_len[s];
    DI_CHECK(kv_len >= q_len, "attention: sequence {} has {} queries but only {} cached keys", s, q_len,
             kv_len);
    for (int64_t p = kv_indptr[s]; p < kv_indptr[s + 1]; ++p) {
      DI_CHECK(page_ids[p] >= 0 && page_ids[p] < num_pages, "attention: page {} out of range [0, {})",
               page_ids[p], num_pages);
    }
  }

  const float* sinks = params.sinks.defined() ? params.sinks.data_as<float>() : nullptr;
  const VecKernels& vk = *vec_;
  float softcap = params.logit_softcap;
  int64_t window = params.sliding_window;
  // Items are (query row, KV head, a run of that KV head's query heads): the
  // heads of a GQA group walk the pages together, so each K/V page is read
  // from memory once and then from L1 for the other heads. The group is split
  // (one head per item) only when there would be fewer groups than threads;
  // uneven shares are still faster than ungrouped heads (SmolLM2, 2 threads,
  // 3 KV heads, 1k context: decode 80 -> 85 tok/s, same-run medians).
  const int64_t heads_per_item = n * heads_kv >= pool_.num_threads() ? group : 1;
  const int64_t runs_per_kv = group / heads_per_item;
  // Per head of an item: acc, scores, max and sum; then a decoded K and V row
  // when the cache is FP8.
  const int64_t state = v_dim + page_size + 2;
  size_t scratch_bytes = static_cast<size_t>(heads_per_item * state + head_dim + v_dim) * sizeof(float);

  // kv_start_pos shifts query and key positions alike, so the causal and window
  // masks depend only on indices within the listed pages and it is not needed here.
  int64_t items = n * heads_kv * runs_per_kv;
  int64_t chunk = std::max<int64_t>(1, items / (pool_.num_threads() * 8));
  pool_.parallel_for(items, [&](int64_t begin, int64_t end, int thread) {
    float* scratch = thread_scratch_[static_cast<size_t>(thread)].get<float>(scratch_bytes);
    float* k_row = scratch + heads_per_item * state;
    float* v_row = k_row + head_dim;
    int s = 0;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / (heads_kv * runs_per_kv), r = item % (heads_kv * runs_per_kv);
      const int64_t kvh = r / runs_per_kv, h0 = kvh * group + (r % runs_per_kv) * heads_per_item;
      if (t >= q_indptr[s + 1] || t < q_indptr[s]) {
        s = static_cast<int>(std::upper_bound(q_indptr, q_indptr + num_seqs + 1, static_cast<int32_t>(t)) -
                             q_indptr) - 1;
      }
      int64_t q_len = q_indptr[s + 1] - q_indptr[s];
      int64_t n_pages = kv_indptr[s + 1] - kv_indptr[s];
      int64_t kv_len = (n_pages - 1) * page_size + last_len[s];
      const int32_t* pages = page_ids + kv_indptr[s];
      int64_t last = kv_len - q_len + (t - q_indptr[s]);  // the query's own key index
      int64_t first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;

      for (int64_t j = 0; j < heads_per_item; ++j) {
        float* st = scratch + j * state;
        std::fill(st, st + v_dim, 0.0f);
        st[v_dim + page_size] = sinks ? sinks[h0 + j] : -std::numeric_limits<float>::infinity();
        st[v_dim + page_size + 1] = sinks ? 1.0f : 0.0f;
      }
      for (int64_t p = first / page_size; p <= last / page_size; ++p) {
        int64_t lo = std::max(first - p * page_size, int64_t{0});
        int64_t hi = std::min(last - p * page_size, page_size - 1);
        for (int64_t j = 0; j < heads_per_item; ++j) {
          const float* qv = at(q, t, h0 + j);
          float* acc = scratch + j * state;
          float* scores = acc + v_dim;
          float& max = scores[page_size];
          float& sum = scores[page_size + 1];
          float block_max = -std::numeric_limits<float>::infinity();
          if (cache.k.dtype() == DType::F32) {
            // The page's keys sit at a fixed stride: their logits in one pass.
            vk.dot_strided_f32(qv, at(cache.k, pages[p], lo, kvh), cache.k.stride_bytes(1) / 4, hi - lo + 1,
                               head_dim, scores + lo);
          } else if (cache.k.dtype() == DType::F16) {
            vk.dot_strided_f16(qv, at<const uint16_t>(cache.k, pages[p], lo, kvh), cache.k.stride_bytes(1) / 2,
                               hi - lo + 1, head_dim, scores + lo);
          } else {
            for (int64_t o = lo; o <= hi; ++o) {
              scores[o] = vec::dot(qv, cache_row(cache.k, pages[p], o, kvh, head_dim, k_row), head_dim);
            }
          }
          for (int64_t o = lo; o <= hi; ++o) {
            float logit = scores[o] * params.scale;
            if (softcap > 0.0f) logit = softcap * std::tanh(logit / softcap);
            scores[o] = logit;
            block_max = std::max(block_max, logit);
          }
          if (block_max > max) {
            float rescale = std::exp(max - block_max);
            vec::scale(acc, rescale, v_dim);
            sum *= rescale;
            max = block_max;
          }
          sum += vk.exp_shifted_sum(scores + lo, max, hi - lo + 1);
          if (cache.v.dtype() == DType::F32) {
            vk.accumulate_strided_f32(acc, scores + lo, at(cache.v, pages[p], lo, kvh),
                                      cache.v.stride_bytes(1) / 4, hi - lo + 1, v_dim);
          } else if (cache.v.dtype() == DType::F16) {
            vk.accumulate_strided_f16(acc, scores + lo, at<const uint16_t>(cache.v, pages[p], lo, kvh),
                                      cache.v.stride_bytes(1) / 2, hi - lo + 1, v_dim);
          } else {
            for (int64_t o = lo; o <= hi; ++o) {
              vec::axpy(acc, scores[o], cache_row(cache.v, pages[p], o, kvh, v_dim, v_row), v_dim);
            }
          }
        }
      }
      for (int64_t j = 0; j < heads_per_item; ++j) {
        const float* acc = scratch + j * state;
        float* ov = at(out, t, h0 + j);
        float inv = 1.0f / acc[v_dim + page_size + 1];
        for (int64_t d = 0; d < v_dim; ++d) ov[d] = acc[d] * inv;
      }
    }
  }, 1, chunk);
}

}  // namespace deepinfer::cpu
