// Helpers shared by the CUDA micro-benchmarks (bench/*_cuda.cpp, bench/*.cu):
// exit on a CUDA error, and the median time of a launch issued back to back.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace deepinfer::bench {

inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// Milliseconds per launch: the median over `reps` samples of kLaunches
// launches back to back (as a decode step issues them; one launch between
// two events would add the events' own few microseconds to each).
template <typename F>
double median_launch_ms(int reps, cudaStream_t s, F&& launch) {
  constexpr int kLaunches = 10;
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, s), "record");
    for (int l = 0; l < kLaunches; ++l) launch();
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms / kLaunches);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

template <typename F>
double median_launch_us(int reps, cudaStream_t s, F&& launch) {
  return 1000.0 * median_launch_ms(reps, s, launch);
}

}  // namespace deepinfer::bench
