// Tensor parallelism on the CPU: the shard plan, the sliced weights, and
// whole models split over 2 and 4 ranks (threads here, each with its own
// backend, model slice, KV cache and runner, joined by a Gloo group) giving
// the logits and greedy tokens of one rank.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/backend.h"
#include "dist/gloo_communicator.h"
#include "kv/kv_storage.h"
#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "moe/eplb.h"
#include "runner/model_runner.h"
#include "../../support/prompt_logits.h"
#include "../../support/smollm2_model.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
const fs::path kTiny = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";

TEST(SplitRange, EvenAndUnevenInWholeUnits) {
  EXPECT_EQ(split_range(8, 2, 0, 1), (IndexRange{0, 4}));
  EXPECT_EQ(split_range(8, 2, 1, 1), (IndexRange{4, 8}));
  // 6 units of 256 over 4 parts: 2, 2, 1, 1.
  EXPECT_EQ(split_range(1536, 4, 0, 256), (IndexRange{0, 512}));
  EXPECT_EQ(split_range(1536, 4, 1, 256), (IndexRange{512, 1024}));
  EXPECT_EQ(split_range(1536, 4, 2, 256), (IndexRange{1024, 1280}));
  EXPECT_EQ(split_range(1536, 4, 3, 256), (IndexRange{1280, 1536}));
  EXPECT_THROW(split_range(100, 2, 0, 32), Error);
}

ModelConfig gqa_config(int32_t heads_q, int32_t heads_kv) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.n_layers = 1;
  c.n_heads_q = heads_q;
  c.n_heads_kv = heads_kv;
  c.head_dim = 16;
  c.intermediate_size = 96;
  return c;
}

TEST(TpShardPlan, WholeKvGroupsWhileThereAreEnoughKvHeads) {
  // SmolLM2's 9 query heads over 3 KV heads (groups of 3), 2 ranks: whole
  // groups, so no KV head is replicated.
  const ModelConfig c = gqa_config(9, 3);
  const TpShardPlan r0 = TpShardPlan::make(c, 0, 2, 1), r1 = TpShardPlan::make(c, 1, 2, 1);
  EXPECT_EQ(r0.q_heads, (IndexRange{0, 6}));
  EXPECT_EQ(r0.kv_heads, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r1.q_heads, (IndexRange{6, 9}));
  EXPECT_EQ(r1.kv_heads, (std::vector<int32_t>{2}));
  EXPECT_EQ(r0.ffn.size() + r1.ffn.size(), 96);
  EXPECT_EQ(r0.vocab, (IndexRange{0, 500}));
  EXPECT_EQ(r1.vocab, (IndexRange{500, 1000}));
  const ModelConfig l0 = r0.local_config(c);
  EXPECT_EQ(l0.n_heads_q, 6);
  EXPECT_EQ(l0.n_heads_kv, 2);
  EXPECT_EQ(l0.vocab_size, 1000);
}

TEST(TpShardPlan, FewerKvHeadsThanRanksReplicatesThem) {
  // 9 query heads over 3 KV heads on 4 ranks: 3, 2, 2, 2 query heads.
  const ModelConfig c = gqa_config(9, 3);
  std::vector<TpShardPlan> p;
  for (int r = 0; r < 4; ++r) p.push_back(TpShardPlan::make(c, r, 4, 1));
  EXPECT_EQ(p[0].kv_heads, (std::vector<int32_t>{0}));     // heads 0-2: one whole group
  EXPECT_EQ(p[1].kv_heads, (std::vector<int32_t>{1}));     // heads 3-4: part of group 1
  EXPECT_EQ(p[2].kv_heads, (std::vector<int32_t>{1, 2}));  // heads 5, 6 straddle groups 1 and 2: one copy each
  EXPECT_EQ(p[3].kv_heads, (std::vector<int32_t>{2}));     // heads 7-8
  for (const TpShardPlan& s : p) {
    const ModelConfig l = s.local_config(c);
    EXPECT_EQ(l.n_heads_q % l.n_heads_kv, 0);
  }
  EXPECT_THROW(TpShardPlan::make(gqa_config(2, 1), 0, 4, 1), Error);  // fewer heads than ranks
  EXPECT_THROW(TpShardPlan::make(gqa_config(8, 8), 0, 4, 64), Error); // width 96 not in 64-column blocks x 4
}

// A WeightSource over tensors in memory.
class MapSource final : public WeightSource {
 public:
  Tensor add(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float>& v = data_[name];
    v.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
    return tensors_[name] = Tensor(v.data(), DType::F32, shape);
  }
  std::optional<Tensor> find(std::string_view name) const override {
    auto it = tensors_.find(std::string(name));
    if (it == tensors_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, std::vector<float>> data_;
  std::map<std::string, Tensor> tensors_;
};

TEST(ShardedWeightSource, CutsRowsColumnsAndExpertWidths) {
  const ModelConfig c = gqa_config(4, 2);
  MapSource src;
  src.add("blk.0.attn_k.weight", {2 * 16, 8});
  src.add("blk.0.attn_output.weight", {3, 4 * 16});
  src.add("blk.0.ffn_down_exps.weight", {2, 3, 96});
  src.add("blk.0.attn_output.bias", {3});
  src.add("blk.0.attn_norm.weight", {5});
  TpShardPlan plan = TpShardPlan::make(c, 1, 2, 1);  // q heads 2-3, kv head 1, ffn [48, 96)
  plan.expert_ffn = {48, 96};
  ShardedWeightSource s(src, plan, HeadSizes{16, 16, 16});

  const Tensor k = s.get("blk.0.attn_k.weight");  // rows of KV head 1: a view of the file
  ASSERT_EQ(k.size(0), 16);
  EXPECT_EQ(k.data_as<float>()[0], 16 * 8);
  const Tensor o = s.get("blk.0.attn_output.weight");  // columns [32, 64)
  ASSERT_EQ(o.size(1), 32);
  EXPECT_EQ(o.data_as<float>()[0], 32);
  EXPECT_EQ(o.data_as<float>()[32], 64 + 32);
  const Tensor d = s.get("blk.0.ffn_down_exps.weight");  // [2, 3, 48]: columns [48, 96) of every row
  ASSERT_EQ(d.size(2), 48);
  EXPECT_EQ(d.data_as<float>()[0], 48);
  EXPECT_EQ(d.data_as<float>()[48 * 3], 3 * 96 + 48);  // expert 1, row 0
  const Tensor b = s.get("blk.0.attn_output.bias");  // added once, by rank 0
  EXPECT_EQ(b.data_as<float>()[2], 0.0f);
  EXPECT_EQ(s.get("blk.0.attn_norm.weight").data_as<float>()[4], 4.0f);
}

struct GroupResult {
  std::vector<std::vector<float>> logits;  // rank 0's, after the gather: the prompt's, then each decode step's
  std::vector<int32_t> tokens;             // greedy, sampled by rank 0
};

struct GroupOptions {
  bool expert_parallel = false;
  bool batch_invariant = false;
  WeightQuantization quantization = WeightQuantization::None;
  // Before decode step `replace_at` (>= 1), every rank moves every MoE
  // layer's experts to replacement(layer) (expert parallelism).
  int replace_at = -1;
  std::function<moe::ExpertPlacement(size_t layer, int32_t experts)> replacement;
};

// Runs a prompt and `steps` greedy decode steps on each of prompts.size()
// data-parallel ranks, each a tensor-parallel group of `size` ranks (threads;
// global rank g is rank g % size of group g / size). Decode inputs are the
// previous step's device-sampled token, so every rank must have received its
// group's first rank's tokens. With expert parallelism over several groups
// the experts spread over all their ranks (model/expert_parallel.h); every
// group runs the same number of steps, so their collectives meet.
std::vector<GroupResult> run_groups(const std::string& path, int size, const std::vector<std::vector<int32_t>>& prompts,
                                    int steps, const GroupOptions& opt = {}) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const int groups = static_cast<int>(prompts.size()), world = size * groups;
  std::vector<GroupResult> results(prompts.size());
  std::vector<std::string> errors(static_cast<size_t>(world));
  auto rank_main = [&](int global) {
    try {
      const int rank = global % size, group = global / size;
      const std::vector<int32_t>& prompt = prompts[static_cast<size_t>(group)];
      GroupResult& result = results[static_cast<size_t>(group)];
      BackendOptions options;
      options.num_threads = 1;
      options.batch_invariant = opt.batch_invariant;
      std::unique_ptr<Backend> backend = create_backend(DeviceType::CPU, options);
      std::unique_ptr<GlooCommunicator> comm, experts;
      TensorParallel tp;
      if (size > 1) {
        comm = std::make_unique<GlooCommunicator>(store, "tp" + std::to_string(group), rank, size,
                                                  std::chrono::seconds(60));
        tp = {rank, size, comm.get()};
        if (opt.expert_parallel) tp.experts = comm.get();
      }
      if (opt.expert_parallel && groups > 1) {
        experts = std::make_unique<GlooCommunicator>(store, "experts", global, world, std::chrono::seconds(60));
        tp.experts = experts.get();
      }
      std::unique_ptr<LoadedModel> loaded = LoadedModel::open(path, *backend, tp, opt.quantization);
      const int32_t page = 16, n = static_cast<int32_t>(prompt.size());
      KvStorage kv(*backend, loaded->model().kv_spec(page, DType::F32), (n + steps) / page + 2);
      RunnerRank rr;
      rr.device_group = comm.get();
      rr.samples = rank == 0;
      ModelRunner runner(loaded->model(), *backend, kv, {n, 1}, rr);
      int slot = -1;
      for (int s = 0; s <= steps; ++s) {
        if (s == opt.replace_at) {
          for (size_t k = 0; loaded->model().expert_placement(k); ++k) {
            const int32_t n_experts = loaded->model().expert_placement(k)->num_logical();
            loaded->model().set_expert_placement(k, opt.replacement(k, n_experts));
          }
        }
        StepPlan plan;
        if (s == 0) {
          plan = testing::single_sequence_plan(prompt, 0, n, page, true);
        } else {
          const int32_t pos = n + s - 1;
          plan = testing::single_sequence_plan(std::vector<int32_t>(static_cast<size_t>(pos + 1), 0), pos, 1, page,
                                               true);
          plan.tokens[0] = TokenSource::sampled({slot, 0});
        }
        slot = runner.launch(plan);
        const StepResults res = runner.wait(slot);
        if (rank == 0) {
          result.logits.emplace_back(res.logits.begin(), res.logits.end());
          result.tokens.push_back(res.tokens[0]);
        }
      }
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(global)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return results;
}

GroupResult run_group(const std::string& path, int size, const std::vector<int32_t>& prompt, int steps,
                      const GroupOptions& opt = {}) {
  return run_groups(path, size, {prompt}, steps, opt)[0];
}

struct Tolerance {
  double max_abs;   // largest logit difference
  double mean_abs;  // mean logit difference
};
// f32 weights: only the order of the additions differs (each rank's partial
// sums, then the all-reduce); the logits here are below 20.
constexpr Tolerance kExact{1e-3, 1e-5};
// Block-quantised weights in short steps: the decode kernels round
// activations to 8 bits per 32-element block as llama.cpp does, so a
// difference in the last bit of a sum can flip one rounding and move the
// logits by tenths. Measured: up to 1.13 / 0.46 (SmolLM2 and Gemma 3 at 2 and
// 4 ranks), the size of our own and llama.cpp's distance to the exact
// reference (see SplitOverTwoAndFourRanksStaysAsCloseToTheExactReference,
// where prompts long enough for the f32 prefill kernels give the one-rank
// logits on every rank count).
constexpr Tolerance kQuantised{2.5, 0.6};
constexpr double kNearTie = 0.5;

// The logits and greedy tokens of `got` against one rank's, step by step.
void expect_close_to_one_rank(const GroupResult& one, const GroupResult& got, Tolerance tol, const char* label) {
  ASSERT_EQ(got.tokens.size(), one.tokens.size());
  for (size_t s = 0; s < one.tokens.size(); ++s) {
    const std::vector<float>& a = one.logits[s];
    const std::vector<float>& b = got.logits[s];
    ASSERT_EQ(a.size(), b.size());
    double max_diff = 0.0, max_abs = 0.0, sum_diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::abs(double(a[i]) - b[i]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
      max_abs = std::max(max_abs, std::abs(double(a[i])));
    }
    std::vector<float> top(a);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    std::printf("[tp] %s step %zu: max-abs %.5f mean-abs %.6f (max |logit| %.2f, margin %.3f)\n", label, s,
                max_diff, sum_diff / double(a.size()), max_abs, top[0] - top[1]);
    EXPECT_LE(max_diff, tol.max_abs) << "step " << s;
    EXPECT_LE(sum_diff / double(a.size()), tol.mean_abs) << "step " << s;
    // At a near tie the sequences may part (within the tolerance); what
    // follows would compare different inputs.
    if (got.tokens[s] != one.tokens[s]) {
      EXPECT_LT(top[0] - top[1], kNearTie) << "step " << s << ": token " << got.tokens[s] << " instead of "
                                           << one.tokens[s] << " past a clear margin";
      break;
    }
  }
}

void expect_same_as_one_rank(const std::string& path, const std::vector<int32_t>& prompt, int steps, Tolerance tol,
                             const GroupOptions& opt = {}) {
  GroupOptions one_rank;
  one_rank.quantization = opt.quantization;  // the same weights on one rank
  const GroupResult one = run_group(path, 1, prompt, steps, one_rank);
  ASSERT_EQ(one.logits.size(), static_cast<size_t>(steps + 1));
  for (int size : {2, 4}) {
    SCOPED_TRACE("tensor-parallel size " + std::to_string(size) + (opt.expert_parallel ? ", expert parallel" : ""));
    const GroupResult tp = run_group(path, size, prompt, steps, opt);
    expect_close_to_one_rank(one, tp, tol, ("size " + std::to_string(size)).c_str());
  }
}

const std::vector<int32_t> kPrompt = {1, 17, 42, 99, 7, 250, 3, 64, 128, 11, 5, 300, 2, 77, 31, 8, 19, 200};

class TinyCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyCheckpoint, SplitOverTwoAndFourRanksMatchesOneRank) {
  expect_same_as_one_rank((kTiny / GetParam()).string(), kPrompt, 8, kExact);
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyCheckpoint,
                         ::testing::Values("llama", "qwen2_bias", "qwen3_qknorm", "gemma3", "mixtral", "qwen2_moe",
                                           "qwen3_moe", "gpt_oss", "deepseek_v2", "deepseek_v2_lite", "deepseek_v3"));

// The default model against the exact reference of tests/data/e2e (its
// dequantised weights run in float64): split over 2 and 4 ranks, the logits
// stay as close to it as one rank's, and llama.cpp's, are.
class TinyMoeCheckpoint : public ::testing::TestWithParam<const char*> {};

// Expert parallelism: whole experts spread over the ranks, tokens sent to
// them and back over all-to-alls; attention still split by heads.
TEST_P(TinyMoeCheckpoint, ExpertsOverTwoAndFourRanksMatchOneRank) {
  GroupOptions opt;
  opt.expert_parallel = true;
  expect_same_as_one_rank((kTiny / GetParam()).string(), kPrompt, 8, kExact, opt);
}

// Tensor and data parallelism together: two data-parallel ranks, each a
// tensor-parallel group (or a single rank) with its own prompt, the experts
// spread over every rank of both. Each group's tokens and logits are one
// rank's for its prompt.
TEST_P(TinyMoeCheckpoint, ExpertsOverTwoDataParallelGroupsMatchOneRank) {
  const std::string path = (kTiny / GetParam()).string();
  const std::vector<std::vector<int32_t>> prompts = {kPrompt, {5, 9, 300, 41, 2, 18, 7, 150, 99, 3, 12}};
  std::vector<GroupResult> one;
  for (const std::vector<int32_t>& prompt : prompts) one.push_back(run_group(path, 1, prompt, 8));
  for (int size : {1, 2}) {
    SCOPED_TRACE("2 groups of " + std::to_string(size));
    GroupOptions opt;
    opt.expert_parallel = true;
    const std::vector<GroupResult> got = run_groups(path, size, prompts, 8, opt);
    for (size_t g = 0; g < prompts.size(); ++g) {
      SCOPED_TRACE("group " + std::to_string(g));
      expect_close_to_one_rank(one[g], got[g], kExact,
                               ("2x" + std::to_string(size) + " group " + std::to_string(g)).c_str());
    }
  }
}

// A live re-placement mid-generation (replicas of some experts, every expert
// moved to other slots, weights sent between ranks) changes no logit bit:
// each token's expert outputs are added in choice order wherever they were
// computed, and the batch-invariant kernels compute a row the same in any
// batch.
TEST_P(TinyMoeCheckpoint, LiveReplacementChangesNoOutput) {
  const std::string path = (kTiny / GetParam()).string();
  for (int size : {2, 4}) {
    SCOPED_TRACE("size " + std::to_string(size));
    GroupOptions opt;
    opt.expert_parallel = true;
    opt.batch_invariant = true;
    const GroupResult fixed = run_group(path, size, kPrompt, 8, opt);
    opt.replace_at = 3;
    opt.replacement = [size](size_t layer, int32_t experts) {
      // A skewed load, different per layer: the hot experts get the replicas.
      std::vector<double> load(static_cast<size_t>(experts));
      for (size_t e = 0; e < load.size(); ++e) {
        load[e] = double((e * 7 + layer * 3) % 8 + 1) * (e == layer % load.size() ? 10 : 1);
      }
      return moe::place_experts_global(load, size, 1);
    };
    const GroupResult moved = run_group(path, size, kPrompt, 8, opt);
    ASSERT_EQ(moved.tokens.size(), fixed.tokens.size());
    EXPECT_EQ(moved.tokens, fixed.tokens);
    for (size_t s = 0; s < fixed.logits.size(); ++s) EXPECT_EQ(moved.logits[s], fixed.logits[s]) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyMoeCheckpoint,
                         ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v2_lite",
                                           "deepseek_v3"));

TEST(TensorParallelSmolLM2, SplitOverTwoAndFourRanksStaysAsCloseToTheExactReference) {
  REQUIRE_SMOLLM2();
  const fs::path dir = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "e2e";
  std::ifstream f(dir / "smollm2.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const size_t vocab = ref["vocab_size"].get<size_t>(), n = ref["prompts"].size();
  std::vector<float> exact(n * vocab);
  std::ifstream ef(dir / ref["numpy_reference"]["file"].get<std::string>(), std::ios::binary);
  ef.read(reinterpret_cast<char*>(exact.data()), static_cast<std::streamsize>(exact.size() * sizeof(float)));
  ASSERT_TRUE(ef.good());
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& p = ref["prompts"][i];
    const std::vector<int32_t> tokens = p["tokens"].get<std::vector<int32_t>>();
    const float* e = &exact[i * vocab];
    auto mean_to_exact = [&](const std::vector<float>& l) {
      double sum = 0;
      for (size_t v = 0; v < vocab; ++v) sum += std::abs(double(l[v]) - e[v]);
      return sum / double(vocab);
    };
    const double one = mean_to_exact(run_group(testing::smollm2_path(), 1, tokens, 0).logits.at(0));
    const double llama = p["mean_abs_diff_llamacpp_vs_numpy"].get<double>();
    for (int size : {2, 4}) {
      const double tp = mean_to_exact(run_group(testing::smollm2_path(), size, tokens, 0).logits.at(0));
      std::printf("[tp] %s: mean |logit - exact|: 1 rank %.4f, %d ranks %.4f, llama.cpp %.4f\n",
                  p["name"].get<std::string>().c_str(), one, size, tp, llama);
      // The short prompt ("question") runs on the decode kernels, whose 8-bit
      // activations make its logits hop with any change of rounding: kernels
      // of the same precision measured 0.09-0.17 on it (AVX2, AVX-512 before
      // and after a change of summation order; 1, 2 and 4 ranks), so the
      // bound leaves room for that spread; the longer prompts agree to 1e-4.
      EXPECT_LE(tp, 1.6 * std::max(one, llama)) << p["name"] << " on " << size << " ranks";
    }
  }
}

TEST(TensorParallelSmolLM2, GreedyTokensOnTwoAndFourRanksMatchOneRank) {
  REQUIRE_SMOLLM2();
  expect_same_as_one_rank(testing::smollm2_path(), {1, 504, 3437, 314, 253, 2367, 282, 4875, 30, 2}, 8, kQuantised);
}

TEST(TensorParallelGemma3, KQuantSlicesOverTwoAndFourRanksMatchOneRank) {
  // Q4_K / Q6_K weights: the widths are cut in whole 256-element blocks.
  const fs::path gguf = fs::path(DEEPINFER_SOURCE_DIR) / "models" / "gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << "model not fetched: run ./build.sh";
  expect_same_as_one_rank(gguf.string(), {2, 818, 5279, 529, 7001, 563, 236743, 2, 1437, 29104}, 6, kQuantised);
}

// FP8 row blocks (--quantization fp8) over ranks whose row-parallel cuts fall
// inside a 64-element block (tiny Llama: attention output and down
// projections 64 and 80 wide, cut into 32 / 16 columns): those weights are
// cut from their values rounded to bf16, the rest stay FP8 slices. The same
// tokens as one rank with FP8 weights; the logits differ by that bf16
// rounding (measured 0.033 at most, 0.008 on average).
TEST(TensorParallel, Fp8WeightsCutInsideBlocksMatchOneRank) {
  GroupOptions opt;
  opt.quantization = WeightQuantization::Fp8;
  expect_same_as_one_rank((kTiny / "llama").string(), kPrompt, 8, Tolerance{0.1, 0.02}, opt);
}

TEST(TensorParallel, TooManyRanksForTheHeadsIsRefused) {
  std::unique_ptr<Backend> backend = create_backend(DeviceType::CPU, {});
  GlooCommunicator one(nullptr, "tp", 0, 1, std::chrono::seconds(5));
  // 4 query heads cannot be split over 8 ranks.
  EXPECT_THROW(LoadedModel::open((kTiny / "deepseek_v3").string(), *backend, {0, 8, &one}), Error);
}

}  // namespace
}  // namespace deepinfer
