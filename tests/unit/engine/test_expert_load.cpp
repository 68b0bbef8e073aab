// Live expert-load statistics (--eplb-ep-size, --routing-trace) on tiny random
// MoE checkpoints: the recorded counts hold top_k choices per processed token
// in every MoE layer and step (an exact per-step sequence for one chunked
// request; totals for a mixed batch), two runs record the same trace, the
// exported moe_lb matches the trace, the simulator reads the trace, and
// generation is unchanged with the statistics on. On a GPU the same runs use
// CUDA graphs for decode, whose padding rows must not be counted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "moe/eplb_simulator.h"
#include "moe/expert_load_monitor.h"
#include "../../support/greedy_reference.h"

using deepinfer::testing::greedy_params;

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kData = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";

struct Case {
  const char* model;
  std::vector<int32_t> moe_layers;
  int32_t experts;
  int32_t top_k;
};

const Case kMixtral{"mixtral", {0, 1}, 8, 2};
const Case kDeepseekV3{"deepseek_v3", {1, 2}, 16, 4};  // first_k_dense_replace = 1
const Case kQwen3MoeBf16{"qwen3_moe_bf16_fused", {0, 1}, 8, 3};

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("deepinfer_expert_load_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

EngineConfig config(const Case& c, DeviceType device) {
  EngineConfig e;
  e.model_path = (kData / c.model).string();
  e.tokenizer_path = (kData / "tokenizer.json").string();
  e.device = device;
  e.max_model_len = 128;
  e.max_num_seqs = 8;
  e.max_num_batched_tokens = 16;  // prompts arrive in chunks
  e.kv_cache_tokens = 2048;
  e.enable_prefix_caching = false;  // every prompt token is computed, so the totals are exact
  e.batch_invariant = true;
  return e;
}

std::vector<int32_t> prompt(int32_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back((i * 37 + salt * 101 + 11) % 300 + 3);
  return p;
}

struct Run {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  EngineStats stats;
  int64_t processed_tokens = 0;  // prompt tokens + every generated token but the last of each request
};

// Requests of the given prompt lengths, all added up front, run to completion.
Run run(const EngineConfig& cfg, const std::vector<int32_t>& prompt_lens, int32_t max_tokens) {
  Engine engine(cfg);
  Run r;
  for (size_t i = 0; i < prompt_lens.size(); ++i) {
    engine.add_request(prompt(prompt_lens[i], static_cast<int32_t>(i)), greedy_params(max_tokens));
    r.processed_tokens += prompt_lens[i] + max_tokens - 1;
  }
  while (engine.has_unfinished()) {
    for (const RequestOutput& o : engine.step()) {
      for (const TokenOutput& t : o.new_tokens) r.tokens[o.request_id].push_back(t.token);
    }
  }
  engine.check_integrity();
  r.stats = engine.stats();
  return r;
}

std::vector<int64_t> step_totals(const moe::RoutingTrace& t) {
  std::vector<int64_t> totals;
  for (int64_t s = 0; s < t.num_steps(); ++s) {
    const auto row = t.step(s);
    totals.push_back(std::accumulate(row.begin(), row.end(), int64_t{0}));
  }
  return totals;
}

// One request of 37 prompt tokens in chunks of 16, then 6 decode steps:
// per-step tokens 16, 16, 5, 1 x 6 (the 7th token is sampled, never fed).
void check_exact_steps(const Case& c, DeviceType device, const TempDir& dir) {
  EngineConfig cfg = config(c, device);
  cfg.routing_trace_path = dir.file(std::string(c.model) + "_single.csv");
  const Run r = run(cfg, {37}, 7);
  std::vector<int64_t> want = {16, 16, 5, 1, 1, 1, 1, 1, 1};
  for (int64_t& w : want) w *= c.top_k;
  for (int32_t layer : c.moe_layers) {
    const moe::RoutingTrace t =
        moe::read_routing_trace(moe::ExpertLoadMonitor::trace_file(cfg.routing_trace_path, layer));
    EXPECT_EQ(t.num_experts, c.experts);
    EXPECT_EQ(step_totals(t), want) << c.model << " layer " << layer;
  }
  EXPECT_EQ(r.stats.steps, static_cast<int64_t>(want.size()));
}

void check_mixed_batch(const Case& c, DeviceType device, const TempDir& dir) {
  const std::vector<int32_t> lens = {5, 23, 12, 40, 3};
  const int32_t max_tokens = 9;
  const Run plain = run(config(c, device), lens, max_tokens);
  EXPECT_FALSE(plain.stats.eplb);

  EngineConfig cfg = config(c, device);
  cfg.eplb_ep_size = 4;
  cfg.eplb_window_steps = 6;
  cfg.eplb_interval_steps = 5;
  cfg.eplb_redundant_slots = 1;
  const std::string trace_a = dir.file(std::string(c.model) + "_a.csv");
  const std::string trace_b = dir.file(std::string(c.model) + "_b");  // no .csv: the suffix is added
  cfg.routing_trace_path = trace_a;
  const Run a = run(cfg, lens, max_tokens);
  cfg.routing_trace_path = trace_b;
  const Run b = run(cfg, lens, max_tokens);

  EXPECT_EQ(a.tokens, plain.tokens) << "statistics changed the generated tokens";
  EXPECT_EQ(b.tokens, plain.tokens);
  const int64_t steps = a.stats.steps;
  ASSERT_GT(steps, 10);
  EXPECT_TRUE(a.stats.eplb);
  EXPECT_EQ(a.stats.eplb_replacements, steps / 5);

  double lb_contiguous = 0.0;
  for (int32_t layer : c.moe_layers) {
    SCOPED_TRACE(::testing::Message() << c.model << " layer " << layer);
    const moe::RoutingTrace ta = moe::read_routing_trace(moe::ExpertLoadMonitor::trace_file(trace_a, layer));
    const moe::RoutingTrace tb = moe::read_routing_trace(moe::ExpertLoadMonitor::trace_file(trace_b, layer));
    EXPECT_EQ(ta.counts, tb.counts) << "two identical runs recorded different routing";
    ASSERT_EQ(ta.num_steps(), steps);
    const std::vector<int64_t> totals = step_totals(ta);
    for (int64_t s = 0; s < steps; ++s) {
      EXPECT_EQ(totals[s] % c.top_k, 0) << "step " << s;
      EXPECT_GT(totals[s], 0) << "step " << s;
      EXPECT_LE(totals[s], int64_t{16} * c.top_k) << "step " << s;
    }
    EXPECT_EQ(std::accumulate(totals.begin(), totals.end(), int64_t{0}), a.processed_tokens * c.top_k);
    // The exported baseline is moe_lb of the last window's load, placed contiguously.
    std::vector<double> window(c.experts, 0.0);
    for (int64_t s = steps - 6; s < steps; ++s) {
      for (int32_t e = 0; e < c.experts; ++e) window[e] += static_cast<double>(ta.step(s)[e]);
    }
    lb_contiguous += moe::moe_lb(window, moe::contiguous_placement(c.experts, 4));
    // The trace replays in the simulator (what `deepinfer eplb-sim --trace` runs).
    moe::SimulationOptions so;
    so.num_ranks = 2;
    so.schedule = {4, 4, 1};
    EXPECT_GE(moe::simulate_eplb(ta, so).replacements, 1);
  }
  EXPECT_NEAR(a.stats.moe_lb_contiguous, lb_contiguous / static_cast<double>(c.moe_layers.size()), 1e-9);
  EXPECT_GE(a.stats.moe_lb, 1.0);
  EXPECT_LE(a.stats.moe_lb, 4.0);
  EXPECT_EQ(a.stats.moe_lb, b.stats.moe_lb);
}

TEST(ExpertLoad, MixtralCountsEveryRoutedToken) {
  TempDir dir;
  check_exact_steps(kMixtral, DeviceType::CPU, dir);
  check_mixed_batch(kMixtral, DeviceType::CPU, dir);
}

TEST(ExpertLoad, DeepseekV3CountsOnlyItsMoeLayers) {
  TempDir dir;
  check_exact_steps(kDeepseekV3, DeviceType::CPU, dir);
  check_mixed_batch(kDeepseekV3, DeviceType::CPU, dir);
}

TEST(ExpertLoad, CudaGraphPaddingRowsAreNotCounted) {
  try {
    create_backend(DeviceType::CUDA);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend: " << e.what();
  }
  TempDir dir;
  // 5 requests decode as a padded graph batch of 8; 1 request as a batch of 1.
  check_exact_steps(kQwen3MoeBf16, DeviceType::CUDA, dir);
  check_mixed_batch(kQwen3MoeBf16, DeviceType::CUDA, dir);
}

TEST(ExpertLoad, RejectsDenseModelsAndBadEpSizes) {
  auto error_of = [](const EngineConfig& c) -> std::string {
    try {
      Engine e(c);
    } catch (const Error& err) {
      return err.what();
    }
    return "no error";
  };
  EngineConfig dense = config(kMixtral, DeviceType::CPU);
  dense.model_path = (kData / "llama").string();
  dense.eplb_ep_size = 2;
  EXPECT_THAT(error_of(dense), HasSubstr("need a mixture-of-experts model"));
  EngineConfig odd = config(kMixtral, DeviceType::CPU);
  odd.eplb_ep_size = 3;
  EXPECT_THAT(error_of(odd), HasSubstr("--eplb-ep-size 3 must divide the model's 8 experts"));
}

}  // namespace
}  // namespace deepinfer
