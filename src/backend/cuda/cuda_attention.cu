// Paged attention on the GPU for prefill and decode in one kernel family.
//
// A block takes one (sequence, head tile, query tile, KV split): its rows are
// the q_tile query tokens times head_tile of the `group` query heads that
// share a KV head, so each K/V tile read from the cache serves them all (GQA;
// MLA's one latent KV head shared by up to 128 query heads is cut into head
// tiles so that the rows fit in shared memory). V's head size may be smaller
// than K's; an MLA latent cache's V is the first channels of K's own rows, so
// the V tile is then the K tile itself and the cache is read once. K/V tiles of
// kBlockN keys are converted to f32 in shared memory; each warp owns some rows
// and runs the online softmax over a tile with one key per lane (QK) and one
// head dimension slice per lane (PV). All arithmetic is f32.
//
// Split-KV: when there are too few (sequence, head, tile) blocks to fill the
// GPU (decode at small batch with long contexts), the key range is cut into
// num_splits chunks whose partial (acc, max, sum) go to a workspace and a
// second kernel merges them. The host picks the partition (q_tile, q_blocks,
// num_splits) from the step's hints; the kernels read the CSR metadata on the
// device, check it and report layout errors through the error word.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/cuda_attention_segments.cuh"
#include "backend/cuda/cuda_attention_seq.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kBlockN = 32;
// Most key splits a launch may have (the combine kernel keeps one scale per split).
constexpr int kMaxSplits = 64;
// Most key segments a batch-invariant launch writes partials of (its combine
// keeps no per-segment state; the workspace bounds them too).
constexpr int kMaxSegments = 1024;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct SmemLayout {
  int rows, ldk, ldv;
  size_t q, acc, m, l, k, v, p, total;
};

// V is a view of K's first channels (MLA latent cache): same pages and strides.
__host__ __device__ inline bool v_in_k(const AttentionLaunch& a) {
  return a.v.base == a.k.base && a.v.pages == a.k.pages && a.v.page_size == a.k.page_size &&
         a.v.stride0 == a.k.stride0 && a.v.stride1 == a.k.stride1 && a.v.stride2 == a.k.stride2 &&
         a.v.dim <= a.k.dim;
}

// kBlocked (prefill): each warp takes its rows four at a time, so one read of
// a key or value from shared memory serves four query rows; rows are padded to
// a multiple of 16 and K/V rows to 16 bytes for float4 reads.
constexpr int kRowBlock = 4;

// q rows hold dk floats, acc rows dv; with v_shared the V tile is the K tile.
__host__ __device__ inline SmemLayout smem_layout(int rows, int dk, int dv, bool v_shared, bool blocked) {
  SmemLayout s{};
  if (blocked) rows = (rows + kWarps * kRowBlock - 1) / (kWarps * kRowBlock) * (kWarps * kRowBlock);
  s.rows = rows;
  // Padding so lane-per-key reads hit distinct banks (one float; four for float4 reads).
  const int pad = blocked ? 4 : 1;
  s.ldk = dk + pad;
  s.ldv = v_shared ? s.ldk : dv + pad;
  s.q = 0;
  s.acc = s.q + size_t(rows) * dk;
  s.m = s.acc + size_t(rows) * dv;
  s.l = s.m + rows;
  s.k = s.l + rows;
  s.v = v_shared ? s.k : s.k + size_t(kBlockN) * s.ldk;
  s.p = s.v + size_t(kBlockN) * (v_shared ? s.ldk : s.ldv);
  s.total = (s.p + kWarps * kBlockN * (blocked ? kRowBlock : 1)) * sizeof(float);
  return s;
}

// Loads key tile [kt, kt + kBlockN) of one KV head into shared memory as f32.
// The vector path issues kLoadBatch 16-byte loads per thread before it
// converts any: one at a time, each a dependent round trip (page id, then
// data), a 576-wide MLA tile took ~10 us per block.
constexpr int kLoadBatch = 8;

template <typename T, bool kVec>
__device__ void load_tile(const CacheView& c, const int32_t* pages, int n_pages, int group_head, int kt, int k_end,
                          float* dst, int ldk, uint32_t* err) {
  const int dim = static_cast<int>(c.dim);
  if (kVec) {
    constexpr int kElems = 16 / sizeof(T);
    const int per_row = dim / kElems;
    const int total = kBlockN * per_row;
    for (int base = threadIdx.x; base < total; base += kThreads * kLoadBatch) {
      uint4 raw[kLoadBatch];
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int idx = base + u * kThreads;
        raw[u] = make_uint4(0, 0, 0, 0);
        if (idx >= total) continue;
        const int key = idx / per_row, part = idx % per_row;
        const int j = kt + key;
        const int pi = j / static_cast<int>(c.page_size);
        const int page = (j < k_end && pi < n_pages) ? pages[pi] : -1;
        if (page < 0 || page >= c.pages) {
          if (j < k_end) atomicOr(err, kErrAttentionPage);
          continue;  // zeros
        }
        const char* src = c.base + page * c.stride0 + (j % c.page_size) * c.stride1 + group_head * c.stride2;
        raw[u] = reinterpret_cast<const uint4*>(src)[part];
      }
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int idx = base + u * kThreads;
        if (idx >= total) continue;
        float* out = dst + (idx / per_row) * ldk + (idx % per_row) * kElems;
        const T* vals = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int e = 0; e < kElems; ++e) out[e] = to_f(vals[e]);
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < kBlockN * dim; idx += kThreads) {
      int key = idx / dim, d = idx % dim;
      int j = kt + key;
      int pi = j / static_cast<int>(c.page_size);
      int page = (j < k_end && pi < n_pages) ? pages[pi] : -1;
      if (page < 0 || page >= c.pages) {
        if (j < k_end) atomicOr(err, kErrAttentionPage);
        dst[key * ldk + d] = 0.0f;
        continue;
      }
      const char* src = c.base + page * c.stride0 + (j % c.page_size) * c.stride1 + group_head * c.stride2;
      dst[key * ldk + d] = to_f(reinterpret_cast<const T*>(src)[d]);
    }
  }
}

// T: q/out elements; C: cache elements (T, or FP8 e4m3 widened in load_tile).
template <typename T, typename C, bool kVec, bool kBlocked>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionLaunch a) {
  wait_for_prior_kernel();
  release_next_kernel();
  extern __shared__ float smem[];
  const int dk = static_cast<int>(a.q.dim), dv = static_cast<int>(a.v.dim);
  const int ht = a.head_tile;
  const bool v_shared = v_in_k(a);
  const SmemLayout L = smem_layout(a.q_tile * ht, dk, dv, v_shared, kBlocked);
  float* q_s = smem + L.q;
  float* acc_s = smem + L.acc;
  float* m_s = smem + L.m;
  float* l_s = smem + L.l;
  float* k_s = smem + L.k;
  float* v_s = smem + L.v;
  float* p_s = smem + L.p;

  // blockIdx.y is the head tile: query heads h0 .. h0 + ht - 1, all in KV head kvh.
  const int qb = blockIdx.x, h0 = blockIdx.y * ht, kvh = h0 / a.group;
  const int s = blockIdx.z / a.num_splits, split = blockIdx.z % a.num_splits;
  SeqExtent seq;
  if (!read_seq_extent(a, s, qb == 0 && blockIdx.y == 0 && split == 0, 1, int64_t{a.q_tile} * a.q_blocks, seq)) return;
  const int q_begin = seq.q_begin, q_len = seq.q_len, kv_p0 = seq.kv_p0, n_pages = seq.n_pages, kv_len = seq.kv_len;
  const int t0 = qb * a.q_tile;
  if (t0 >= q_len) return;
  const int t_count = min(a.q_tile, q_len - t0);
  const int valid_rows = t_count * ht;

  const int last_lo = kv_len - q_len + t0;
  const int last_hi = last_lo + t_count - 1;
  int k_begin = a.window > 0 ? max(0, last_lo - a.window + 1) : 0;
  int k_end = last_hi + 1;
  if (a.num_splits > 1) {
    int chunk = ((kv_len + a.num_splits - 1) / a.num_splits + kBlockN - 1) / kBlockN * kBlockN;
    k_begin = max(k_begin, split * chunk);
    k_end = min(k_end, (split + 1) * chunk);
  }

  // Q rows, scaled. 16-byte loads, all of a thread's in flight before any is
  // used, when the rows allow (one dependent round trip per element made
  // the 4 x 576 rows of an MLA decode block take microseconds).
  constexpr int kQElems = 16 / sizeof(T);
  const bool q_vec = dk % kQElems == 0 &&
                     (reinterpret_cast<uintptr_t>(a.q.base) | static_cast<uintptr_t>(a.q.stride0) |
                      static_cast<uintptr_t>(a.q.stride1)) % 16 == 0;
  if (q_vec) {
    const int per_row = dk / kQElems, total = L.rows * per_row;
    for (int base = threadIdx.x; base < total; base += kThreads * kLoadBatch) {
      uint4 raw[kLoadBatch];
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int idx = base + u * kThreads, r = idx / per_row;
        raw[u] = make_uint4(0, 0, 0, 0);
        if (idx < total && r < valid_rows) {
          const int t = q_begin + t0 + r / ht, h = h0 + r % ht;
          raw[u] = reinterpret_cast<const uint4*>(a.q.base + t * a.q.stride0 + h * a.q.stride1)[idx % per_row];
        }
      }
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int idx = base + u * kThreads;
        if (idx >= total) continue;
        const T* vals = reinterpret_cast<const T*>(&raw[u]);
        float* dst = q_s + (idx / per_row) * dk + (idx % per_row) * kQElems;
#pragma unroll
        for (int e = 0; e < kQElems; ++e) dst[e] = to_f(vals[e]) * a.scale;
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < L.rows * dk; idx += kThreads) {
      int r = idx / dk, d = idx % dk;
      float val = 0.0f;
      if (r < valid_rows) {
        int t = q_begin + t0 + r / ht, h = h0 + r % ht;
        val = to_f(reinterpret_cast<const T*>(a.q.base + t * a.q.stride0 + h * a.q.stride1)[d]) * a.scale;
      }
      q_s[idx] = val;
    }
  }
  for (int idx = threadIdx.x; idx < L.rows * dv; idx += kThreads) acc_s[idx] = 0.0f;
  for (int r = threadIdx.x; r < L.rows; r += kThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* pages = a.page_ids + kv_p0;
  for (int kt = k_begin; kt < k_end; kt += kBlockN) {
    load_tile<C, kVec>(a.k, pages, n_pages, kvh, kt, k_end, k_s, L.ldk, a.err);
    if (!v_shared) load_tile<C, kVec>(a.v, pages, n_pages, kvh, kt, k_end, v_s, L.ldv, a.err);
    __syncthreads();
    if constexpr (kBlocked) {
      for (int r0 = warp * kRowBlock; r0 < valid_rows; r0 += kWarps * kRowBlock) {
        const int j = kt + lane;
        float sc[kRowBlock];
        bool valid[kRowBlock];
#pragma unroll
        for (int i = 0; i < kRowBlock; ++i) {
          const int last = kv_len - q_len + t0 + (r0 + i) / ht;
          const int first = a.window > 0 ? max(0, last - a.window + 1) : 0;
          valid[i] = r0 + i < valid_rows && j >= first && j <= last && j < k_end;
          sc[i] = 0.0f;
        }
        const float* kr = k_s + lane * L.ldk;
        for (int d = 0; d < dk; d += 4) {
          const float4 k4 = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
          for (int i = 0; i < kRowBlock; ++i) {
            const float4 q4 = *reinterpret_cast<const float4*>(q_s + (r0 + i) * dk + d);
            sc[i] = fmaf(q4.x, k4.x, fmaf(q4.y, k4.y, fmaf(q4.z, k4.z, fmaf(q4.w, k4.w, sc[i]))));
          }
        }
        float alpha[kRowBlock], m_new[kRowBlock], psum[kRowBlock], p[kRowBlock];
#pragma unroll
        for (int i = 0; i < kRowBlock; ++i) {
          float score = -INFINITY;
          if (valid[i]) score = a.softcap > 0.0f ? a.softcap * tanhf(sc[i] / a.softcap) : sc[i];
          const float m_old = m_s[r0 + i];
          m_new[i] = fmaxf(m_old, warp_max(score));
          const bool any = m_new[i] != -INFINITY;
          p[i] = valid[i] ? expf(score - m_new[i]) : 0.0f;
          alpha[i] = any ? expf(m_old - m_new[i]) : 1.0f;
          psum[i] = warp_sum(p[i]);
        }
        *reinterpret_cast<float4*>(p_s + (warp * kBlockN + lane) * kRowBlock) = make_float4(p[0], p[1], p[2], p[3]);
        __syncwarp();
        for (int d = lane; d < dv; d += 32) {
          float o[kRowBlock];
#pragma unroll
          for (int i = 0; i < kRowBlock; ++i) o[i] = acc_s[(r0 + i) * dv + d] * alpha[i];
#pragma unroll 8
          for (int jj = 0; jj < kBlockN; ++jj) {
            const float v = v_s[jj * L.ldv + d];
            const float4 p4 = *reinterpret_cast<const float4*>(p_s + (warp * kBlockN + jj) * kRowBlock);
            o[0] = fmaf(p4.x, v, o[0]);
            o[1] = fmaf(p4.y, v, o[1]);
            o[2] = fmaf(p4.z, v, o[2]);
            o[3] = fmaf(p4.w, v, o[3]);
          }
#pragma unroll
          for (int i = 0; i < kRowBlock; ++i) acc_s[(r0 + i) * dv + d] = o[i];
        }
        __syncwarp();
        if (lane < kRowBlock) {
          // Lane i owns row r0 + i's running max and sum (values are warp-uniform).
          float mn = m_new[0], al = alpha[0], ps = psum[0];
#pragma unroll
          for (int i = 1; i < kRowBlock; ++i) {
            if (lane == i) {
              mn = m_new[i];
              al = alpha[i];
              ps = psum[i];
            }
          }
          if (mn != -INFINITY) {
            m_s[r0 + lane] = mn;
            l_s[r0 + lane] = l_s[r0 + lane] * al + ps;
          }
        }
        __syncwarp();
      }
    } else {
      for (int r = warp; r < valid_rows; r += kWarps) {
        const int last = kv_len - q_len + t0 + r / ht;
        const int first = a.window > 0 ? max(0, last - a.window + 1) : 0;
        const int j = kt + lane;
        const bool valid = j >= first && j <= last && j < k_end;
        float score = -INFINITY;
        if (valid) {
          const float* qr = q_s + r * dk;
          const float* kr = k_s + lane * L.ldk;
          // Four partial sums: one chain of dk dependent FMAs (576 for MLA)
          // was the longest latency of a decode tile.
          float dot4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          int d = 0;
          for (; d + 4 <= dk; d += 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) dot4[i] = fmaf(qr[d + i], kr[d + i], dot4[i]);
          }
          for (; d < dk; ++d) dot4[0] = fmaf(qr[d], kr[d], dot4[0]);
          float dot = (dot4[0] + dot4[1]) + (dot4[2] + dot4[3]);
          if (a.softcap > 0.0f) dot = a.softcap * tanhf(dot / a.softcap);
          score = dot;
        }
        const float tile_max = warp_max(score);
        if (tile_max == -INFINITY) continue;  // warp-uniform
        const float m_old = m_s[r];
        const float m_new = fmaxf(m_old, tile_max);
        const float p = valid ? expf(score - m_new) : 0.0f;
        const float alpha = expf(m_old - m_new);
        const float psum = warp_sum(p);
        p_s[warp * kBlockN + lane] = p;
        __syncwarp();
        float* ar = acc_s + r * dv;
        // Four head dimensions per lane at a time: independent chains, each
        // summed over the keys in order as one dimension at a time would be.
        for (int d0 = lane; d0 < dv; d0 += 4 * 32) {
          float o[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) o[i] = d0 + 32 * i < dv ? ar[d0 + 32 * i] * alpha : 0.0f;
#pragma unroll 8
          for (int jj = 0; jj < kBlockN; ++jj) {
            const float pj = p_s[warp * kBlockN + jj];
            const float* vr = v_s + jj * L.ldv + d0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              if (d0 + 32 * i < dv) o[i] = fmaf(pj, vr[32 * i], o[i]);
            }
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (d0 + 32 * i < dv) ar[d0 + 32 * i] = o[i];
          }
        }
        __syncwarp();
        if (lane == 0) {
          m_s[r] = m_new;
          l_s[r] = l_s[r] * alpha + psum;
        }
        __syncwarp();
      }
    }
    __syncthreads();
  }

  const int heads_q = static_cast<int>(a.q.heads);
  for (int idx = threadIdx.x; idx < valid_rows * dv; idx += kThreads) {
    int r = idx / dv, d = idx % dv;
    int t = q_begin + t0 + r / ht, h = h0 + r % ht;
    float m = m_s[r], l = l_s[r], o = acc_s[idx];
    if (a.num_splits == 1) {
      if (a.sinks) {
        float sink = a.sinks[h];
        float mm = fmaxf(m, sink);
        float scale_old = expf(m - mm);
        l = l * scale_old + expf(sink - mm);
        o *= scale_old;
      }
      T* out = reinterpret_cast<T*>(a.out.base + t * a.out.stride0 + h * a.out.stride1);
      out[d] = from_f<T>(l > 0.0f ? o / l : 0.0f);
    } else {
      float* part = a.partial + ((int64_t(split) * a.q.n + t) * heads_q + h) * (dv + 2);
      part[d] = o;
      if (d == 0) {
        part[dv] = m;
        part[dv + 1] = l;
      }
    }
  }
}

// Split-KV merge, one block per (token, head). The splits' maxima and scale
// factors are read once, in parallel, into shared memory; the output loop
// then loads four splits' partials before summing them in split order. (It
// read every split's max again for every output element, a serial chain of
// L2 round trips: 8 us per MLA decode layer with 16 splits.) Sums keep the
// split order, so the results are those of one split at a time.
template <typename T>
__global__ void combine_kernel(AttentionLaunch a) {
  wait_for_prior_kernel();
  release_next_kernel();
  __shared__ float scale[kMaxSplits];  // expf(m_split - M)
  __shared__ float sum_part[kMaxSplits];  // l_split
  __shared__ float shared_m, shared_denom;
  const int heads_q = static_cast<int>(a.q.heads), dim = static_cast<int>(a.v.dim);
  const int64_t t = blockIdx.x / heads_q;
  const int h = blockIdx.x % heads_q;
  const int splits = a.num_splits;
  const int64_t split_stride = a.q.n * heads_q * int64_t(dim + 2);
  const float* part = a.partial + (t * heads_q + h) * (dim + 2);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float m[kMaxSplits / 32], l[kMaxSplits / 32];
    float M = a.sinks ? a.sinks[h] : -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int sp = lane + 32 * i;
      m[i] = sp < splits ? part[sp * split_stride + dim] : -INFINITY;
      l[i] = sp < splits ? part[sp * split_stride + dim + 1] : 0.0f;
      M = fmaxf(M, m[i]);
    }
    M = warp_max(M);
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int sp = lane + 32 * i;
      if (sp < splits) {
        scale[sp] = expf(m[i] - M);
        sum_part[sp] = l[i];
      }
    }
    __syncwarp();
    if (lane == 0) {
      float denom = a.sinks && M != -INFINITY ? expf(a.sinks[h] - M) : 0.0f;
      for (int sp = 0; sp < splits; ++sp) denom += sum_part[sp] * scale[sp];
      shared_m = M;
      shared_denom = denom;
    }
  }
  __syncthreads();
  T* out = reinterpret_cast<T*>(a.out.base + t * a.out.stride0 + h * a.out.stride1);
  if (shared_m == -INFINITY) {
    for (int d = threadIdx.x; d < dim; d += blockDim.x) out[d] = from_f<T>(0.0f);
    return;
  }
  const float denom = shared_denom;
  // Each thread's output dims (up to kCombineDims, MLA's 512 at 128 threads)
  // accumulate together, so the loads of four splits for all of them are in
  // flight at once: one dim at a time made a 512-wide head a chain of L2
  // round trips (5.5 us per DeepSeek decode layer, H200 run 46).
  constexpr int kCombineDims = 4;
  for (int d0 = threadIdx.x; d0 < dim; d0 += kCombineDims * blockDim.x) {
    float o[kCombineDims] = {};
    int sp = 0;
    for (; sp + 4 <= splits; sp += 4) {
      float v[4][kCombineDims];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < kCombineDims; ++j) {
          const int d = d0 + j * blockDim.x;
          v[i][j] = d < dim ? part[(sp + i) * split_stride + d] : 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < kCombineDims; ++j) o[j] += v[i][j] * scale[sp + i];
      }
    }
    for (; sp < splits; ++sp) {
#pragma unroll
      for (int j = 0; j < kCombineDims; ++j) {
        const int d = d0 + j * blockDim.x;
        if (d < dim) o[j] += part[sp * split_stride + d] * scale[sp];
      }
    }
#pragma unroll
    for (int j = 0; j < kCombineDims; ++j) {
      const int d = d0 + j * blockDim.x;
      if (d < dim) out[d] = from_f<T>(denom > 0.0f ? o[j] / denom : 0.0f);
    }
  }
}

// The batch-invariant merge of segment partials (a.segment_partials), one
// block per (token, head): each thread folds its two dims' partials in
// segment order with the tensor-core kernel's own fold, so a row gets the
// bits the kernel's in-register fold gives it.
template <typename T>
__global__ void combine_segments_kernel(AttentionLaunch a) {
  wait_for_prior_kernel();
  release_next_kernel();
  constexpr float kLog2e = 1.4426950408889634f;
  const int heads_q = static_cast<int>(a.q.heads), dim = static_cast<int>(a.v.dim);
  const int64_t t = blockIdx.x / heads_q;
  const int h = blockIdx.x % heads_q;
  const int64_t split_stride = a.q.n * heads_q * int64_t(dim + 2);
  const float* part = a.partial + (t * heads_q + h) * (dim + 2);
  const float sink = a.sinks ? a.sinks[h] * kLog2e : -INFINITY;
  char* out = a.out.base + t * a.out.stride0 + h * a.out.stride1;
  for (int d = 2 * static_cast<int>(threadIdx.x); d < dim; d += 2 * static_cast<int>(blockDim.x)) {
    float m = -INFINITY, l = 0.0f, o0 = 0.0f, o1 = 0.0f;
    for (int sp = 0; sp < a.num_segments; ++sp) {
      const float* p = part + sp * split_stride;
      const SegmentFold w = fold_segment_stats(m, l, p[dim], p[dim + 1]);
      o0 = fold_segment_value(o0, p[d], w);
      o1 = fold_segment_value(o1, p[d + 1], w);
    }
    const float scale = segment_output_scale(m, l, sink);
    *reinterpret_cast<uint32_t*>(out + d * int64_t(sizeof(T))) = pack2<T>(__fmul_rn(o0, scale), __fmul_rn(o1, scale));
  }
}

template <typename T>
bool vector_loads_ok(const AttentionLaunch& a) {
  auto aligned = [](int64_t x) { return x % 16 == 0; };
  const bool v_rows_ok = v_in_k(a) || aligned(a.v.dim * int64_t(sizeof(T)));
  return aligned(a.k.dim * int64_t(sizeof(T))) && v_rows_ok && aligned(reinterpret_cast<uintptr_t>(a.k.base)) &&
         aligned(reinterpret_cast<uintptr_t>(a.v.base)) && aligned(a.k.stride0) && aligned(a.k.stride1) &&
         aligned(a.k.stride2) && aligned(a.v.stride0) && aligned(a.v.stride1) && aligned(a.v.stride2);
}

bool use_blocked(const AttentionLaunch& a) {
  return a.q_tile * a.head_tile >= kWarps * kRowBlock && a.q.dim % 4 == 0;
}

// The largest divisor of n that is at most cap (at least 1).
int divisor_at_most(int n, int cap) {
  for (int d = std::min(n, cap); d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

template <typename T, typename C, bool kVec, bool kBlocked>
void launch_kernel(const AttentionLaunch& a, dim3 grid, size_t smem, cudaStream_t stream) {
  auto* kernel = attention_kernel<T, C, kVec, kBlocked>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  launch_chained(kernel, grid, kThreads, smem, stream, a);
}

template <typename T, typename C>
void launch_cached(const AttentionLaunch& a, cudaStream_t stream) {
  size_t smem = attention_smem_bytes(a);
  dim3 grid(static_cast<unsigned>(a.q_blocks), static_cast<unsigned>(a.k.heads * (a.group / a.head_tile)),
            static_cast<unsigned>(a.num_seqs * a.num_splits));
  const bool vec = vector_loads_ok<C>(a), blocked = use_blocked(a);
  if (vec && blocked) launch_kernel<T, C, true, true>(a, grid, smem, stream);
  else if (vec) launch_kernel<T, C, true, false>(a, grid, smem, stream);
  else if (blocked) launch_kernel<T, C, false, true>(a, grid, smem, stream);
  else launch_kernel<T, C, false, false>(a, grid, smem, stream);
}

template <typename T>
void launch_typed(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.k.fp8) launch_cached<T, __nv_fp8_e4m3>(a, stream);
  else launch_cached<T, T>(a, stream);
}

}  // namespace

void plan_attention(AttentionLaunch& a, const AttentionHints& hints) {
  // A missing max_q_len hint falls back to the number of query rows (always
  // an upper bound); a wrong one is caught on the device as a layout error.
  const int64_t n = a.q.n;
  const int max_q = hints.max_q_len > 0 ? hints.max_q_len : static_cast<int>(n);
  const int dim = static_cast<int>(a.q.dim);
  int min_keys_per_split = 64;  // two SIMT key tiles
  if (hints.allow_mma && attention_mma_supported(a)) {
    const int64_t rows = int64_t{max_q} * a.group;
    if (!hints.batch_invariant) {
      a.kernel = rows <= attention_mma_rows(AttentionKernel::MmaDecode, dim) ? AttentionKernel::MmaDecode
                                                                              : AttentionKernel::MmaPrefill;
    } else {
      // The mode's decode-shaped launches that fill the SMs (unless key
      // segments, which the prefill shape folds, are on) spread a block's
      // products over four warps: the same bits, 1.2-1.4x faster at 64-256
      // sequences with heads up to 128 wide. It is slower where a few blocks
      // each stream a long sequence (a deeper ring did not help: its warps
      // wait on instruction fetch), and at 256-wide heads, whose tiles give
      // only two warps (H100, docs/benchmarks.md runs 90 and 92): those keep
      // the prefill shape.
      const bool segmented = hints.segment_keys > 0 && dim <= kAttentionMaxSegmentedDim;
      const int64_t split_dims_blocks = int64_t{a.num_seqs} * a.k.heads;  // one 16-row block each
      a.kernel = rows <= attention_mma_rows(AttentionKernel::MmaInvariantDecode, dim) && !segmented &&
                         split_dims_blocks >= hints.num_sms && dim <= kAttentionMaxSplitDimsDim
                     ? AttentionKernel::MmaInvariantDecode
                     : AttentionKernel::MmaPrefill;
    }
    const int block_rows = attention_mma_rows(a.kernel, dim);
    a.q_blocks = static_cast<int>((rows + block_rows - 1) / block_rows);
    a.head_tile = a.group;
    min_keys_per_split = 128;  // two tensor-core key tiles
  } else if (hints.allow_mma && attention_mla_supported(a)) {
    a.kernel = AttentionKernel::MmaLatent;
    const int64_t rows = int64_t{max_q} * a.group;
    a.q_blocks = static_cast<int>((rows + attention_mla_rows() - 1) / attention_mla_rows());
    a.head_tile = a.group;
    min_keys_per_split = 64;  // one key tile: a decode token's 16 heads are one block
  } else {
    a.kernel = AttentionKernel::Simt;
    const int group = std::max(a.group, 1);
    const int rows_target = dim <= 128 ? 64 : 32;
    // The whole group in one block when it fits the row target, so that each
    // K/V tile is read once per group; larger groups (MLA) in equal tiles.
    a.head_tile = divisor_at_most(group, rows_target);
    a.q_tile = std::max(1, std::min(max_q, rows_target / a.head_tile));
    // Large heads (MLA's 576) shrink the rows until the block fits.
    while (attention_smem_bytes(a) > hints.max_smem_bytes && (a.q_tile > 1 || a.head_tile > 1)) {
      if (a.q_tile > 1) a.q_tile /= 2;
      else a.head_tile = divisor_at_most(group, a.head_tile - 1);
    }
    a.q_blocks = (max_q + a.q_tile - 1) / a.q_tile;
    // Decode with few sequences and large heads (MLA: 16+ query heads on one
    // 576-wide latent head) leaves almost every SM idle with whole-group
    // blocks: one block per sequence and split, each looping over 16 heads
    // (72 us per layer for one sequence). Smaller head tiles and one-tile
    // splits spread that work; the head tiles of one sequence run as
    // neighbouring blocks, so the latent rows they share come from L2.
    const int64_t whole_group_blocks = int64_t{a.num_seqs} * a.k.heads * (group / a.head_tile) * a.q_blocks;
    if (max_q == 1 && dim > 256 && whole_group_blocks < hints.num_sms) {
      a.head_tile = divisor_at_most(group, 4);
      min_keys_per_split = 32;
    }
  }
  // Split the keys when the blocks would leave SMs idle (decode at small
  // batch); each split keeps at least two key tiles.
  const int64_t blocks = int64_t{a.num_seqs} * a.k.heads * (a.group / a.head_tile) * a.q_blocks;
  a.num_splits = 1;
  const int64_t per_split = n * a.q.heads * (a.v.dim + 2) * static_cast<int64_t>(sizeof(float));
  a.segment_keys = 0;
  a.segment_partials = false;
  a.num_segments = 0;
  if (hints.batch_invariant) {
    // Segments fold the same way in the kernel or from partials, so how may
    // follow the batch: decode-shaped launches (a block's rows are one
    // sequence's few tokens) write each segment's partial, small beside the
    // keys read, and split whole segments over blocks when the sequences
    // alone would leave SMs idle; prompts fold in the kernel, unsplit.
    if (a.kernel != AttentionKernel::MmaPrefill || dim > kAttentionMaxSegmentedDim || hints.segment_keys <= 0) return;
    a.segment_keys = hints.segment_keys;
    const int64_t segments = (int64_t{hints.max_kv_len} + a.segment_keys - 1) / a.segment_keys;
    const bool decode_shaped = int64_t{max_q} * a.group <= attention_mma_rows(AttentionKernel::MmaDecode, dim);
    if (decode_shaped && segments <= kMaxSegments &&
        segments * per_split <= static_cast<int64_t>(hints.workspace_bytes)) {
      a.segment_partials = true;
      a.num_segments = static_cast<int>(std::max<int64_t>(segments, 1));
      const int64_t want = blocks < hints.num_sms ? 2 * int64_t{hints.num_sms} / blocks : 1;
      a.num_splits = static_cast<int>(std::clamp<int64_t>(
          std::min<int64_t>(want, 65535 / std::max(a.num_seqs, 1)), 1, a.num_segments));
    }
    return;
  }
  if (hints.max_kv_len >= 2 * min_keys_per_split && blocks < hints.num_sms) {
    // The tensor-core kernels hold one or two blocks per SM: round down so
    // the splits fill whole waves of 2 * num_sms blocks (a partial second
    // wave would double the time).
    // The latent kernel's 170 KB of shared memory allow one block per SM.
    int64_t want = a.kernel == AttentionKernel::Simt        ? (2 * int64_t{hints.num_sms} + blocks - 1) / blocks
                   : a.kernel == AttentionKernel::MmaLatent ? int64_t{hints.num_sms} / blocks
                                                            : 2 * int64_t{hints.num_sms} / blocks;
    want = std::min<int64_t>({want, hints.max_kv_len / min_keys_per_split, kMaxSplits, 65535 / std::max(a.num_seqs, 1)});
    want = std::min<int64_t>(want, static_cast<int64_t>(hints.workspace_bytes) / std::max<int64_t>(per_split, 1));
    a.num_splits = static_cast<int>(std::max<int64_t>(want, 1));
  }
}

size_t attention_smem_bytes(const AttentionLaunch& a) {
  if (a.kernel == AttentionKernel::MmaLatent) return attention_mla_smem_bytes();
  if (a.kernel != AttentionKernel::Simt) return attention_mma_smem_bytes(a);
  return smem_layout(a.q_tile * a.head_tile, static_cast<int>(a.q.dim), static_cast<int>(a.v.dim), v_in_k(a),
                     use_blocked(a))
      .total;
}

void launch_attention(const AttentionLaunch& a, Stream stream) {
  if (a.num_seqs == 0 || a.q.n == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a.kernel == AttentionKernel::Simt) {
    DI_DISPATCH_ELEM(a.type, T, launch_typed<T>(a, s));
  } else if (a.kernel == AttentionKernel::MmaLatent) {
    launch_attention_mla(a, stream);
  } else {
    launch_attention_mma(a, stream);
  }
  if (a.segment_partials) {
    // Only the tensor-core kernel segments (bf16/f16 rows).
    const auto blocks = static_cast<unsigned>(a.q.n * a.q.heads);
    if (a.type == ElemType::BF16) launch_chained(combine_segments_kernel<__nv_bfloat16>, blocks, 64, 0, s, a);
    else if (a.type == ElemType::F16) launch_chained(combine_segments_kernel<__half>, blocks, 64, 0, s, a);
  } else if (a.num_splits > 1) {
    DI_DISPATCH_ELEM(a.type, T,
                     launch_chained(combine_kernel<T>, static_cast<unsigned>(a.q.n * a.q.heads), 128, 0, s, a));
  }
}

}  // namespace deepinfer::cuda
