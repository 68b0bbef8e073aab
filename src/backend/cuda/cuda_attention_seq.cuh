// The per-sequence prologue every attention kernel shares: sequence s's query
// rows and cache pages read from the launch's metadata, and checked before any
// of them is used as an index.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace deepinfer::cuda {

struct SeqExtent {
  int q_begin = 0, q_len = 0;  // the sequence's query rows [q_begin, q_begin + q_len)
  int kv_p0 = 0, n_pages = 0;  // its pages: page_ids[kv_p0 .. kv_p0 + n_pages)
  int kv_len = 0;              // its keys, the last page holding last_len[s] of them
};

// False when the block has nothing to do: a sequence without query rows, or
// metadata that does not describe a valid layout, which sets
// kErrAttentionLayout (from the grid's first block only, so that one error is
// one atomic). A block holds row_capacity query rows of rows_per_token rows
// each token (the GQA group, flattened, or 1); more tokens than the grid's
// blocks hold is a layout error too. first_block: whether this block is the
// grid's first of sequence s (it also checks the layout's global ends, for s 0).
__device__ __forceinline__ bool read_seq_extent(const AttentionLaunch& a, int s, bool first_block,
                                                int64_t rows_per_token, int64_t row_capacity, SeqExtent& e) {
  if (first_block && s == 0 && threadIdx.x == 0 &&
      (a.q_indptr[0] != 0 || a.q_indptr[a.num_seqs] != a.q.n || a.kv_indptr[0] != 0)) {
    atomicOr(a.err, kErrAttentionLayout);
  }
  const int q_begin = a.q_indptr[s], q_end = a.q_indptr[s + 1];
  const int q_len = q_end - q_begin;
  const int kv_p0 = a.kv_indptr[s], kv_p1 = a.kv_indptr[s + 1];
  const int n_pages = kv_p1 - kv_p0;
  const int page_size = static_cast<int>(a.k.page_size);
  if (q_len == 0 && n_pages >= 0) return false;
  const int last_len = n_pages > 0 ? a.last_len[s] : 0;
  const int kv_len = (n_pages - 1) * page_size + last_len;
  if (q_len < 0 || q_begin < 0 || q_end > a.q.n || n_pages <= 0 || kv_p0 < 0 || kv_p1 > a.listed_pages ||
      last_len < 1 || last_len > page_size || kv_len < q_len || int64_t{q_len} * rows_per_token > row_capacity) {
    if (first_block && threadIdx.x == 0) atomicOr(a.err, kErrAttentionLayout);
    return false;
  }
  e = {q_begin, q_len, kv_p0, n_pages, kv_len};
  return true;
}

}  // namespace deepinfer::cuda
