// Backend::sample on the GPU: one block per row, the same token as
// cpu::sample_row (backend/cpu/cpu_sampling.h) for the same logits and
// parameters.
//
// No sort. Tokens are ranked by a 64-bit key, the order-preserving bits of the
// logit above the reversed token id, so "higher key" is exactly the CPU's
// "higher logit, lower id first". Every ranked question the CPU answers by
// walking its sorted candidates -- which token is the k-th, where the running
// mass first reaches the nucleus, where it first exceeds the draw's target --
// is "the first token in rank order whose inclusive running count or mass
// reaches a threshold", found by a radix descent: per 11-bit digit of the key,
// a shared-memory histogram of counts and masses over the tokens that match
// the digits chosen so far, then a block scan over the bins in rank order.
// A row reads its logits a few times instead of sorting 262k of them.
//
// Masses are fixed point: round(w * 2^(63 - id_bits)) in 64 bits, so a row's
// sums are exact, independent of the order of the shared-memory atomics
// (deterministic), and consistent between the levels of a descent. The CPU
// sums the same f32 weights in f64; the two agree on the token unless a draw
// lands within ~1e-13 of a boundary between two tokens. Weights are
// exp() in f64 rounded to f32, which is the correctly rounded expf that glibc
// returns in practice.
#include <climits>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sampling.h"
#include "core/rng.h"

namespace deepinfer::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
static_assert(kBins % kThreads == 0 && kWarps <= 32);

using u64 = unsigned long long;

struct Smem {
  uint32_t count[kBins];
  u64 mass[kBins];
  uint32_t warp_c[kWarps];
  u64 warp_m[kWarps + 1];
  int sel_pos, last_pos;
  int sel_bin;
  uint32_t sel_count, sel_excl_c;
  u64 sel_excl_m;
  u64 found_key;
  int find_lo, find_hi;
  u64 find_acc;
};

// The logit as both backends see it in a non-greedy row: NaN is -inf.
__device__ __forceinline__ float clean(float x) { return isnan(x) ? -INFINITY : x; }

// a > b as floats (with -0 == +0) iff order_key(a) > order_key(b).
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t b = __float_as_uint(clean(x));
  if ((b << 1) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <typename T>
__device__ __forceinline__ T warp_add(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_inclusive(T v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Sum over the block, returned to every thread.
__device__ u64 block_sum(u64 v, Smem& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_add(v);
  if (lane == 0) s.warp_m[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_add(lane < kWarps ? s.warp_m[lane] : 0ull);
    if (lane == 0) s.warp_m[kWarps] = v;
  }
  __syncthreads();
  const u64 r = s.warp_m[kWarps];
  __syncthreads();
  return r;
}

__device__ u64 block_max(u64 v, Smem& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) s.warp_m[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? s.warp_m[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) s.warp_m[kWarps] = v;
  }
  __syncthreads();
  const u64 r = s.warp_m[kWarps];
  __syncthreads();
  return r;
}

// Exclusive prefix over the block, in thread order, of (c, m).
__device__ void block_exclusive(uint32_t& c, u64& m, Smem& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t ic = warp_inclusive(c);
  const u64 im = warp_inclusive(m);
  if (lane == 31) {
    s.warp_c[warp] = ic;
    s.warp_m[warp] = im;
  }
  __syncthreads();
  if (warp == 0) {
    const uint32_t x = lane < kWarps ? s.warp_c[lane] : 0u;
    const u64 y = lane < kWarps ? s.warp_m[lane] : 0ull;
    const uint32_t sx = warp_inclusive(x);
    const u64 sy = warp_inclusive(y);
    if (lane < kWarps) {
      s.warp_c[lane] = sx - x;
      s.warp_m[lane] = sy - y;
    }
  }
  __syncthreads();
  c = s.warp_c[warp] + ic - c;
  m = s.warp_m[warp] + im - m;
  __syncthreads();
}

// One row of logits and what the CPU derives from its maximum.
struct Row {
  const float* x;
  int vocab;
  int id_bits;  // bits of vocab - 1
  int key_bits;  // 32 + id_bits
  float max_logit;
  float inv_t;
  double scale;  // 2^(63 - id_bits): vocab weights of at most 1 sum below 2^63

  __device__ float logit(int i) const { return clean(x[i]); }
  __device__ u64 key(float l, int i) const {
    return (static_cast<u64>(order_key(l)) << id_bits) | static_cast<u64>(vocab - 1 - i);
  }
  __device__ int id_of(u64 key) const {
    const int64_t id = static_cast<int64_t>(vocab) - 1 - static_cast<int64_t>(key & ((1ull << id_bits) - 1));
    return id < 0 ? 0 : (id >= vocab ? vocab - 1 : static_cast<int>(id));
  }
  // The CPU's f32 weight: the same f32 subtract and multiply, then exp.
  __device__ float weight(float l) const {
    return static_cast<float>(exp(static_cast<double>((l - max_logit) * inv_t)));
  }
  __device__ u64 fixed(float w) const { return __double2ull_rn(static_cast<double>(w) * scale); }
};

struct Found {
  u64 key;
  uint32_t count_before;  // rank of the token among keys >= lo
  u64 mass_before;
};

// The first token in rank order, among those with key >= lo, whose inclusive
// running count (by_mass false) or fixed-point mass (by_mass true) reaches
// `threshold`. The caller makes sure one exists.
__device__ Found descend(const Row& r, Smem& s, u64 lo, bool by_mass, u64 threshold) {
  const int tid = threadIdx.x;
  u64 prefix = 0;
  int fixed_bits = 0;
  uint32_t acc_c = 0;
  u64 acc_m = 0;
  for (;;) {
    const int remaining = r.key_bits - fixed_bits;
    const int bits = remaining < kDigitBits ? remaining : kDigitBits;
    const int shift = remaining - bits;
    const int nbins = 1 << bits;
    for (int b = tid; b < nbins; b += kThreads) {
      s.count[b] = 0;
      s.mass[b] = 0;
    }
    if (tid == 0) {
      s.sel_pos = INT_MAX;
      s.last_pos = -1;
      s.sel_bin = 0;
      s.sel_count = 1;
      s.sel_excl_c = 0;
      s.sel_excl_m = 0;
    }
    __syncthreads();
    for (int i = tid; i < r.vocab; i += kThreads) {
      const float l = r.logit(i);
      const u64 k = r.key(l, i);
      if (k < lo || (k >> remaining) != prefix) continue;
      const int bin = static_cast<int>((k >> shift) & static_cast<u64>(nbins - 1));
      atomicAdd(&s.count[bin], 1u);
      if (by_mass) {
        const u64 q = r.fixed(r.weight(l));
        if (q != 0) atomicAdd(&s.mass[bin], q);
      }
    }
    __syncthreads();
    // Thread t holds rank positions [t * kBinsPerThread, ...); position p is bin nbins - 1 - p.
    uint32_t c[kBinsPerThread];
    u64 m[kBinsPerThread];
    uint32_t sum_c = 0;
    u64 sum_m = 0;
    for (int j = 0; j < kBinsPerThread; ++j) {
      const int p = tid * kBinsPerThread + j;
      c[j] = p < nbins ? s.count[nbins - 1 - p] : 0u;
      m[j] = p < nbins ? s.mass[nbins - 1 - p] : 0ull;
      sum_c += c[j];
      sum_m += m[j];
    }
    uint32_t ex_c = sum_c;
    u64 ex_m = sum_m;
    block_exclusive(ex_c, ex_m, s);
    uint32_t run_c = ex_c;
    u64 run_m = ex_m;
    for (int j = 0; j < kBinsPerThread; ++j) {
      run_c += c[j];
      run_m += m[j];
      if (c[j] == 0) continue;
      const int p = tid * kBinsPerThread + j;
      const bool reached = by_mass ? acc_m + run_m >= threshold : acc_c + run_c >= threshold;
      if (reached) atomicMin(&s.sel_pos, p);
      atomicMax(&s.last_pos, p);
    }
    __syncthreads();
    // No bin reaching the threshold means the caller's promise failed: take the last token.
    const int pos = s.sel_pos != INT_MAX ? s.sel_pos : s.last_pos;
    if (pos >= tid * kBinsPerThread && pos < (tid + 1) * kBinsPerThread) {
      uint32_t before_c = ex_c;
      u64 before_m = ex_m;
      for (int j = 0; j < pos - tid * kBinsPerThread; ++j) {
        before_c += c[j];
        before_m += m[j];
      }
      s.sel_bin = nbins - 1 - pos;
      s.sel_count = c[pos - tid * kBinsPerThread];
      s.sel_excl_c = before_c;
      s.sel_excl_m = before_m;
    }
    __syncthreads();
    acc_c += s.sel_excl_c;
    acc_m += s.sel_excl_m;
    prefix = (prefix << bits) | static_cast<u64>(s.sel_bin);
    fixed_bits += bits;
    const uint32_t in_bin = s.sel_count;
    __syncthreads();
    if (fixed_bits == r.key_bits || in_bin <= 1) break;
  }
  u64 key = prefix;
  if (fixed_bits < r.key_bits) {
    // One token left in the chosen bin: read its full key.
    const int remaining = r.key_bits - fixed_bits;
    if (tid == 0) s.found_key = prefix << remaining;
    __syncthreads();
    for (int i = tid; i < r.vocab; i += kThreads) {
      const u64 k = r.key(r.logit(i), i);
      if (k >= lo && (k >> remaining) == prefix) s.found_key = k;
    }
    __syncthreads();
    key = s.found_key;
    __syncthreads();
  }
  return {key, acc_c, acc_m};
}

// No top-k and no top-p: the first token in id order whose inclusive running
// mass (min-p filtered) reaches threshold. Narrows [lo, hi) by warp slices.
__device__ int find_in_id_order(const Row& r, Smem& s, float min_p, u64 threshold) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto mass = [&](int i) {
    const float w = r.weight(r.logit(i));
    return w < min_p ? 0ull : r.fixed(w);
  };
  int lo = 0, hi = r.vocab;
  u64 acc = 0;
  while (hi - lo > 32) {
    const int slice = (hi - lo + kWarps - 1) / kWarps;
    const int begin = lo + warp * slice;
    const int end = min(begin + slice, hi);
    u64 sum = 0;
    for (int i = begin + lane; i < end; i += 32) sum += mass(i);
    sum = warp_add(sum);
    if (lane == 0) s.warp_m[warp] = sum;
    __syncthreads();
    if (tid == 0) {
      u64 run = acc;
      int pick = -1, last = -1;
      for (int w = 0; w < kWarps && lo + w * slice < hi; ++w) {
        if (s.warp_m[w] == 0) continue;
        last = w;
        if (run + s.warp_m[w] >= threshold) {
          pick = w;
          break;
        }
        run += s.warp_m[w];
      }
      if (pick < 0) pick = last < 0 ? 0 : last;
      u64 before = acc;
      for (int w = 0; w < pick; ++w) before += s.warp_m[w];
      s.find_lo = lo + pick * slice;
      s.find_hi = min(lo + (pick + 1) * slice, hi);
      s.find_acc = before;
    }
    __syncthreads();
    lo = s.find_lo;
    hi = s.find_hi;
    acc = s.find_acc;
    __syncthreads();
  }
  int token = hi - 1;
  if (warp == 0) {
    const u64 q = lo + lane < hi ? mass(lo + lane) : 0ull;
    const u64 run = acc + warp_inclusive(q);
    const unsigned hit = __ballot_sync(0xffffffffu, q != 0 && run >= threshold);
    const unsigned positive = __ballot_sync(0xffffffffu, q != 0);
    if (hit != 0) {
      token = lo + __ffs(hit) - 1;
    } else if (positive != 0) {
      token = lo + 31 - __clz(positive);
    }
  }
  return token;  // meaningful in warp 0
}

// The draw's threshold: the first token whose running mass exceeds
// u * total, as an inclusive "reaches" threshold on integers.
__device__ u64 draw_threshold(double u, u64 total) {
  u64 t = static_cast<u64>(floor(u * static_cast<double>(total)));
  if (t >= total) t = total - 1;
  return t + 1;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(RowView logits, const SamplingRowParams* params,
                                                           int32_t* tokens, uint32_t* err) {
  wait_for_prior_kernel();
  release_next_kernel();
  __shared__ Smem s;
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  const SamplingRowParams p = params[row];
  Row r;
  r.x = row_as<const float>(logits, row);
  r.vocab = static_cast<int>(logits.cols);
  r.id_bits = r.vocab > 1 ? 32 - __clz(r.vocab - 1) : 0;
  r.key_bits = 32 + r.id_bits;

  // Argmax: highest logit, lowest id; NaN counts as -inf and never wins.
  u64 best = 0;
  auto consider = [&](float x, int i) {
    best = max(best, (static_cast<u64>(order_key(x)) << 32) | (0xffffffffu - static_cast<uint32_t>(i)));
  };
  if (r.vocab % 4 == 0 && reinterpret_cast<uintptr_t>(r.x) % 16 == 0) {
    // 16-byte loads, several in flight per thread: one block streams the
    // whole row, so the latency of single loads would bound it.
    const float4* x4 = reinterpret_cast<const float4*>(r.x);
    const int n4 = r.vocab / 4;
#pragma unroll 4
    for (int j = tid; j < n4; j += kThreads) {
      const float4 v = x4[j];
      consider(v.x, 4 * j);
      consider(v.y, 4 * j + 1);
      consider(v.z, 4 * j + 2);
      consider(v.w, 4 * j + 3);
    }
  } else {
    for (int i = tid; i < r.vocab; i += kThreads) consider(r.x[i], i);
  }
  best = block_max(best, s);
  const uint32_t best_key = static_cast<uint32_t>(best >> 32);
  const int best_id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
  int token = -1;
  if (best_key == order_key(-INFINITY)) {
    if (tid == 0) tokens[row] = -1;
    return;
  }
  if (p.temperature < kSamplingGreedyTemperature) {
    if (tid == 0) tokens[row] = best_id;
    return;
  }
  r.max_logit = key_value(best_key);
  if (isinf(r.max_logit)) {
    // +inf: no distribution exists. A numerical fault of this row, which the
    // engine reports for its request alone (as with no finite logit).
    if (tid == 0) tokens[row] = -1;
    return;
  }
  r.inv_t = 1.0f / p.temperature;
  r.scale = ldexp(1.0, 63 - r.id_bits);
  const double u = rng::uniform01(p.seed, static_cast<uint64_t>(p.position));
  const int n = p.top_k > 0 && p.top_k < r.vocab ? p.top_k : r.vocab;

  if (n == r.vocab && p.top_p >= 1.0f) {
    u64 total = 0;
    for (int i = tid; i < r.vocab; i += kThreads) {
      const float w = r.weight(r.logit(i));
      if (!(w < p.min_p)) total += r.fixed(w);
    }
    total = block_sum(total, s);
    if (total != 0) token = find_in_id_order(r, s, p.min_p, draw_threshold(u, total));
    if (tid == 0) tokens[row] = token;
    return;
  }

  // Ranked: the candidate set is the top n by key (everything without top-k).
  u64 lo = 0;
  if (n < r.vocab) lo = descend(r, s, 0, false, static_cast<u64>(n)).key;
  u64 set_total = 0, passing = 0, passing_mass = 0;
  for (int i = tid; i < r.vocab; i += kThreads) {
    const float l = r.logit(i);
    if (r.key(l, i) < lo) continue;
    const float w = r.weight(l);
    const u64 q = r.fixed(w);
    set_total += q;
    if (!(w < p.min_p)) {
      ++passing;
      passing_mass += q;
    }
  }
  set_total = block_sum(set_total, s);
  passing = block_sum(passing, s);
  passing_mass = block_sum(passing_mass, s);

  // Weights fall along the ranking, so min-p keeps a prefix: the passing
  // tokens, or the best one alone (weight 1) if none pass.
  u64 kept = static_cast<u64>(n), kept_mass = set_total;
  if (passing < kept) {
    kept = passing > 0 ? passing : 1;
    kept_mass = passing > 0 ? passing_mass : r.fixed(1.0f);
  }
  if (p.top_p < 1.0f) {
    // The nucleus keeps tokens while the mass ranked above them is below
    // top_p * set_total: up to the first whose inclusive mass reaches it.
    u64 nucleus = static_cast<u64>(ceil(static_cast<double>(p.top_p) * static_cast<double>(set_total)));
    if (nucleus < 1) nucleus = 1;
    // Skipped when the min-p prefix ends before the nucleus is reached.
    if (nucleus <= set_total && (kept == static_cast<u64>(n) || kept_mass >= nucleus)) {
      const Found f = descend(r, s, lo, true, nucleus);
      const u64 cut = static_cast<u64>(f.count_before) + 1;
      if (cut < kept) {
        kept = cut;
        kept_mass = f.mass_before + r.fixed(r.weight(r.logit(r.id_of(f.key))));
      }
    }
  }
  const Found d = descend(r, s, lo, true, draw_threshold(u, kept_mass));
  if (tid == 0) tokens[row] = r.id_of(d.key);
}

}  // namespace

void launch_sample(RowView logits, const void* params, int32_t* tokens, uint32_t* err, Stream stream) {
  if (logits.rows == 0) return;
  launch_chained(sample_kernel, static_cast<unsigned>(logits.rows), kThreads, 0, static_cast<cudaStream_t>(stream),
                 logits, static_cast<const SamplingRowParams*>(params), tokens, err);
}

}  // namespace deepinfer::cuda
