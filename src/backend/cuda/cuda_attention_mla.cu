// Tensor-core attention over an MLA latent cache (DeepSeek-V2/V3 with the
// projections absorbed): one cached row of 576 per token (512 latent
// channels, then 64 rotary ones) serves as the key of every query head, and
// its first 512 channels as the value. bf16/f16 Q and cache, f32
// accumulation; FP8 caches, other widths and windows stay on the SIMT kernel.
//
// A block takes 16 flattened (token, head) rows of one sequence (one m16
// tile: a decode token's 16 heads, or 16 of its 128) and one KV split, and
// walks 64-key tiles through a two-stage cp.async ring. The four warps split
// each tile's keys for S = Q K^T (16 keys each, 36 k-steps over the 576
// channels), meet in shared memory for the row maxima and sums of the online
// softmax, write P (16 x 64, the activation type) to shared memory, and then
// split the 512 output channels for O += P V (128 each, V's fragments read
// transposed from the same K tile), so no warp holds more than 64
// accumulators. The partials of a split have the SIMT kernel's layout,
// reduced by combine_kernel in cuda_attention.cu.
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_attention_seq.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kDk = 576, kDv = 512;
constexpr int kRows = 16, kKeys = 64, kWarps = 4, kThreads = 32 * kWarps, kStages = 2;
constexpr int kChunks = kDk / 8;          // 16-byte chunks per 576-wide row
constexpr int kWarpKeys = kKeys / kWarps;  // keys of a tile one warp multiplies in S
constexpr int kWarpDims = kDv / kWarps;    // output channels one warp accumulates
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Layout {
  static constexpr size_t kQ = 0;
  static constexpr size_t kRing = kQ + size_t(kRows) * kDk * 2;
  static constexpr size_t kStageBytes = size_t(kKeys) * kDk * 2;
  static constexpr size_t kP = kRing + kStages * kStageBytes;
  static constexpr size_t kRedMax = kP + size_t(kRows) * kKeys * 2;
  static constexpr size_t kRedSum = kRedMax + size_t(kWarps) * kRows * 4;
  static constexpr size_t kRowOffsets = kRedSum + size_t(kWarps) * kRows * 4;  // [stage][key] int64 byte offsets
  static constexpr size_t kTotal = kRowOffsets + size_t(kStages) * kKeys * 8;
};
static_assert(kChunks * kKeys % kThreads == 0, "tile loads split evenly");

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 576-wide
// rows: XOR with the row's low bits puts the 8 rows one ldmatrix matrix
// reads on distinct bank groups (chunks stay inside their group of 8, and 72
// is a multiple of 8).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * (kDk * 2) + ((chunk ^ (row & 7)) << 4));
}
// The P tile: 16 rows of 64 keys (8 chunks per row), swizzled the same way.
__device__ __forceinline__ uint32_t swz_p(int row, int chunk) {
  return static_cast<uint32_t>(row * (kKeys * 2) + ((chunk ^ (row & 7)) << 4));
}


template <typename T>
__global__ void __launch_bounds__(kThreads, 1) mla_attention_kernel(AttentionLaunch a) {
  wait_for_prior_kernel();
  release_next_kernel();
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_base = smem_addr(smem);
  const uint32_t q_base = s_base + Layout::kQ, ring_base = s_base + Layout::kRing, p_base = s_base + Layout::kP;
  float* red_max = reinterpret_cast<float*>(smem + Layout::kRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + Layout::kRedSum);
  int64_t* row_offsets = reinterpret_cast<int64_t*>(smem + Layout::kRowOffsets);

  const int qb = a.q_blocks - 1 - static_cast<int>(blockIdx.x);  // causal: the longest blocks first
  const int s = blockIdx.z / a.num_splits, split = blockIdx.z % a.num_splits;
  const int tid = threadIdx.x;
  SeqExtent seq;
  if (!read_seq_extent(a, s, qb == 0 && split == 0, a.group, int64_t{kRows} * a.q_blocks, seq)) return;
  const int q_begin = seq.q_begin, q_len = seq.q_len, kv_p0 = seq.kv_p0, kv_len = seq.kv_len;
  const int page_size = static_cast<int>(a.k.page_size);
  const int total_rows = q_len * a.group;
  const int r0 = qb * kRows;
  if (r0 >= total_rows) return;
  const int valid_rows = min(kRows, total_rows - r0);
  const int base = kv_len - q_len;  // key index of query token 0
  int k_begin = 0;
  int k_end = base + (r0 + valid_rows - 1) / a.group + 1;
  if (a.num_splits > 1) {
    const int chunk = ((kv_len + a.num_splits - 1) / a.num_splits + kKeys - 1) / kKeys * kKeys;
    k_begin = split * chunk;
    k_end = min(k_end, (split + 1) * chunk);
  }
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + kKeys - 1) / kKeys : 0;

  // Q rows (zeros past the valid ones).
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    const bool ok = r < valid_rows;
    const char* src = a.q.base;
    if (ok) {
      const int flat = r0 + r;
      src = a.q.base + (q_begin + flat / a.group) * a.q.stride0 + (flat % a.group) * a.q.stride1 + ch * 16;
    }
    cp_async16(q_base + swz(r, ch), src, ok);
  }

  const int32_t* pages = a.page_ids + kv_p0;
  // Byte offset of each key row of `tile` in the cache (-1: none), by the first 64 threads.
  auto find_rows = [&](int tile) {
    if (tid < kKeys) {
      const int j = k_begin + tile * kKeys + tid;
      int64_t off = -1;
      if (j < k_end) {
        const int page = pages[j / page_size];  // j < kv_len: inside the sequence's pages
        if (page >= 0 && page < a.k.pages) {
          off = page * a.k.stride0 + (j % page_size) * a.k.stride1;
        } else {
          atomicOr(a.err, kErrAttentionPage);
        }
      }
      row_offsets[(tile % kStages) * kKeys + tid] = off;
    }
  };
  auto issue_tile = [&](int tile) {
    const uint32_t dst = ring_base + static_cast<uint32_t>((tile % kStages) * Layout::kStageBytes);
    const int64_t* offs = row_offsets + (tile % kStages) * kKeys;
#pragma unroll 4
    for (int i = 0; i < kKeys * kChunks / kThreads; ++i) {
      const int idx = tid + i * kThreads, row = idx / kChunks, ch = idx % kChunks;
      const int64_t off = offs[row];
      cp_async16(dst + swz(row, ch), off >= 0 ? a.k.base + off + ch * 16 : a.k.base, off >= 0);
    }
  };

  const int warp = tid / 32, lane = tid % 32;
  const int gq = lane / 4, cq = lane % 4;  // fragment row and column pair
  // Key index of each fragment row's own token: row r sees keys j <= pos.
  const int pos0 = base + (r0 + gq) / a.group, pos1 = base + (r0 + gq + 8) / a.group;
  const float qk_mul = a.scale * kLog2e;  // scores in log2 units

  float o[kWarpDims / 8][4];
#pragma unroll
  for (int i = 0; i < kWarpDims / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.0f, 0.0f};

  if (n_tiles > 0) find_rows(0);
  __syncthreads();
  if (n_tiles > 0) issue_tile(0);
  cp_async_commit();  // with Q

  for (int it = 0; it < n_tiles; ++it) {
    if (it + 1 < n_tiles) find_rows(it + 1);
    __syncthreads();  // row offsets of it + 1 written; every warp is done with tile it - 1's stage and P
    if (it + 1 < n_tiles) issue_tile(it + 1);
    cp_async_commit();  // possibly empty: keeps the wait count uniform
    cp_async_wait<1>();
    __syncthreads();  // tile it (and Q) landed for everyone

    const uint32_t k_tile = ring_base + static_cast<uint32_t>((it % kStages) * Layout::kStageBytes);
    const int kt = k_begin + it * kKeys;

    // S for this warp's 16 keys.
    float sc[2][4] = {};
    const int key_frag = warp * kWarpKeys + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll 4
    for (int kk = 0; kk < kDk / 16; ++kk) {
      uint32_t qa[4], kb[4];
      ldmatrix_x4(qa, q_base + swz(lane & 15, 2 * kk + (lane >> 4)));
      ldmatrix_x4(kb, k_tile + swz(key_frag, 2 * kk + ((lane >> 3) & 1)));
      mma16816<T>(sc[0], qa, kb[0], kb[1]);
      mma16816<T>(sc[1], qa, kb[2], kb[3]);
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kt + warp * kWarpKeys + nt * 8 + 2 * cq + (e & 1);
        const bool ok = j < k_end && j <= (e < 2 ? pos0 : pos1);
        sc[nt][e] = ok ? sc[nt][e] * qk_mul : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[nt][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      if (cq == 0) red_max[warp * kRows + gq + 8 * i] = mx[i];
    }
    __syncthreads();

    // The tile's row maxima over all four warps; every warp keeps the same m and l.
    float alpha[2], msub[2], rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max = red_max[gq + 8 * i];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) tile_max = fmaxf(tile_max, red_max[w * kRows + gq + 8 * i]);
      const float m_new = fmaxf(m_row[i], tile_max);
      msub[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing seen yet keeps p = 0
      alpha[i] = fast_exp2(m_row[i] - msub[i]);
      m_row[i] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = fast_exp2(sc[nt][e] - msub[e >> 1]);
        rowsum[e >> 1] += p[e];
      }
      // Keys warp * 16 + nt * 8 + 2 cq (+1) of rows gq and gq + 8: chunk 2 warp + nt, byte 4 cq in it.
      const int chunk = 2 * warp + nt;
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p_base + swz_p(gq, chunk) + 4 * cq), "r"(pack2<T>(p[0], p[1])));
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(p_base + swz_p(gq + 8, chunk) + 4 * cq),
                   "r"(pack2<T>(p[2], p[3])));
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rowsum[i] += __shfl_xor_sync(0xffffffffu, rowsum[i], 1);
      rowsum[i] += __shfl_xor_sync(0xffffffffu, rowsum[i], 2);
      if (cq == 0) red_sum[warp * kRows + gq + 8 * i] = rowsum[i];
    }
    __syncthreads();  // P and the row sums are complete

#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red_sum[w * kRows + gq + 8 * i];
      l_row[i] = l_row[i] * alpha[i] + sum;
#pragma unroll
      for (int dt = 0; dt < kWarpDims / 8; ++dt) {
        o[dt][2 * i] *= alpha[i];
        o[dt][2 * i + 1] *= alpha[i];
      }
    }
    // O += P V over this warp's 128 channels; V is the K tile's first 512 channels.
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      uint32_t pa[4];
      ldmatrix_x4(pa, p_base + swz_p(lane & 15, 2 * ks + (lane >> 4)));
      const int key = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int dp = 0; dp < kWarpDims / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, k_tile + swz(key, 2 * (warp * (kWarpDims / 16) + dp) + (lane >> 4)));
        mma16816<T>(o[2 * dp], pa, vb[0], vb[1]);
        mma16816<T>(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();

  const int heads_q = static_cast<int>(a.q.heads);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = gq + 8 * i;
    if (r >= valid_rows) continue;
    const int flat = r0 + r;
    const int t = q_begin + flat / a.group, h = flat % a.group;
    if (a.num_splits == 1) {
      const float inv = l_row[i] > 0.0f ? 1.0f / l_row[i] : 0.0f;
      char* out = a.out.base + t * a.out.stride0 + h * a.out.stride1;
#pragma unroll
      for (int dt = 0; dt < kWarpDims / 8; ++dt) {
        const int d = warp * kWarpDims + dt * 8 + 2 * cq;
        *reinterpret_cast<uint32_t*>(out + d * 2) = pack2<T>(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
      }
    } else {
      float* part = a.partial + ((int64_t(split) * a.q.n + t) * heads_q + h) * (kDv + 2);
#pragma unroll
      for (int dt = 0; dt < kWarpDims / 8; ++dt) {
        const int d = warp * kWarpDims + dt * 8 + 2 * cq;
        *reinterpret_cast<float2*>(part + d) = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
      }
      if (warp == 0 && cq == 0) {
        part[kDv] = m_row[i] * kLn2;  // the combine kernel works in natural-log units
        part[kDv + 1] = l_row[i];
      }
    }
  }
}

template <typename T>
void launch_typed(const AttentionLaunch& a, cudaStream_t stream) {
  auto* kernel = mla_attention_kernel<T>;
  // The opt-in shared memory size is a per-device attribute: set once per
  // device, outside any graph capture (the first call is eager).
  static std::atomic<uint64_t> devices_done{0};
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((devices_done.load(std::memory_order_acquire) & bit) == 0) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Layout::kTotal));
    devices_done.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid(static_cast<unsigned>(a.q_blocks), 1, static_cast<unsigned>(a.num_seqs * a.num_splits));
  launch_chained(kernel, grid, kThreads, Layout::kTotal, stream, a);
}

}  // namespace

bool attention_mla_supported(const AttentionLaunch& a) {
  auto aligned = [](int64_t x, int64_t to) { return x % to == 0; };
  auto ptr = [](const char* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  const bool v_in_k = a.v.base == a.k.base && a.v.stride0 == a.k.stride0 && a.v.stride1 == a.k.stride1 &&
                      a.v.pages == a.k.pages && a.v.page_size == a.k.page_size;
  if (a.type == ElemType::F32 || a.k.fp8 || a.q.dim != kDk || a.k.dim != kDk || a.v.dim != kDv ||
      a.out.dim != kDv || a.k.heads != 1 || !v_in_k || a.group < 1 || a.window > 0 || a.softcap > 0.0f ||
      a.sinks != nullptr) {
    return false;
  }
  return aligned(ptr(a.q.base), 16) && aligned(a.q.stride0, 16) && aligned(a.q.stride1, 16) &&
         aligned(ptr(a.k.base), 16) && aligned(a.k.stride0, 16) && aligned(a.k.stride1, 16) &&
         aligned(ptr(a.out.base), 4) && aligned(a.out.stride0, 4) && aligned(a.out.stride1, 4);
}

int attention_mla_rows() { return kRows; }

size_t attention_mla_smem_bytes() { return Layout::kTotal; }

void launch_attention_mla(const AttentionLaunch& a, Stream stream) {
  if (a.type == ElemType::BF16) launch_typed<__nv_bfloat16>(a, static_cast<cudaStream_t>(stream));
  else if (a.type == ElemType::F16) launch_typed<__half>(a, static_cast<cudaStream_t>(stream));
}

}  // namespace deepinfer::cuda
