// Single-thread matrix-vector throughput of the CPU quantisation kernels, in
// GB/s of weight bytes read, for every instruction-set level this machine runs
// (scalar = the portable kernels), next to the machine's streaming-read and
// memcpy bandwidth measured in the same run. The weight matrix of each dtype
// is sized to the given size (by default well beyond most last-level caches),
// so a kernel that keeps up with memory reaches the streaming-read figure; a
// small size (1 MiB) measures the kernels' arithmetic instead. Times are the
// thread's CPU time, so that other load on a shared machine (preemption) does
// not count; on an idle machine they equal wall time.
//   bench_quants [weight MiB = 128] [repetitions = 5] [dtypes, e.g. q4_0,q4_K = all]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/quants.h"
#include "core/half.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using namespace deepinfer;

constexpr int64_t kCols = 4096;

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <typename F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_seconds();
    f();
    t.push_back(thread_seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Sums the buffer as floats, so every byte is loaded once.
float stream_read(const float* p, size_t n) {
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
#else
  float s[4] = {};
  for (size_t i = 0; i + 4 <= n; i += 4)
    for (int u = 0; u < 4; ++u) s[u] += p[i + u];
  return s[0] + s[1] + s[2] + s[3];
#endif
}

// Offsets of the f16 scale fields in one block; random bytes there could be
// NaN or huge, which would not change the speed but makes the sums meaningless.
std::vector<int> scale_offsets(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: return {0};
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q6_K: return {208};
    default: return {};
  }
}

void fill_weights(DType t, uint8_t* w, size_t bytes, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  if (t == DType::F32) {
    auto* f = reinterpret_cast<float*>(w);
    for (size_t i = 0; i < bytes / 4; ++i) f[i] = normal(rng);
    return;
  }
  if (t == DType::F16 || t == DType::BF16) {
    auto* h = reinterpret_cast<uint16_t*>(w);
    for (size_t i = 0; i < bytes / 2; ++i) h[i] = t == DType::F16 ? f32_to_f16(normal(rng)) : f32_to_bf16(normal(rng));
    return;
  }
  for (size_t i = 0; i < bytes; ++i) w[i] = static_cast<uint8_t>(byte(rng));
  if (t == DType::F8E4M3_B64) {  // an f32 scale per block, codes without NaN
    const float scale = 0.01f;
    for (size_t b = 0; b + 132 <= bytes; b += 132) {
      std::memcpy(w + b, &scale, 4);
      for (size_t i = 4; i < 132; ++i) w[b + i] &= 0xf7;  // clears the low exponent bit: never 0x7f
    }
    return;
  }
  const size_t block_bytes = dtype_info(t).block_bytes;
  const uint16_t scale = f32_to_f16(0.01f);
  for (size_t b = 0; b + block_bytes <= bytes; b += block_bytes) {
    for (int off : scale_offsets(t)) std::memcpy(w + b + off, &scale, 2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t weight_bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 128) << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string only = argc > 3 ? "," + std::string(argv[3]) + "," : "";
  std::mt19937 rng(7);

  std::vector<uint8_t> weights(weight_bytes), copy(weight_bytes);
  std::memset(weights.data(), 1, weight_bytes);
  std::memset(copy.data(), 0, weight_bytes);
  volatile float sink = 0;
  const double t_read = median_seconds(reps, [&] {
    sink = sink + stream_read(reinterpret_cast<const float*>(weights.data()), weight_bytes / 4);
  });
  const double t_copy = median_seconds(reps, [&] { std::memcpy(copy.data(), weights.data(), weight_bytes); });
  const double read_gbs = weight_bytes / t_read / 1e9;
  std::printf("buffer %zu MiB, %d repetitions (scalar: 1), median of thread CPU time; single thread\n",
              weight_bytes >> 20, reps);
  std::printf("streaming read (AVX2 sum): %6.2f GB/s\n", read_gbs);
  std::printf("memcpy                   : %6.2f GB/s read (%.2f GB/s read+write)\n",
              weight_bytes / t_copy / 1e9, 2 * weight_bytes / t_copy / 1e9);

  // Every level this machine runs, widest first; the first is compared with
  // the streaming read and times the activation quantiser.
  std::vector<cpu::CpuIsa> levels;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::Avx512, cpu::CpuIsa::Avx2, cpu::CpuIsa::Scalar}) {
    if (cpu::isa_available(isa)) levels.push_back(isa);
  }
  std::printf("\n%-12s %6s %8s", "dtype", "act", "rows");
  for (cpu::CpuIsa isa : levels) std::printf(" %8s", std::string(cpu::isa_name(isa)).c_str());
  std::printf(" %8s %10s\n%-12s %6s %8s", "of read", "quant act", "", "", "");
  for (size_t l = 0; l < levels.size(); ++l) std::printf(" %8s", "GB/s");
  std::printf(" %8s %10s\n", "", "us");

  std::vector<float> x(kCols), out;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> act(row_bytes(DType::F32, kCols));
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                         DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                         DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F8E4M3_B64};
  for (DType t : types) {
    if (!only.empty() && only.find("," + std::string(dtype_name(t)) + ",") == std::string::npos) continue;
    const size_t rb = row_bytes(t, kCols);
    const int64_t rows = static_cast<int64_t>(weight_bytes / rb);
    const size_t used = rows * rb;
    fill_weights(t, weights.data(), used, rng);
    out.assign(rows, 0.0f);
    std::vector<double> gbs;
    double quant_us = 0;
    for (size_t l = 0; l < levels.size(); ++l) {
      const cpu::QuantKernels& k = cpu::quant_kernels_for(t, levels[l]);
      auto matvec = [&] {
        const void* a = x.data();
        if (k.quantize_act) {
          k.quantize_act(x.data(), act.data(), kCols);
          a = act.data();
        }
        for (int64_t r = 0; r < rows; ++r) out[r] = k.dot(weights.data() + r * rb, a, kCols);
      };
      gbs.push_back(used / median_seconds(levels[l] == cpu::CpuIsa::Scalar ? 1 : reps, matvec) / 1e9);
      if (l == 0 && k.quantize_act) {
        quant_us = 1e6 * median_seconds(reps, [&] {
          for (int i = 0; i < 100; ++i) k.quantize_act(x.data(), act.data(), kCols);
        }) / 100;
      }
      sink = sink + out[rows / 2];
    }
    std::printf("%-12s %6s %8lld", std::string(dtype_name(t)).c_str(),
                std::string(dtype_name(cpu::quant_kernels_for(t, levels[0]).act)).c_str(),
                static_cast<long long>(rows));
    for (double g : gbs) std::printf(" %8.2f", g);
    std::printf(" %7.0f%% %10.2f\n", 100 * gbs[0] / read_gbs, quant_us);
  }
  return 0;
}
