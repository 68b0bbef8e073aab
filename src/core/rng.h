// Counter-based random numbers for sampling.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a pure function of (key, counter), so the number used for a token
// depends only on the request's seed and the token's position, never on
// which other requests share the batch or on call order. The same generator
// is what cuRAND and PyTorch use on GPUs, so a device sampler can reproduce
// these streams exactly.
//
// Header-only and usable in CUDA device code (the CUDA sampler draws the same
// numbers as the CPU one): every function is DI_HOST_DEVICE constexpr.
#pragma once

#include <array>
#include <cstdint>

#if defined(__CUDACC__)
#define DI_HOST_DEVICE __host__ __device__
#else
#define DI_HOST_DEVICE
#endif

namespace deepinfer::rng {

using Philox4x32 = std::array<uint32_t, 4>;

DI_HOST_DEVICE constexpr Philox4x32 philox4x32_10(Philox4x32 counter, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u;
  constexpr uint32_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * counter[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * counter[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32);
    const auto lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32);
    const auto lo1 = static_cast<uint32_t>(p1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// 64 random bits for (seed, position, stream); stream separates independent
// draws at the same position (e.g. several per token in speculative decoding).
DI_HOST_DEVICE constexpr uint64_t random_u64(uint64_t seed, uint64_t position, uint32_t stream = 0) {
  const Philox4x32 out = philox4x32_10(
      {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), stream, 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return (static_cast<uint64_t>(out[0]) << 32) | out[1];
}

// Uniform double in [0, 1) with 53 random bits.
DI_HOST_DEVICE constexpr double uniform01(uint64_t seed, uint64_t position, uint32_t stream = 0) {
  return static_cast<double>(random_u64(seed, position, stream) >> 11) * 0x1.0p-53;
}

// A well-mixed seed for child `index` of a request (the n > 1 samples of one
// prompt must not share a stream) or for a request id when no seed is given.
DI_HOST_DEVICE constexpr uint64_t derive_seed(uint64_t base, uint64_t index) {
  uint64_t x = base ^ (index * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace deepinfer::rng
