// CPU op micro-benchmarks: decode-shaped linear (weight-bandwidth bound, so
// reported as GB/s of weights read) and the gemv/gemm crossover in n.
// Usage: bench_ops [threads=2]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/half.h"
#include "ops/ops.h"

using namespace deepinfer;

namespace {

// Random codes with small finite f16 scales at the block's leading fields.
std::vector<uint8_t> random_weights(DType dtype, int64_t m, int64_t k, std::mt19937& gen) {
  std::vector<uint8_t> bytes(row_bytes(dtype, k) * static_cast<size_t>(m));
  for (auto& b : bytes) b = static_cast<uint8_t>(gen());
  if (is_quantized(dtype)) {
    int scale_fields = dtype == DType::Q4_1 || dtype == DType::Q5_1 ? 2 : 1;
    size_t block = static_cast<size_t>(dtype_info(dtype).block_bytes);
    for (size_t off = 0; off < bytes.size(); off += block) {
      for (int f = 0; f < scale_fields; ++f) {
        uint16_t h = f32_to_f16(0.01f);
        std::memcpy(bytes.data() + off + 2 * f, &h, 2);
      }
    }
  } else if (dtype == DType::F32) {
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (size_t i = 0; i < bytes.size() / 4; ++i) f[i] = 0.01f * static_cast<float>(static_cast<int>(gen() % 200) - 100);
  }
  return bytes;
}

double median_us(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double time_linear(Backend& backend, const Tensor& x, const Tensor& w, Tensor out, int reps) {
  ops::linear(backend, x, w, Tensor(), out);  // warm-up: scratch growth, page faults
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    ops::linear(backend, x, w, Tensor(), out);
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_us(samples);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  BackendOptions options;
  options.num_threads = threads;
  auto backend = create_backend(DeviceType::CPU, options);
  std::mt19937 gen(42);
  fmt::print("CPU backend, {} threads; median of repeated calls\n", threads);

  struct Shape {
    DType dtype;
    int64_t m, k;
  };
  for (Shape s : {Shape{DType::Q4_1, 1536, 576}, Shape{DType::Q4_1, 576, 1536}, Shape{DType::Q8_0, 49152, 576},
                  Shape{DType::F32, 1536, 576}}) {
    std::vector<uint8_t> wbytes = random_weights(s.dtype, s.m, s.k, gen);
    Tensor w(wbytes.data(), s.dtype, {s.m, s.k});
    fmt::print("\nW {}[{}, {}] ({:.2f} MB)\n", dtype_name(s.dtype), s.m, s.k, static_cast<double>(wbytes.size()) / 1e6);
    fmt::print("{:>4} {:>10} {:>10} {:>12}\n", "n", "us", "GB/s(W)", "GFLOP/s");
    for (int64_t n : {1, 2, 4, 5, 8, 16, 64}) {
      std::vector<float> xs(static_cast<size_t>(n * s.k), 0.5f), os(static_cast<size_t>(n * s.m));
      Tensor x(xs.data(), DType::F32, {n, s.k});
      Tensor out(os.data(), DType::F32, {n, s.m});
      int reps = s.m * s.k * n > 50'000'000 ? 5 : 30;
      double us = time_linear(*backend, x, w, out, reps);
      fmt::print("{:>4} {:>10.1f} {:>10.2f} {:>12.2f}\n", n, us, static_cast<double>(wbytes.size()) / us / 1e3,
                 2.0 * static_cast<double>(n * s.m * s.k) / us / 1e3);
    }
  }
  fmt::print("\ngemv is used for n <= {} ({} for the block formats where AMX tiles take the rest)\n",
             cpu::CpuBackend::kLinearGemvMaxRows, cpu::CpuBackend::kLinearGemvMaxRowsAmx);
  return 0;
}
