// CUDA paged attention: the SIMT kernel against the tensor-core kernels, each
// with the plan the backend would choose. Prefill is compute-bound and is
// reported in TFLOP/s (4 * d * heads_q * n^2 / 2 for one causal sequence);
// decode is memory-bound and is reported in GB/s of K/V cache read. Each case
// also prints the largest difference between the two kernels' outputs and
// any device error, so a fast but wrong kernel shows. Then the tensor-core
// kernel over an FP8 (e4m3) copy of the same cache: its time, the GB/s of
// FP8 bytes read, and its output against the bf16 cache's.
// Then MLA's latent cache: the SIMT kernel against the tensor-core latent kernel.
// Usage: bench_attention_cuda [reps=10]
#include <fmt/format.h>

#include <cstdio>

#ifdef DEEPINFER_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "core/fp8.h"
#include "core/half.h"
#include "cuda_bench.h"

using namespace deepinfer;
using namespace deepinfer::cuda;

namespace {

using deepinfer::bench::check;

struct Case {
  std::string name;
  int num_seqs, q_len, kv_len, heads_kv, group, dim, page_size;
  bool shuffle_pages = true;
};

class DeviceMemory {
 public:
  ~DeviceMemory() {
    for (void* p : blocks_) cudaFree(p);
  }
  template <typename T>
  T* alloc(size_t count) {
    void* p = nullptr;
    check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
    blocks_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& host) {
    T* p = alloc<T>(host.size());
    check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    return p;
  }

 private:
  std::vector<void*> blocks_;
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(dist(gen));
  return v;
}

// Fills a large device buffer by repeating one random block (fast set-up for
// the multi-GB decode cache); the values are e4m3-representable, and `fp8`
// receives the same values as e4m3 bytes.
void fill_random(uint16_t* dst, uint8_t* fp8, size_t n, std::mt19937& gen) {
  const size_t block = std::min<size_t>(n, size_t{8} << 20);
  std::vector<uint16_t> host = random_bf16(block, gen);
  std::vector<uint8_t> bytes(block);
  for (size_t i = 0; i < block; ++i) {
    bytes[i] = f32_to_f8e4m3(bf16_to_f32(host[i]));
    host[i] = f32_to_bf16(f8e4m3_to_f32(bytes[i]));
  }
  for (size_t off = 0; off < n; off += block) {
    const size_t count = std::min(block, n - off);
    check(cudaMemcpy(dst + off, host.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(fp8 + off, bytes.data(), count, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Metadata of num_seqs sequences of q_len queries over kv_len keys each, in
// pages_per_seq consecutive entries of the page list, which names every page
// once (in order, or shuffled to see what scattered reads cost).
struct UniformLayout {
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, last_len, page_ids;
  UniformLayout(int num_seqs, int q_len, int64_t kv_len, int pages_per_seq, int64_t page_size, bool shuffle,
                std::mt19937& gen)
      : page_ids(static_cast<size_t>(int64_t{num_seqs} * pages_per_seq)) {
    std::iota(page_ids.begin(), page_ids.end(), 0);
    if (shuffle) std::shuffle(page_ids.begin(), page_ids.end(), gen);
    for (int s = 0; s < num_seqs; ++s) {
      q_indptr.push_back(q_indptr.back() + q_len);
      kv_indptr.push_back(kv_indptr.back() + pages_per_seq);
      last_len.push_back(static_cast<int32_t>(kv_len - (pages_per_seq - 1) * page_size));
    }
  }
};

struct Result {
  double ms = 0;
  std::string plan;
  std::vector<uint16_t> out;
  uint32_t err = 0;
};

double max_abs_diff(const Result& a, const Result& b) {
  double d = 0;
  for (size_t i = 0; i < a.out.size(); ++i) {
    d = std::max<double>(d, std::abs(bf16_to_f32(a.out[i]) - bf16_to_f32(b.out[i])));
  }
  return d;
}

// Both kernels' times, each with its figure (TFLOP/s or GB/s), and how far
// their outputs differ.
template <typename Figure>
void print_comparison(const std::string& name, const Result& old_r, const Result& new_r, Figure figure) {
  fmt::print("{}\n", name);
  fmt::print("  old: {:9.3f} ms  {}  [{}] err={}\n", old_r.ms, figure(old_r.ms), old_r.plan, old_r.err);
  fmt::print("  new: {:9.3f} ms  {}  [{}] err={}\n", new_r.ms, figure(new_r.ms), new_r.plan, new_r.err);
  fmt::print("  speed-up {:.2f}x, max |old - new| = {:.4g}\n", old_r.ms / new_r.ms, max_abs_diff(old_r, new_r));
}

// The batch metadata, split-KV workspace and error word of a launch over `lay`.
void attach_layout(AttentionLaunch& a, const UniformLayout& lay, int num_seqs, int64_t num_pages,
                   size_t workspace_bytes, DeviceMemory& mem) {
  a.q_indptr = mem.upload(lay.q_indptr);
  a.kv_indptr = mem.upload(lay.kv_indptr);
  a.page_ids = mem.upload(lay.page_ids);
  a.listed_pages = num_pages;
  a.last_len = mem.upload(lay.last_len);
  a.num_seqs = num_seqs;
  a.partial = mem.alloc<float>(workspace_bytes / sizeof(float));
  a.err = mem.alloc<uint32_t>(1);
}

Result run(AttentionLaunch a, const Case& c, bool allow_mma, int num_sms, size_t workspace_bytes, int reps,
           bool batch_invariant = false, int segment_keys = 0, bool prefill_shape = false) {
  AttentionHints hints;
  hints.max_q_len = c.q_len;
  hints.max_kv_len = c.kv_len;
  hints.num_sms = num_sms;
  hints.workspace_bytes = workspace_bytes;
  hints.allow_mma = allow_mma;
  hints.batch_invariant = batch_invariant;
  hints.segment_keys = segment_keys;
  plan_attention(a, hints);
  if (prefill_shape && a.kernel == AttentionKernel::MmaInvariantDecode) {
    // The mode's plan before MmaInvariantDecode: the prefill shape, whose bits it must give.
    a.kernel = AttentionKernel::MmaPrefill;
    const int64_t rows = int64_t{c.q_len} * a.group, block = attention_mma_rows(a.kernel, static_cast<int>(a.q.dim));
    a.q_blocks = static_cast<int>((rows + block - 1) / block);
  }
  const char* kind = a.kernel == AttentionKernel::Simt        ? "simt"
                     : a.kernel == AttentionKernel::MmaDecode ? "mma-decode"
                     : a.kernel == AttentionKernel::MmaInvariantDecode ? "mma-bi-decode"
                     : a.kernel == AttentionKernel::MmaLatent ? "mma-latent"
                                                              : "mma-prefill";
  Result r;
  r.plan = fmt::format("{} q_blocks={} splits={} segment={}{} smem={}KiB", kind, a.q_blocks, a.num_splits,
                       a.segment_keys, a.segment_partials ? fmt::format(" partials={}", a.num_segments) : "",
                       attention_smem_bytes(a) / 1024);
  check(cudaMemset(a.err, 0, 4), "cudaMemset");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  launch_attention(a, nullptr);  // warm-up (and the one-time shared memory attribute)
  check(cudaGetLastError(), "attention launch");
  check(cudaDeviceSynchronize(), "attention");
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start);
    launch_attention(a, nullptr);
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "attention");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    samples.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  r.ms = median(samples);
  r.out.resize(static_cast<size_t>(a.out.n * a.out.heads * a.out.dim));
  check(cudaMemcpy(r.out.data(), a.out.base, r.out.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(&r.err, a.err, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return r;
}

void bench_case(const Case& c, int num_sms, int reps, std::mt19937& gen) {
  DeviceMemory mem;
  const int64_t hq = int64_t{c.heads_kv} * c.group, d = c.dim, n = int64_t{c.num_seqs} * c.q_len;
  const int pages_per_seq = (c.kv_len + c.page_size - 1) / c.page_size;
  const int64_t num_pages = int64_t{pages_per_seq} * c.num_seqs;
  const size_t cache_elems = static_cast<size_t>(num_pages * c.page_size * c.heads_kv * d);
  uint16_t* k = mem.alloc<uint16_t>(cache_elems);
  uint16_t* v = mem.alloc<uint16_t>(cache_elems);
  uint8_t* k8 = mem.alloc<uint8_t>(cache_elems);
  uint8_t* v8 = mem.alloc<uint8_t>(cache_elems);
  fill_random(k, k8, cache_elems, gen);
  fill_random(v, v8, cache_elems, gen);
  uint16_t* q = mem.upload(random_bf16(static_cast<size_t>(n * hq * d), gen));
  // Pages in a shuffled order, as a long-running cache hands them out (or in
  // order, to see what the scattered reads cost).
  const UniformLayout lay(c.num_seqs, c.q_len, c.kv_len, pages_per_seq, c.page_size, c.shuffle_pages, gen);
  const size_t workspace_bytes = size_t{64} << 20;

  AttentionLaunch a;
  a.type = ElemType::BF16;
  a.q = HeadView{reinterpret_cast<char*>(q), n, hq, d, hq * d * 2, d * 2};
  a.out = HeadView{reinterpret_cast<char*>(mem.alloc<uint16_t>(static_cast<size_t>(n * hq * d))), n, hq, d,
                   hq * d * 2, d * 2};
  const int64_t row = c.heads_kv * d * 2;
  a.k = CacheView{reinterpret_cast<char*>(k), num_pages, c.page_size, c.heads_kv, d, c.page_size * row, row, d * 2};
  a.v = CacheView{reinterpret_cast<char*>(v), num_pages, c.page_size, c.heads_kv, d, c.page_size * row, row, d * 2};
  attach_layout(a, lay, c.num_seqs, num_pages, workspace_bytes, mem);
  a.group = c.group;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));

  Result old_r = run(a, c, false, num_sms, workspace_bytes, reps);
  Result new_r = run(a, c, true, num_sms, workspace_bytes, reps);
  const bool prefill = c.q_len > 1;
  // Causal prefill FLOPs (QK and PV, half the square); decode bytes of K and V read.
  const double flops = 4.0 * double(d) * double(hq) * double(c.q_len) * double(c.q_len) / 2.0 * c.num_seqs;
  const double bytes = 2.0 * double(c.num_seqs) * c.kv_len * c.heads_kv * d * 2;
  auto figure = [&](double ms) {
    return prefill ? fmt::format("{:7.1f} TFLOP/s", flops / (ms * 1e-3) / 1e12)
                   : fmt::format("{:7.1f} GB/s", bytes / (ms * 1e-3) / 1e9);
  };
  print_comparison(c.name, old_r, new_r, figure);

  AttentionLaunch f = a;
  f.k = CacheView{reinterpret_cast<char*>(k8), num_pages, c.page_size, c.heads_kv, d, c.page_size * row / 2, row / 2, d,
                  true};
  f.v = CacheView{reinterpret_cast<char*>(v8), num_pages, c.page_size, c.heads_kv, d, c.page_size * row / 2, row / 2, d,
                  true};
  Result fp8_r = run(f, c, true, num_sms, workspace_bytes, reps);
  // The batch-invariant plans (DEEPINFER_BATCH_INVARIANT=1): one key order
  // whatever the batch (the prefill kernel for every query count). With key
  // segments (DEEPINFER_BI_ATTENTION_SEGMENT=256) decode-shaped launches write
  // segment partials for a combine, and may split; with no workspace the same
  // launch folds in the kernel, which must give the same bits. Without
  // segments (the mode's default) nothing splits.
  const Result bi_r = run(a, c, true, num_sms, workspace_bytes, reps, true, kAttentionSegmentKeys);
  const Result bi_fold = run(a, c, true, num_sms, 0, reps, true, kAttentionSegmentKeys);
  const Result bi_noseg = run(a, c, true, num_sms, workspace_bytes, reps, true, 0);
  auto differing = [](const Result& x, const Result& y) {
    size_t count = 0;
    for (size_t i = 0; i < x.out.size(); ++i) count += x.out[i] != y.out[i];
    return count;
  };
  fmt::print("  batch-invariant, segments: {:9.3f} ms  {}  [{}] err={}; {:.2f}x the default plan's time; folded "
             "in the kernel {:.3f} ms [{}] err={}, {} of {} outputs differ; without segments (the mode's default) "
             "{:.3f} ms ({:.2f}x the default) [{}]\n",
             bi_r.ms, figure(bi_r.ms), bi_r.plan, bi_r.err, bi_r.ms / new_r.ms, bi_fold.ms, bi_fold.plan,
             bi_fold.err, differing(bi_r, bi_fold), bi_r.out.size(), bi_noseg.ms, bi_noseg.ms / new_r.ms,
             bi_noseg.plan);
  if (!prefill) {
    // Decode-shaped launches of the mode run MmaInvariantDecode: against the
    // prefill shape it replaced (same bits required), with both caches.
    const Result bi_prefill = run(a, c, true, num_sms, workspace_bytes, reps, true, 0, true);
    const Result bi_fp8 = run(f, c, true, num_sms, workspace_bytes, reps, true, 0);
    const Result bi_fp8_prefill = run(f, c, true, num_sms, workspace_bytes, reps, true, 0, true);
    fmt::print("  batch-invariant decode, bf16 cache: {:.3f} ms [{}] against the prefill shape's {:.3f} ms [{}]: "
               "{:.2f}x faster, {} of {} outputs differ\n",
               bi_noseg.ms, bi_noseg.plan, bi_prefill.ms, bi_prefill.plan, bi_prefill.ms / bi_noseg.ms,
               differing(bi_noseg, bi_prefill), bi_noseg.out.size());
    fmt::print("  batch-invariant decode, fp8 cache: {:.3f} ms ({:.2f}x the default fp8 plan) [{}] err={} against "
               "the prefill shape's {:.3f} ms: {:.2f}x faster, {} of {} outputs differ\n",
               bi_fp8.ms, bi_fp8.ms / fp8_r.ms, bi_fp8.plan, bi_fp8.err, bi_fp8_prefill.ms,
               bi_fp8_prefill.ms / bi_fp8.ms, differing(bi_fp8, bi_fp8_prefill), bi_fp8.out.size());
  }
  const std::string fp8_figure = prefill ? figure(fp8_r.ms)
                                         : fmt::format("{:7.1f} GB/s", bytes / 2 / (fp8_r.ms * 1e-3) / 1e9);
  fmt::print("  fp8: {:9.3f} ms  {}  [{}] err={}; {:.2f}x the bf16 cache, max |diff| = {:.4g}\n", fp8_r.ms,
             fp8_figure, fp8_r.plan, fp8_r.err, new_r.ms / fp8_r.ms, max_abs_diff(new_r, fp8_r));
  std::fflush(stdout);
}

// MLA (absorbed) over a latent cache: one 576-wide row per token (512 latent
// + 64 rotary channels) is the key of every query head, its first 512
// channels the value. SIMT kernel ("old") against the tensor-core latent
// kernel ("new"); decode figures are latent-row bytes read per second.
void bench_latent_case(const std::string& name, int num_seqs, int q_len, int kv_len, int heads, int num_sms, int reps,
                       std::mt19937& gen) {
  constexpr int64_t kRow = 576, kV = 512, kPage = 64;
  DeviceMemory mem;
  const int64_t n = int64_t{num_seqs} * q_len;
  const int pages_per_seq = static_cast<int>((kv_len + kPage - 1) / kPage);
  const int64_t num_pages = int64_t{pages_per_seq} * num_seqs;
  const size_t cache_elems = static_cast<size_t>(num_pages * kPage * kRow);
  uint16_t* cache = mem.alloc<uint16_t>(cache_elems);
  uint8_t* unused_fp8 = mem.alloc<uint8_t>(cache_elems);
  fill_random(cache, unused_fp8, cache_elems, gen);
  uint16_t* q = mem.upload(random_bf16(static_cast<size_t>(n * heads * kRow), gen));
  const UniformLayout lay(num_seqs, q_len, kv_len, pages_per_seq, kPage, true, gen);
  const size_t workspace_bytes = size_t{64} << 20;
  AttentionLaunch a;
  a.type = ElemType::BF16;
  a.q = HeadView{reinterpret_cast<char*>(q), n, heads, kRow, heads * kRow * 2, kRow * 2};
  a.out = HeadView{reinterpret_cast<char*>(mem.alloc<uint16_t>(static_cast<size_t>(n * heads * kV))), n, heads, kV,
                   heads * kV * 2, kV * 2};
  a.k = CacheView{reinterpret_cast<char*>(cache), num_pages, kPage, 1, kRow, kPage * kRow * 2, kRow * 2, kRow * 2};
  a.v = CacheView{reinterpret_cast<char*>(cache), num_pages, kPage, 1, kV, kPage * kRow * 2, kRow * 2, kRow * 2};
  attach_layout(a, lay, num_seqs, num_pages, workspace_bytes, mem);
  a.group = heads;
  a.scale = 1.0f / std::sqrt(192.0f);
  const Case c{name, num_seqs, q_len, kv_len, 1, heads, static_cast<int>(kRow), static_cast<int>(kPage)};
  const Result old_r = run(a, c, false, num_sms, workspace_bytes, reps);
  const Result new_r = run(a, c, true, num_sms, workspace_bytes, reps);
  const double bytes = double(num_seqs) * kv_len * kRow * 2;
  // Causal prefill FLOPs: QK (576) and PV (512) over half the square, every head.
  const double flops = 2.0 * double(kRow + kV) * heads * double(q_len) * double(q_len) / 2.0 * num_seqs;
  auto figure = [&](double ms) {
    return q_len > 1 ? fmt::format("{:7.1f} TFLOP/s", flops / (ms * 1e-3) / 1e12)
                     : fmt::format("{:7.1f} GB/s", bytes / (ms * 1e-3) / 1e9);
  };
  print_comparison(name, old_r, new_r, figure);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fmt::print("no CUDA\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  fmt::print("{} ({} SMs), bf16, median of {} runs\n", prop.name, prop.multiProcessorCount, reps);
  std::mt19937 gen(7);
  const std::vector<Case> cases = {
      {"prefill 1 x 8192 causal, 32 q / 8 kv heads, d 128, page 16", 1, 8192, 8192, 8, 4, 128, 16},
      {"decode 256 x 1500, 8 kv heads, group 4, d 128, page 16", 256, 1, 1500, 8, 4, 128, 16},
      {"decode 256 x 1500, same, pages in order", 256, 1, 1500, 8, 4, 128, 16, false},
      {"decode 4 x 32768 (split-KV), 8 kv heads, group 4, d 128, page 16", 4, 1, 32768, 8, 4, 128, 16},
      {"prefill 4 x 2048 causal, 32 q / 8 kv heads, d 128, page 16", 4, 2048, 2048, 8, 4, 128, 16},
      // The decode shapes of scripts/gpu_batch_invariance.py's cost runs (512 + 128 tokens).
      {"decode 1 x 640, 8 kv heads, group 4, d 128, page 16", 1, 1, 640, 8, 4, 128, 16},
      {"decode 64 x 640, 8 kv heads, group 4, d 128, page 16", 64, 1, 640, 8, 4, 128, 16},
      {"decode 256 x 640, 8 kv heads, group 4, d 128, page 16", 256, 1, 640, 8, 4, 128, 16},
      // The MoE slice of the cost runs (Qwen3-30B-A3B: 4 kv heads, group 8), and 256-wide heads (Gemma 3).
      {"decode 1 x 640, 4 kv heads, group 8, d 128, page 16", 1, 1, 640, 4, 8, 128, 16},
      {"decode 64 x 640, 1 kv head, group 4, d 256, page 16", 64, 1, 640, 1, 4, 256, 16},
      {"decode 256 x 640, 1 kv head, group 4, d 256, page 16", 256, 1, 640, 1, 4, 256, 16},
  };
  // BENCH_ATTENTION_CASES: only the cases whose names contain it (a profiler's run).
  const char* only = std::getenv("BENCH_ATTENTION_CASES");
  for (const Case& c : cases) {
    if (only == nullptr || c.name.find(only) != std::string::npos) bench_case(c, prop.multiProcessorCount, reps, gen);
  }
  if (only != nullptr) return 0;
  const int sms = prop.multiProcessorCount;
  bench_latent_case("latent decode 1 x 160, 16 heads (DeepSeek-V2-Lite, batch 1)", 1, 1, 160, 16, sms, reps, gen);
  bench_latent_case("latent decode 256 x 190, 16 heads (batch 256)", 256, 1, 190, 16, sms, reps, gen);
  bench_latent_case("latent decode 4 x 8192, 16 heads (split-KV)", 4, 1, 8192, 16, sms, reps, gen);
  bench_latent_case("latent decode 32 x 2048, 128 heads (DeepSeek-V3)", 32, 1, 2048, 128, sms, reps, gen);
  bench_latent_case("latent prefill 64 x 128 causal, 16 heads", 64, 128, 128, 16, sms, reps, gen);
  return 0;
}

#else

int main() {
  std::printf("no CUDA\n");
  return 0;
}

#endif
