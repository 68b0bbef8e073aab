// Tensor-core paged attention for bf16/f16 Q and KV cache (f32 accumulation).
//
// Same partition and semantics as the SIMT kernel in cuda_attention.cu: a
// block takes one (sequence, KV head, row block, KV split), where the rows are
// the sequence's (query token, query head of the group) pairs flattened as
// token * group + head, so each K/V tile read from the cache serves the whole
// GQA group. Blocks of kRows flattened rows replace the SIMT kernel's q_tile.
//
// Per key tile: warps compute S = Q K^T with mma.sync m16n8k16 on fragments
// read by ldmatrix from XOR-swizzled shared memory, run the online softmax in
// registers in log2 units (exp2 with log2(e) folded into the scale), convert
// P to bf16/f16 in registers and accumulate O += P V. K/V tiles arrive through
// a cp.async ring of kStages buffers; every key row's address comes from the
// page table, whose entries are read one tile ahead so the lookup latency
// hides behind the previous tile's math.
//
// Two shapes of block:
//  - prefill: each warp owns 16 rows and all keys of a tile;
//  - decode (at most 16 rows: q_len * group <= 16): all warps share the 16
//    rows and split each tile's keys, so a block streams the cache with four
//    warps of loads and math in flight; their (m, l, O) merge at the end.
// Both end by staging (m, l, O) in shared memory and merging per row there,
// which also yields the split-KV partials [num_splits, n, heads_q, dim + 2]
// that combine_kernel in cuda_attention.cu reduces.
// The batch-invariant mode keeps the prefill shape's order of summation for
// every query count. Its decode batches that fill the SMs run that shape with
// one 16-row block of four warps (MmaConfig::kSplitDims): the warps split a
// tile's scores and the head's dims, and each runs the prefill warp's softmax
// on the whole tile. With key segments (cuda_attention_segments.cuh) the
// prefill shape runs one of two ways: each warp folds its rows' segments
// into an accumulator in shared memory and writes outputs
// (Seg::Fold), or writes every segment's partial for combine_segments_kernel
// to fold (Seg::Partials: decode-shaped launches, whose partials are small).
//
// An FP8 (e4m3) cache (operand helpers in cuda_attention_fp8.cuh) arrives
// through the same cp.async ring at half the bytes and the products run in
// f16 whatever the activations' type (every e4m3 value is an f16 value; one
// cvt makes two): Q's fragments are
// converted once (saturating at f16's +-65504), P is packed to f16 (three
// more mantissa bits than bf16), accumulation is f32. K's MMA fragments are
// built straight from the staged bytes: one 32-bit load gives dims 4c..4c+3
// of a key, two cvts make both B registers, and Q's fragments are permuted
// to match (a dot product does not care about the order of its dims), once
// per block, or per tile at D = 256 where Q is re-read from shared memory.
// V's fragments pair two keys per register, so each landed V tile is widened
// into a swizzled f16 tile for ldmatrix.trans.
// ncu showed the decode kernel bound by its instruction stream (two warps
// per scheduler, fixed-latency dependencies the top stall), so the FP8 path
// must add few instructions: widening K and V to bf16 (four conversions per
// pair) gained nothing over the bf16 cache; f16 and K fragments from the
// bytes made it 1.23x faster (docs/benchmarks.md, runs 17-24).
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_attention_fp8.cuh"
#include "backend/cuda/cuda_attention_segments.cuh"
#include "backend/cuda/cuda_attention_seq.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace deepinfer::cuda {

namespace {

using namespace attention_fp8;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxSegmentedDim = kAttentionMaxSegmentedDim;

// How a launch treats key segments (AttentionLaunch::segment_keys).
enum class Seg { None, Fold, Partials };

template <int D, bool kDecode, bool kFp8 = false, Seg kSeg = Seg::None, bool kSplitDims = false>
struct MmaConfig {
  static_assert(!kSplitDims || (!kDecode && kSeg == Seg::None), "split dims is the prefill shape's one-block decode");
  static constexpr int kBlockN = kDecode ? 64 : (D <= 128 ? 64 : 32);
  // kSplitDims (the batch-invariant mode's decode, MmaInvariantDecode): one
  // block of 16 rows whose warps share every key tile. Warp w multiplies Q by
  // the tile's keys 16w..16w+15; the scores are exchanged in shared memory, so
  // every warp holds the whole tile as one warp of the prefill shape does and
  // runs the same softmax on it; then each warp accumulates P V for its slice
  // of the head's dims. A row's sums are the prefill shape's, bit for bit,
  // with the products spread over kBlockN / 16 warps instead of one.
  static constexpr int kDimWarps = kSplitDims ? kBlockN / 16 : 1;
  static constexpr int kRowWarps = kDecode || kSplitDims ? 1 : (D <= 128 ? 8 : 4);
  static constexpr int kKeyWarps = kDecode ? 4 : 1;
  static constexpr int kThreads = kRowWarps * kKeyWarps * kDimWarps * 32;
  static constexpr int kRows = kRowWarps * 16;
  static constexpr int kWarpN = kBlockN / kKeyWarps;  // keys of a tile one warp multiplies
  // Decode at D <= 128: two stages make room for a third block per SM (68 KB
  // of shared memory, <= 168 registers): 12 warps instead of 8 to hide the
  // instruction latency ncu found the kernel bound by (not bandwidth).
  static constexpr bool kThirdBlock = kDecode && D <= 128;
  static constexpr int kStages = kThirdBlock ? 2 : (D <= 128 || kSplitDims ? 3 : 2);
  // Q fragments stay in registers unless the f32 accumulator of a 256-wide
  // head already takes most of them.
  static constexpr bool kQInRegs = D <= 128;
  static constexpr int kMinBlocks =
      kThirdBlock ? 3 : ((kDecode && D <= 128) || (!kDecode && D > 128) || kSplitDims ? 2 : 1);
  // f32 staging row stride: the +8 puts rows g and g + 4 of a fragment on different banks.
  static constexpr int kLdo = D + 8;
  static constexpr size_t kQBytes = size_t(kRows) * D * 2;
  static constexpr size_t kTileBytes = size_t(kBlockN) * D * 2;  // one 16-bit K or V tile
  static constexpr int kCacheBytes = kFp8 ? 1 : 2;                // bytes of a cache element
  static constexpr size_t kStageBytes = size_t(kBlockN) * D * kCacheBytes;
  // The ring of cache tiles, then (FP8) the widened V tile the math reads.
  static constexpr size_t kRingBytes = size_t(kStages) * 2 * kStageBytes + (kFp8 ? kTileBytes : 0);
  static constexpr size_t kMergeBytes = size_t(kKeyWarps) * kRows * kLdo * 4;
  static constexpr size_t kLoopBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
  static constexpr size_t kStatBytes = 2 * size_t(kKeyWarps) * kRows * 4;
  // Seg::Fold: the folded segments' f32 output, thread-private slots (a
  // second register accumulator would spill: the kernel is at 255).
  static constexpr size_t kFoldBytes = kSeg == Seg::Fold ? size_t(kRows) * D * 4 : 0;
  // kSplitDims: a tile's f32 scores, in the fragment layout of one warp.
  static constexpr size_t kScoreBytes = kSplitDims ? size_t(kRows) * kBlockN * 4 : 0;
  static constexpr size_t kSmemBytes = kQBytes + kLoopBytes + kStatBytes + kFoldBytes + kScoreBytes;
  static_assert(kWarpN % 16 == 0, "a warp's keys form whole k-steps of the PV product");
  static_assert(D % (16 * kDimWarps) == 0, "each warp takes whole n16 steps of the dims");
  static_assert(kThreads % (D * kCacheBytes / 16) == 0 && (kBlockN * D * kCacheBytes / 16) % kThreads == 0,
                "tile loads split evenly");
  static_assert((kRows * D / 8) % kThreads == 0, "Q loads split evenly");
};

static_assert(MmaConfig<64, false>::kBlockN == kAttentionSegmentTile &&
                  MmaConfig<kMaxSegmentedDim, false>::kBlockN == kAttentionSegmentTile,
              "segments start on the segmented kernel's key tiles");

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of D-wide rows.
// XOR with the row's low bits: the 8 rows one ldmatrix matrix reads sit in
// distinct bank groups (rows are 128, 256 or 512 bytes, all on the same banks).
template <int D>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return static_cast<uint32_t>(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
}

// Row (t, h) of partial `index` (a split, or a segment under Seg::Partials)
// in the workspace [index, n, heads_q, D + 2].
template <int D>
__device__ __forceinline__ float* partial_row(const AttentionLaunch& a, int index, int t, int h) {
  return a.partial + ((int64_t(index) * a.q.n + t) * a.q.heads + h) * (D + 2);
}

// Seg::Partials: one segment's state of a warp's rows flat0 and flat0 + 8
// (of warp_rows from the warp's first), unnormalised, for the combine.
template <int D>
__device__ __forceinline__ void write_segment_partial(const AttentionLaunch& a, int seg, const float (&o)[D / 8][4],
                                                      const float (&m)[2], const float (&l)[2], int flat0,
                                                      int warp_rows, int gq, int cq, int q_begin, int g) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (gq + 8 * i >= warp_rows) continue;
    const int flat = flat0 + 8 * i;
    const int t = q_begin + flat / a.group, h = g * a.group + flat % a.group;
    float* part = partial_row<D>(a, seg, t, h);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<float2*>(part + dt * 8 + 2 * cq) = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
    }
    if (cq == 0) {
      part[D] = m[i];  // log2 units: combine_segments_kernel folds them as Seg::Fold does
      part[D + 1] = l[i];
    }
  }
}

// T: q/out elements (bf16/f16); KvT: cache elements (T, or FP8 e4m3).
template <typename T, typename KvT, int D, bool kDecode, Seg kSeg, bool kSplitDims = false,
          typename C = MmaConfig<D, kDecode, !std::is_same_v<KvT, T>, kSeg, kSplitDims>>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) attention_mma_kernel(AttentionLaunch a) {
  static_assert(kSeg == Seg::None || !kDecode, "segments are per warp: every warp must see all keys of a tile");
  constexpr bool kSegmented = kSeg != Seg::None;
  wait_for_prior_kernel();
  release_next_kernel();
  constexpr bool kFp8 = !std::is_same_v<KvT, T>;
  using M = std::conditional_t<kFp8, __half, T>;  // operand type of the products
  constexpr int kChunks = D / 8;                       // 16-byte chunks per 16-bit row
  constexpr int kLoadChunks = D * C::kCacheBytes / 16;  // 16-byte chunks per cache row
  constexpr int kLoadRows = C::kBlockN * kLoadChunks / C::kThreads;
  constexpr int kLoadRowStep = C::kThreads / kLoadChunks;
  extern __shared__ __align__(128) unsigned char smem[];
  float* stage_o = reinterpret_cast<float*>(smem + C::kQBytes);
  float* m_s = reinterpret_cast<float*>(smem + C::kQBytes + C::kLoopBytes);
  float* l_s = m_s + C::kKeyWarps * C::kRows;
  float* fold_s = l_s + C::kKeyWarps * C::kRows;  // Seg::Fold: kThreads * D / 2 floats
  float4* scores_s = reinterpret_cast<float4*>(smem + C::kQBytes + C::kLoopBytes + C::kStatBytes + C::kFoldBytes);
  const uint32_t q_base = smem_addr(smem);
  const uint32_t ring_base = q_base + static_cast<uint32_t>(C::kQBytes);
  // FP8: the widened V tile, after the ring.
  const uint32_t wide_base = ring_base + static_cast<uint32_t>(C::kStages * 2 * C::kStageBytes);

  // Causal blocks later in the sequence have more keys: start them first.
  const int qb = a.q_blocks - 1 - static_cast<int>(blockIdx.x);
  const int g = blockIdx.y;
  const int s = blockIdx.z / a.num_splits, split = blockIdx.z % a.num_splits;
  const int tid = threadIdx.x;
  SeqExtent seq;
  if (!read_seq_extent(a, s, qb == 0 && g == 0 && split == 0, a.group, int64_t{C::kRows} * a.q_blocks, seq)) return;
  const int q_begin = seq.q_begin, q_len = seq.q_len, kv_p0 = seq.kv_p0, kv_len = seq.kv_len;
  const int page_size = static_cast<int>(a.k.page_size);
  // Power-of-two pages (the usual 16) turn the per-row division into shifts.
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  const int total_rows = q_len * a.group;
  const int r0 = qb * C::kRows;
  if (r0 >= total_rows) return;
  const int valid_rows = min(C::kRows, total_rows - r0);
  const int base = kv_len - q_len;  // key index of query token 0
  const int t_lo = r0 / a.group, t_hi = (r0 + valid_rows - 1) / a.group;
  // Key tiles start at multiples of the tile (the window's first key rounded
  // down; the keys before it are masked): a row's keys then fall into the
  // same tiles, summed in the same order, whichever rows share its block --
  // chunked prefill and prefix hits give the bits of a whole prompt.
  int k_begin = a.window > 0 ? max(0, base + t_lo - a.window + 1) / C::kBlockN * C::kBlockN : 0;
  int k_end = base + t_hi + 1;
  // Seg::Partials: a split takes whole segments, and the layout's segments
  // must cover the sequence (the plan takes the longest).
  const int seg_per_split = (a.num_segments + a.num_splits - 1) / a.num_splits;
  const int seg_lo = split * seg_per_split, seg_hi = min(a.num_segments, seg_lo + seg_per_split);
  if constexpr (kSeg == Seg::Partials) {
    if (split == 0 && qb == 0 && g == 0 && tid == 0 && kv_len > a.num_segments * a.segment_keys) {
      atomicOr(a.err, kErrAttentionLayout);
    }
    k_begin = max(k_begin, seg_lo * a.segment_keys);
    k_end = min(k_end, seg_hi * a.segment_keys);
  } else if (a.num_splits > 1) {
    const int chunk = ((kv_len + a.num_splits - 1) / a.num_splits + C::kBlockN - 1) / C::kBlockN * C::kBlockN;
    k_begin = max(k_begin, split * chunk);
    k_end = min(k_end, (split + 1) * chunk);
  }
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + C::kBlockN - 1) / C::kBlockN : 0;

  for (int i = tid; i < C::kRows * kChunks; i += C::kThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    const bool ok = r < valid_rows;
    const char* src = a.q.base;
    if (ok) {
      const int flat = r0 + r;
      const int t = q_begin + flat / a.group, h = g * a.group + flat % a.group;
      src = a.q.base + t * a.q.stride0 + h * a.q.stride1 + ch * 16;
    }
    cp_async16(q_base + swizzle<D>(r, ch), src, ok);
  }

  // Tile loads: this thread copies chunk `ld_chunk` of rows ld_row0 + i * kLoadRowStep.
  const int ld_chunk = tid % kLoadChunks, ld_row0 = tid / kLoadChunks;
  const int32_t* pages = a.page_ids + kv_p0;
  const int64_t cache_pages = min(a.k.pages, a.v.pages);
  int next_pages[kLoadRows];
  auto fetch_pages = [&](int tile) {
    const int kt = k_begin + tile * C::kBlockN;
#pragma unroll
    for (int i = 0; i < kLoadRows; ++i) {
      const int j = kt + ld_row0 + i * kLoadRowStep;
      // j < k_end <= kv_len, so j / page_size < n_pages.
      int page = -1;
      if (tile < n_tiles && j < k_end) page = pages[page_shift >= 0 ? j >> page_shift : j / page_size];
      next_pages[i] = page;
    }
  };
  // Row addresses: page * stride0 + slot * stride1 from the head's base, in
  // 32-bit strides (attention_mma_supported checks they fit), so a row costs
  // one wide multiply-add instead of several 64-bit products.
  const char* k_head = a.k.base + g * a.k.stride2 + ld_chunk * 16;
  const char* v_head = a.v.base + g * a.v.stride2 + ld_chunk * 16;
  const auto k_page = static_cast<uint32_t>(a.k.stride0), k_slot = static_cast<uint32_t>(a.k.stride1);
  const auto v_page = static_cast<uint32_t>(a.v.stride0), v_slot = static_cast<uint32_t>(a.v.stride1);
  auto issue_tile = [&](int tile) {
    const int kt = k_begin + tile * C::kBlockN;
    const uint32_t k_dst = ring_base + static_cast<uint32_t>((tile % C::kStages) * 2 * C::kStageBytes);
    const uint32_t v_dst = k_dst + static_cast<uint32_t>(C::kStageBytes);
#pragma unroll
    for (int i = 0; i < kLoadRows; ++i) {
      const int row = ld_row0 + i * kLoadRowStep;
      const int j = kt + row;
      const int page = next_pages[i];
      bool ok = page >= 0 && page < cache_pages;
      if (!ok && j < k_end) atomicOr(a.err, kErrAttentionPage);
      const char* k_src = a.k.base;
      const char* v_src = a.v.base;
      if (ok) {
        const auto off = static_cast<uint32_t>(page_shift >= 0 ? j & (page_size - 1) : j % page_size);
        k_src = k_head + static_cast<uint64_t>(static_cast<uint32_t>(page)) * k_page + off * k_slot;
        v_src = v_head + static_cast<uint64_t>(static_cast<uint32_t>(page)) * v_page + off * v_slot;
      }
      // FP8: K rows swizzled for the fragment loads, V rows as they come (widened).
      if constexpr (kFp8) {
        cp_async16(k_dst + fp8_k_offset<D>(row, ld_chunk), k_src, ok);
        cp_async16(v_dst + static_cast<uint32_t>(row * D + ld_chunk * 16), v_src, ok);
      } else {
        cp_async16(k_dst + swizzle<D>(row, ld_chunk), k_src, ok);
        cp_async16(v_dst + swizzle<D>(row, ld_chunk), v_src, ok);
      }
    }
  };
  // FP8: widens the landed V tile of `tile` into the swizzled f16 tile at wide_base.
  auto widen_v = [&](int tile) {
    const unsigned char* stage = smem + C::kQBytes + size_t(tile % C::kStages) * 2 * C::kStageBytes + C::kStageBytes;
    unsigned char* wide = smem + (wide_base - q_base);
    for (int i = tid; i < C::kBlockN * kLoadChunks; i += C::kThreads) {
      const int row = i / kLoadChunks, chunk = i % kLoadChunks;
      const uint4 in = *reinterpret_cast<const uint4*>(stage + row * D + chunk * 16);
      uint4 lo, hi;
      widen_fp8x16(in, lo, hi);
      *reinterpret_cast<uint4*>(wide + swizzle<D>(row, 2 * chunk)) = lo;
      *reinterpret_cast<uint4*>(wide + swizzle<D>(row, 2 * chunk + 1)) = hi;
    }
  };

  const int warp = tid / 32, lane = tid % 32;
  // kSplitDims: every warp has the block's 16 rows and the whole tile's
  // scores; dw picks its 16 keys of a tile's S and its slice of the dims.
  constexpr int kDimWarps = C::kDimWarps;
  constexpr int kDimTiles = D / 8 / kDimWarps;  // n8 tiles of the output dims this warp accumulates
  const int dw = kDimWarps > 1 ? warp : 0;
  const int kw = kDimWarps > 1 ? 0 : warp % C::kKeyWarps;            // which slice of a tile's keys
  const int wrow0 = kDimWarps > 1 ? 0 : (warp / C::kKeyWarps) * 16;  // the warp's first row in the block
  const int warp_rows = min(16, valid_rows - wrow0);
  const int gq = lane / 4, cq = lane % 4;  // fragment row and column pair
  // Key index of each row's own token: row r sees keys j with lo <= j <= pos.
  const int pos0 = base + (r0 + wrow0 + gq) / a.group;
  const int pos1 = base + (r0 + wrow0 + gq + 8) / a.group;
  const int lo0 = a.window > 0 ? pos0 - a.window + 1 : 0;
  const int lo1 = a.window > 0 ? pos1 - a.window + 1 : 0;
  const int wpos_lo = base + (r0 + wrow0) / a.group;
  const int wpos_hi = warp_rows > 0 ? base + (r0 + wrow0 + warp_rows - 1) / a.group : -1;
  const bool softcap = a.softcap > 0.0f;
  const float qk_mul = softcap ? a.scale / a.softcap : a.scale * kLog2e;
  const float cap_mul = a.softcap * kLog2e;

  uint32_t qf[C::kQInRegs ? D / 16 : 1][4];
  float o[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.0f, 0.0f};
  // Segments: (o, m_row, l_row) hold the current segment. Seg::Fold folds
  // it into (fold_s, m_fold, l_fold) at its end; Seg::Partials writes it out.
  float m_fold[2] = {-INFINITY, -INFINITY}, l_fold[2] = {0.0f, 0.0f};
  auto fold_slot = [&](int dt, int e) { return fold_s + (dt * 4 + e) * C::kThreads + tid; };
  auto end_segment = [&](int seg) {
    if constexpr (kSegmented) {
      float l_seg[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        l_seg[i] = l_row[i];
        l_seg[i] += __shfl_xor_sync(0xffffffffu, l_seg[i], 1);
        l_seg[i] += __shfl_xor_sync(0xffffffffu, l_seg[i], 2);
      }
      if constexpr (kSeg == Seg::Partials) {
        write_segment_partial<D>(a, seg, o, m_row, l_seg, r0 + wrow0 + gq, warp_rows, gq, cq, q_begin, g);
      } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const SegmentFold w = fold_segment_stats(m_fold[i], l_fold[i], m_row[i], l_seg[i]);
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            float* f0 = fold_slot(dt, 2 * i);
            float* f1 = fold_slot(dt, 2 * i + 1);
            *f0 = fold_segment_value(*f0, o[dt][2 * i], w);
            *f1 = fold_segment_value(*f1, o[dt][2 * i + 1], w);
          }
        }
      }
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
      m_row[0] = m_row[1] = -INFINITY;
      l_row[0] = l_row[1] = 0.0f;
    }
  };
  if constexpr (kSeg == Seg::Fold) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) *fold_slot(dt, e) = 0.0f;
    }
  }
  if constexpr (kSeg == Seg::Partials) {
    // This split's segments without a tile here are empty for every row (m =
    // -inf is all the combine reads of them).
    const int first = n_tiles > 0 ? k_begin / a.segment_keys : seg_hi;
    const int last = n_tiles > 0 ? (k_end - 1) / a.segment_keys : seg_hi - 1;
    for (int i = tid; i < (seg_hi - seg_lo) * valid_rows; i += C::kThreads) {
      const int seg = seg_lo + i / valid_rows, flat = r0 + i % valid_rows;
      if (seg >= first && seg <= last) continue;
      const int t = q_begin + flat / a.group, h = g * a.group + flat % a.group;
      partial_row<D>(a, seg, t, h)[D] = -INFINITY;
    }
  }

  fetch_pages(0);
#pragma unroll
  for (int st = 0; st < C::kStages - 1; ++st) {
    if (st < n_tiles) {
      issue_tile(st);
      fetch_pages(st + 1);
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  }

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // tile `it` landed for everyone; the buffer of tile it - 1 is free
    const int nxt = it + C::kStages - 1;
    if (nxt < n_tiles) {
      issue_tile(nxt);
      fetch_pages(nxt + 1);
    }
    cp_async_commit();
    if constexpr (kFp8) {
      widen_v(it);
      __syncthreads();  // the widened V is complete; every warp finished the previous one at the top barrier
    }
    if constexpr (C::kQInRegs) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          ldmatrix_x4(qf[kk], q_base + swizzle<D>(wrow0 + (lane & 15), 2 * kk + (lane >> 4)));
          to_math_type<T, M>(qf[kk]);
          if constexpr (kFp8) permute_q_for_fp8_k(qf[kk], lane);
        }
      }
    }

    // A segment ends where this tile starts (every warp, skipping or not).
    if (kSegmented && it > 0 && (k_begin + it * C::kBlockN) % a.segment_keys == 0) {
      end_segment((k_begin + it * C::kBlockN) / a.segment_keys - 1);
    }
    const int wk0 = k_begin + it * C::kBlockN + kw * C::kWarpN;  // first key of this warp's slice
    const bool skip = warp_rows <= 0 || wk0 >= k_end || wk0 > wpos_hi ||
                      (a.window > 0 && wk0 + C::kWarpN - 1 < wpos_lo - a.window + 1);
    if (skip) continue;
    const bool masked = wk0 + C::kWarpN > k_end || wk0 + C::kWarpN - 1 > wpos_lo ||
                        (a.window > 0 && wk0 < wpos_hi - a.window + 1);
    const uint32_t k_tile = ring_base + static_cast<uint32_t>((it % C::kStages) * 2 * C::kStageBytes);
    const uint32_t v_tile = kFp8 ? wide_base : k_tile + static_cast<uint32_t>(C::kTileBytes);

    float sc[C::kWarpN / 8][4];
#pragma unroll
    for (int i = 0; i < C::kWarpN / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      if constexpr (C::kQInRegs) {
        qa[0] = qf[kk][0], qa[1] = qf[kk][1], qa[2] = qf[kk][2], qa[3] = qf[kk][3];
      } else {
        ldmatrix_x4(qa, q_base + swizzle<D>(wrow0 + (lane & 15), 2 * kk + (lane >> 4)));
        to_math_type<T, M>(qa);
        if constexpr (kFp8) permute_q_for_fp8_k(qa, lane);
      }
#pragma unroll
      for (int np = 0; np < C::kWarpN / 16; ++np) {
        if (kDimWarps > 1 && np != dw) continue;  // another warp's keys
        uint32_t kb[4];
        if constexpr (kFp8) {
          // Keys gq and gq + 8 of the 16, bytes 16 kk + 4 cq .. + 3 of each.
          const int key = kw * C::kWarpN + np * 16 + gq;
          uint32_t w0, w1;
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w0) : "r"(k_tile + fp8_k_offset<D>(key, kk) + 4 * cq));
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w1) : "r"(k_tile + fp8_k_offset<D>(key + 8, kk) + 4 * cq));
          fp8x4_to_f16_fragments(w0, kb[0], kb[1]);
          fp8x4_to_f16_fragments(w1, kb[2], kb[3]);
        } else {
          const int key = kw * C::kWarpN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(kb, k_tile + swizzle<D>(key, 2 * kk + ((lane >> 3) & 1)));
        }
        mma16816<M>(sc[2 * np], qa, kb[0], kb[1]);
        mma16816<M>(sc[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    if constexpr (kDimWarps > 1) {
      // Every warp takes the other warps' scores: the tile's S as one warp holds it.
#pragma unroll
      for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
        if (nt / 2 == dw) scores_s[nt * 32 + lane] = make_float4(sc[nt][0], sc[nt][1], sc[nt][2], sc[nt][3]);
      }
      __syncthreads();  // skip is the same for every warp of the block (same rows, same keys)
#pragma unroll
      for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
        if (nt / 2 == dw) continue;
        const float4 v = scores_s[nt * 32 + lane];
        sc[nt][0] = v.x, sc[nt][1] = v.y, sc[nt][2] = v.z, sc[nt][3] = v.w;
      }
    }

    // Warp-uniform branches outside the element loops, so the common case
    // (no softcap, a tile fully inside every row's range) carries neither.
    if (softcap) {
#pragma unroll
      for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = tanhf(sc[nt][e] * qk_mul) * cap_mul;
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] *= qk_mul;
      }
    }
    if (masked) {
#pragma unroll
      for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = wk0 + nt * 8 + 2 * cq + (e & 1);
          const bool ok = e < 2 ? (j <= pos0 && j >= lo0) : (j <= pos1 && j >= lo1);
          if (!ok || j >= k_end) sc[nt][e] = -INFINITY;
        }
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
    }
    float msub[2], rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m_row[i], mx[i]);
      msub[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing seen yet keeps p = 0
      const float alpha = fast_exp2(m_row[i] - msub[i]);
      m_row[i] = m_new;
      l_row[i] *= alpha;
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        o[dt][2 * i] *= alpha;
        o[dt][2 * i + 1] *= alpha;
      }
    }
#pragma unroll
    for (int nt = 0; nt < C::kWarpN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = fast_exp2(sc[nt][e] - msub[e >> 1]);
        sc[nt][e] = p;
        rowsum[e >> 1] += p;
      }
    }
    l_row[0] += rowsum[0];
    l_row[1] += rowsum[1];

#pragma unroll
    for (int kk = 0; kk < C::kWarpN / 16; ++kk) {
      // The S accumulators of keys 16kk..16kk+15 are exactly the A fragment of P.
      const uint32_t pa[4] = {pack2<M>(sc[2 * kk][0], sc[2 * kk][1]), pack2<M>(sc[2 * kk][2], sc[2 * kk][3]),
                              pack2<M>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack2<M>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const int key = kw * C::kWarpN + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int dl = 0; dl < kDimTiles / 2; ++dl) {
        const int dp = dw * (kDimTiles / 2) + dl;  // n16 step of the head's dims
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_tile + swizzle<D>(key, 2 * dp + (lane >> 4)));
        mma16816<M>(o[2 * dl], pa, vb[0], vb[1]);
        mma16816<M>(o[2 * dl + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (kSeg == Seg::Partials) {
    if (n_tiles > 0) end_segment((k_end - 1) / a.segment_keys);
    return;
  }
  if constexpr (kSeg == Seg::Fold) {
    end_segment(0);  // the last segment (Fold reads no index)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (gq + 8 * i >= warp_rows) continue;
      const int flat = r0 + wrow0 + gq + 8 * i;
      const int t = q_begin + flat / a.group, h = g * a.group + flat % a.group;
      const float scale = segment_output_scale(m_fold[i], l_fold[i], a.sinks ? a.sinks[h] * kLog2e : -INFINITY);
      char* out = a.out.base + t * a.out.stride0 + h * a.out.stride1;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(out + (dt * 8 + 2 * cq) * 2) =
            pack2<T>(__fmul_rn(*fold_slot(dt, 2 * i), scale), __fmul_rn(*fold_slot(dt, 2 * i + 1), scale));
      }
    }
    return;
  }
  __syncthreads();  // the ring is now reused as the merge area

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_row[i] += __shfl_xor_sync(0xffffffffu, l_row[i], 1);
    l_row[i] += __shfl_xor_sync(0xffffffffu, l_row[i], 2);
  }
  float* so = stage_o + (size_t(kw) * C::kRows + wrow0 + gq) * C::kLdo + 2 * cq + dw * kDimTiles * 8;
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) {
    *reinterpret_cast<float2*>(so + dt * 8) = make_float2(o[dt][0], o[dt][1]);
    *reinterpret_cast<float2*>(so + 8 * C::kLdo + dt * 8) = make_float2(o[dt][2], o[dt][3]);
  }
  if (cq == 0 && dw == 0) {  // kSplitDims: every warp holds the same (m, l)
    const int r = kw * C::kRows + wrow0 + gq;
    m_s[r] = m_row[0];
    m_s[r + 8] = m_row[1];
    l_s[r] = l_row[0];
    l_s[r + 8] = l_row[1];
  }
  __syncthreads();

  if (tid < valid_rows) {
    // Per row: the merged max, each key slice's weight (kept in m_s) and the
    // sum, with the sink folded in when this block writes the final output.
    const int r = tid;
    const int flat = r0 + r;
    const int t = q_begin + flat / a.group, h = g * a.group + flat % a.group;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < C::kKeyWarps; ++w) m = fmaxf(m, m_s[w * C::kRows + r]);
    const float sink = a.sinks && a.num_splits == 1 ? a.sinks[h] * kLog2e : -INFINITY;
    const float m_all = fmaxf(m, sink);
    const float msub = m_all == -INFINITY ? 0.0f : m_all;
    float l = sink == -INFINITY ? 0.0f : fast_exp2(sink - msub);
    float weight[C::kKeyWarps];
#pragma unroll
    for (int w = 0; w < C::kKeyWarps; ++w) {
      weight[w] = fast_exp2(m_s[w * C::kRows + r] - msub);
      l += l_s[w * C::kRows + r] * weight[w];
    }
    const float inv = a.num_splits > 1 ? 1.0f : (l > 0.0f ? 1.0f / l : 0.0f);
#pragma unroll
    for (int w = 0; w < C::kKeyWarps; ++w) m_s[w * C::kRows + r] = weight[w] * inv;
    if (a.num_splits > 1) {
      float* part = partial_row<D>(a, split, t, h);
      part[D] = m * kLn2;  // the combine kernel works in natural-log units
      part[D + 1] = l;
    }
  }
  __syncthreads();

  for (int i = tid; i < valid_rows * (D / 2); i += C::kThreads) {
    const int r = i / (D / 2), d = (i % (D / 2)) * 2;
    float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < C::kKeyWarps; ++w) {
      const float wt = m_s[w * C::kRows + r];
      const float2 v = *reinterpret_cast<const float2*>(stage_o + (size_t(w) * C::kRows + r) * C::kLdo + d);
      acc.x += v.x * wt;
      acc.y += v.y * wt;
    }
    const int flat = r0 + r;
    const int t = q_begin + flat / a.group, h = g * a.group + flat % a.group;
    if (a.num_splits == 1) {
      *reinterpret_cast<uint32_t*>(a.out.base + t * a.out.stride0 + h * a.out.stride1 + d * 2) = pack2<T>(acc.x, acc.y);
    } else {
      float* part = partial_row<D>(a, split, t, h);
      *reinterpret_cast<float2*>(part + d) = acc;
    }
  }
}

template <typename T, typename KvT, int D, bool kDecode, Seg kSeg = Seg::None, bool kSplitDims = false>
void launch_config(const AttentionLaunch& a, cudaStream_t stream) {
  using C = MmaConfig<D, kDecode, !std::is_same_v<KvT, T>, kSeg, kSplitDims>;
  auto* kernel = attention_mma_kernel<T, KvT, D, kDecode, kSeg, kSplitDims>;
  // The opt-in shared memory size is a per-device function attribute: set it
  // once per device (outside any graph capture, at the first call).
  static std::atomic<uint64_t> devices_done{0};
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((devices_done.load(std::memory_order_acquire) & bit) == 0) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(C::kSmemBytes));
    devices_done.fetch_or(bit, std::memory_order_acq_rel);
  }
  dim3 grid(static_cast<unsigned>(a.q_blocks), static_cast<unsigned>(a.k.heads),
            static_cast<unsigned>(a.num_seqs * a.num_splits));
  launch_chained(kernel, grid, C::kThreads, C::kSmemBytes, stream, a);
}

// The prefill kernel's segment mode for a planned launch.
Seg segment_mode(const AttentionLaunch& a) {
  if (a.segment_keys <= 0) return Seg::None;
  return a.segment_partials ? Seg::Partials : Seg::Fold;
}

template <typename T, typename KvT, int D>
void launch_cache(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.kernel == AttentionKernel::MmaDecode) {
    launch_config<T, KvT, D, true>(a, stream);
    return;
  }
  if constexpr (D <= kAttentionMaxSplitDimsDim) {  // the plan splits no wider head
    if (a.kernel == AttentionKernel::MmaInvariantDecode) {
      launch_config<T, KvT, D, false, Seg::None, true>(a, stream);
      return;
    }
  }
  if constexpr (D <= kMaxSegmentedDim) {
    switch (segment_mode(a)) {
      case Seg::Partials: launch_config<T, KvT, D, false, Seg::Partials>(a, stream); return;
      case Seg::Fold: launch_config<T, KvT, D, false, Seg::Fold>(a, stream); return;
      case Seg::None: break;
    }
  }
  launch_config<T, KvT, D, false>(a, stream);
}

template <typename T, int D>
void launch_dim(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.k.fp8) launch_cache<T, __nv_fp8_e4m3, D>(a, stream);
  else launch_cache<T, T, D>(a, stream);
}

template <typename T>
void launch_typed(const AttentionLaunch& a, cudaStream_t stream) {
  switch (a.q.dim) {
    case 64: launch_dim<T, 64>(a, stream); break;
    case 128: launch_dim<T, 128>(a, stream); break;
    case 256: launch_dim<T, 256>(a, stream); break;
    default: break;  // excluded by attention_mma_supported
  }
}

template <int D, bool kFp8>
size_t smem_for(const AttentionLaunch& a) {
  if (a.kernel == AttentionKernel::MmaDecode) return MmaConfig<D, true, kFp8>::kSmemBytes;
  if constexpr (D <= kAttentionMaxSplitDimsDim) {
    if (a.kernel == AttentionKernel::MmaInvariantDecode) return MmaConfig<D, false, kFp8, Seg::None, true>::kSmemBytes;
  }
  if constexpr (D <= kMaxSegmentedDim) {
    if (segment_mode(a) == Seg::Fold) return MmaConfig<D, false, kFp8, Seg::Fold>::kSmemBytes;
  }
  return MmaConfig<D, false, kFp8>::kSmemBytes;
}

template <int D>
size_t smem_for(const AttentionLaunch& a) {
  return a.k.fp8 ? smem_for<D, true>(a) : smem_for<D, false>(a);
}

}  // namespace

bool attention_mma_supported(const AttentionLaunch& a) {
  auto aligned = [](int64_t x, int64_t to) { return x % to == 0; };
  auto ptr = [](const char* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  const int64_t d = a.q.dim;
  if (a.type == ElemType::F32 || (d != 64 && d != 128 && d != 256) || a.k.dim != d || a.v.dim != d ||
      a.out.dim != d || a.group < 1) {
    return false;
  }
  // The kernel forms row addresses with 32-bit page and slot strides.
  const int64_t max_stride = int64_t{1} << 31;
  if (a.k.stride0 >= max_stride || a.v.stride0 >= max_stride || int64_t{a.k.page_size} * a.k.stride1 >= max_stride ||
      int64_t{a.v.page_size} * a.v.stride1 >= max_stride) {
    return false;
  }
  // cp.async moves 16-byte chunks of Q/K/V rows; outputs are stored as pairs.
  return aligned(ptr(a.q.base), 16) && aligned(a.q.stride0, 16) && aligned(a.q.stride1, 16) &&
         aligned(ptr(a.k.base), 16) && aligned(a.k.stride0, 16) && aligned(a.k.stride1, 16) &&
         aligned(a.k.stride2, 16) && aligned(ptr(a.v.base), 16) && aligned(a.v.stride0, 16) &&
         aligned(a.v.stride1, 16) && aligned(a.v.stride2, 16) && aligned(ptr(a.out.base), 4) &&
         aligned(a.out.stride0, 4) && aligned(a.out.stride1, 4);
}

int attention_mma_rows(AttentionKernel kernel, int dim) {
  if (kernel == AttentionKernel::MmaDecode) return MmaConfig<128, true>::kRows;
  if (kernel == AttentionKernel::MmaInvariantDecode) return MmaConfig<128, false, false, Seg::None, true>::kRows;
  return dim <= 128 ? MmaConfig<128, false>::kRows : MmaConfig<256, false>::kRows;
}

size_t attention_mma_smem_bytes(const AttentionLaunch& a) {
  switch (a.q.dim) {
    case 64: return smem_for<64>(a);
    case 128: return smem_for<128>(a);
    case 256: return smem_for<256>(a);
    default: return 0;
  }
}

void launch_attention_mma(const AttentionLaunch& a, Stream stream) {
  if (a.type == ElemType::BF16) launch_typed<__nv_bfloat16>(a, static_cast<cudaStream_t>(stream));
  else if (a.type == ElemType::F16) launch_typed<__half>(a, static_cast<cudaStream_t>(stream));
}

}  // namespace deepinfer::cuda
