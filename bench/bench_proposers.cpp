// Host cost of drafting: time per proposal (and per appended token) of the
// n-gram and suffix proposers for many concurrent requests, each with a
// prompt and a growing output drawn from a small vocabulary with repeats (so
// matches exist). This is work a drafting step adds between device steps:
// on the engine thread, then spread over a pool as the engine's Speculator
// does for large batches.
//   bench_proposers [requests=256] [prompt=1024] [steps=128] [threads=half the cores, 2-4]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "spec/proposer.h"

using namespace deepinfer::spec;

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 256;
  const int prompt_len = argc > 2 ? std::atoi(argv[2]) : 1024;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 128;
  const int pool_threads = argc > 4 ? std::atoi(argv[4])
                                    : static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 2u, 4u));
  for (SpecMethod method : {SpecMethod::Ngram, SpecMethod::Suffix}) {
    // threads > 1: appends and proposals spread over a pool, as the engine's
    // Speculator does for a large batch (same grain and chunk). threads 0: a
    // first serial run, not shown: the later runs reuse the memory it freed
    // (the first run's page faults made it ~1.6x slower).
    for (int threads : {0, 1, pool_threads}) {
      SpeculativeConfig config;
      config.method = method;
      if (std::getenv("NO_GLOBAL")) config.suffix_global_max_tokens = 0;
      auto proposer = make_proposer(config);
      std::unique_ptr<deepinfer::cpu::ThreadPool> pool;
      if (threads > 1) pool = std::make_unique<deepinfer::cpu::ThreadPool>(threads);
      auto for_each_request = [&](auto&& fn) {
        auto range = [&](int64_t b, int64_t e, int) {
          for (int64_t r = b; r < e; ++r) fn(static_cast<int>(r));
        };
        if (pool) pool->parallel_for(requests, range, /*grain=*/4, /*chunk=*/4);
        else range(0, requests, 0);
      };
      std::mt19937 rng(7);
      // Text that repeats phrases: 64 phrases of 8 tokens from a 4k vocabulary.
      std::vector<std::vector<int32_t>> phrases(64, std::vector<int32_t>(8));
      for (auto& p : phrases) {
        for (auto& t : p) t = static_cast<int32_t>(rng() % 4096);
      }
      // Each request draws its text from its own generator (the pool runs requests in any order).
      std::vector<std::mt19937> request_rng;
      for (int r = 0; r < requests; ++r) request_rng.emplace_back(1000 + r);
      auto next_chunk = [&](int r) { return phrases[request_rng[static_cast<size_t>(r)]() % phrases.size()]; };
      for (int r = 0; r < requests; ++r) {
        std::vector<int32_t> prompt;
        while (static_cast<int>(prompt.size()) < prompt_len) {
          auto c = next_chunk(r);
          prompt.insert(prompt.end(), c.begin(), c.end());
        }
        proposer->start(static_cast<uint64_t>(r), prompt);
      }
      std::vector<Draft> drafts(static_cast<size_t>(requests));
      int64_t drafted = 0;
      double propose_s = 0, append_s = 0;
      std::vector<std::vector<int32_t>> pending(static_cast<size_t>(requests));
      for (int s = 0; s < steps; ++s) {
        auto t0 = std::chrono::steady_clock::now();
        for_each_request([&](int r) {
          proposer->propose(static_cast<uint64_t>(r), 5, drafts[static_cast<size_t>(r)]);
        });
        for (const Draft& d : drafts) drafted += d.size();
        auto t1 = std::chrono::steady_clock::now();
        for_each_request([&](int r) {
          auto& p = pending[static_cast<size_t>(r)];
          if (p.empty()) p = next_chunk(r);
          proposer->append(static_cast<uint64_t>(r), std::span<const int32_t>(p.data(), 1));
          p.erase(p.begin());
        });
        auto t2 = std::chrono::steady_clock::now();
        propose_s += std::chrono::duration<double>(t1 - t0).count();
        append_s += std::chrono::duration<double>(t2 - t1).count();
      }
      const auto f0 = std::chrono::steady_clock::now();
      for (int r = 0; r < requests; ++r) proposer->finish(static_cast<uint64_t>(r));
      const double finish_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
      if (threads == 0) continue;
      std::printf("%-6s %d requests x %d-token prompts, %d thread(s): propose %.2f us, append %.2f us per request "
                  "and step (%.2f ms per step of all requests); %.2f drafts per proposal; finishing all %.1f ms\n",
                  std::string(to_string(method)).c_str(), requests, prompt_len, threads,
                  propose_s / steps / requests * 1e6, append_s / steps / requests * 1e6,
                  (propose_s + append_s) / steps * 1e3,
                  static_cast<double>(drafted) / (static_cast<double>(steps) * requests), finish_s * 1e3);
    }
  }
}
