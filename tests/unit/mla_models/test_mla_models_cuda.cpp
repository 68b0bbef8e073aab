// DeepSeek-V2/V3 (MLA latent cache + DeepSeek MoE) on the CUDA backend
// against the CPU backend, on the tiny models of test_mla_models (skipped
// without a GPU). CUDA runs bf16 checkpoints only, so both backends load a
// bf16 copy of the same weights: the CPU computes in f32 with an f32 cache,
// CUDA in its production precision (bf16 activations and latent cache, f32
// accumulation). Each prompt runs through ModelRunner as 16-token prefill
// chunks (queries after cached latent rows) and then single-token decode
// steps (the decode path, CUDA graphs); every decode step's logits are
// compared.
//
// Tolerance: 0.1 x the largest |logit| (about 1.3 here). bf16 activations
// move these logits by a few hundredths, but a router margin can be as small
// as 4e-4, so a bf16 rounding may send a token to another expert; a wrong
// attention moves them by several units (the rope details recorded in the
// reference data move them by 4 to 10).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/kv_storage.h"
#include "model/model_loader.h"
#include "runner/model_runner.h"
#include "../../support/prompt_logits.h"
#include "../../support/scripted_workload.h"
#include "engine/engine.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";
constexpr double kRelTolerance = 0.1;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << p;
  return nlohmann::json::parse(f);
}

// A temporary copy of a case folder whose f32 tensors are rounded to bf16.
class Bf16Copy {
 public:
  explicit Bf16Copy(const std::string& name) {
    path_ = fs::temp_directory_path() / fmt::format("deepinfer_mla_cuda_{}_{}", getpid(), name);
    fs::remove_all(path_);
    fs::create_directories(path_);
    fs::copy_file(kData / name / "config.json", path_ / "config.json");
    std::ifstream in(kData / name / "model.safetensors", std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(header_len));
    const char* data = bytes.data() + 8 + header_len;
    std::vector<char> out_data;
    for (auto& [tensor, entry] : header.items()) {
      if (tensor == "__metadata__") continue;
      const auto begin = entry["data_offsets"][0].get<uint64_t>(), end = entry["data_offsets"][1].get<uint64_t>();
      const uint64_t at = out_data.size();
      if (entry["dtype"] == "F32") {
        for (uint64_t o = begin; o < end; o += 4) {
          float f;
          std::memcpy(&f, data + o, 4);
          const uint16_t h = f32_to_bf16(f);
          out_data.insert(out_data.end(), reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + 2);
        }
        entry["dtype"] = "BF16";
      } else {
        out_data.insert(out_data.end(), data + begin, data + end);
      }
      entry["data_offsets"] = nlohmann::json::array({at, static_cast<uint64_t>(out_data.size())});
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
    const uint64_t len = text.size();
    std::ofstream out(path_ / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.write(out_data.data(), static_cast<std::streamsize>(out_data.size()));
  }
  ~Bf16Copy() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Logits of the decode steps after 16-token prefill chunks: the last
// min(3, n) tokens are decoded one at a time.
std::vector<std::vector<float>> decode_logits(LoadedModel& loaded, Backend& backend,
                                              const std::vector<int32_t>& tokens) {
  const int32_t page = 16, n = static_cast<int32_t>(tokens.size());
  const int32_t pages = n / page + 1;
  KvStorage kv(backend, loaded.model().kv_spec(page, backend.activation_dtype()), pages);
  ModelRunner runner(loaded.model(), backend, kv, {16, 1});
  const int32_t prefill = n - std::min(3, n);
  std::vector<std::vector<float>> out;
  for (int32_t start = 0; start < n;) {
    const bool decode = start >= prefill;
    const int32_t len = decode ? 1 : std::min(16, prefill - start);
    const StepResults res = runner.wait(runner.launch(testing::single_sequence_plan(tokens, start, len, page, decode)));
    if (decode) out.emplace_back(res.logits.begin(), res.logits.end());
    start += len;
  }
  return out;
}

class MlaModelCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaModelCuda, LogitsMatchTheCpu) {
  std::unique_ptr<Backend> gpu;
  try {
    gpu = create_backend(DeviceType::CUDA);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend: " << e.what();
  }
  BackendOptions o;
  o.num_threads = 2;
  auto cpu = create_backend(DeviceType::CPU, o);
  const std::string& name = GetParam();
  const Bf16Copy copy(name);
  auto on_gpu = LoadedModel::open(copy.path(), *gpu);
  auto on_cpu = LoadedModel::open(copy.path(), *cpu);
  const nlohmann::json ref = read_json(kData / name / "reference.json");
  for (const auto& p : ref["prompts"]) {
    const auto tokens = p["tokens"].get<std::vector<int32_t>>();
    const auto got = decode_logits(*on_gpu, *gpu, tokens);
    const auto want = decode_logits(*on_cpu, *cpu, tokens);
    ASSERT_EQ(got.size(), want.size());
    for (size_t step = 0; step < got.size(); ++step) {
      ASSERT_EQ(got[step].size(), want[step].size());
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < got[step].size(); ++i) {
        max_diff = std::max(max_diff, std::abs(double(got[step][i]) - want[step][i]));
        max_abs = std::max(max_abs, std::abs(double(want[step][i])));
      }
      const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
      std::printf("[mla cuda] %s %s decode step %zu: max-abs %.3g (|logit| up to %.2f), top-1 %s\n", name.c_str(),
                  p["name"].get<std::string>().c_str(), step, max_diff, max_abs,
                  top(got[step]) == top(want[step]) ? "same" : "differs");
      EXPECT_LE(max_diff, kRelTolerance * std::max(1.0, max_abs)) << name << "/" << p["name"] << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DeepSeek, MlaModelCuda,
                         ::testing::Values("deepseek_v2_lite", "deepseek_v2", "deepseek_v3"));

// The MTP layer (speculative "mtp" method) after each prompt: its first
// draft's logits (catch-up over the prompt with the decoder's hidden states)
// and one chain step's, on CUDA against the CPU, same bf16 weights.
std::vector<std::vector<float>> mtp_logits(LoadedModel& loaded, Backend& backend, const std::vector<int32_t>& tokens) {
  const int32_t page = 16, n = static_cast<int32_t>(tokens.size());
  auto layer = loaded.load_mtp_layer(backend);
  KvCacheSpec spec = loaded.model().kv_spec(page, backend.activation_dtype());
  ++spec.n_layers;
  KvStorage kv(backend, spec, n / page + 2,
               KvLayout::from_windows(std::vector<int32_t>(static_cast<size_t>(spec.n_layers), 0)));
  RunnerLimits limits;
  limits.max_num_batched_tokens = 64;
  limits.max_num_seqs = 1;
  limits.max_model_len = n + 8;
  limits.hidden_states = true;
  ModelRunner target(loaded.model(), backend, kv, limits);
  limits.sampled_probs = true;
  ModelRunner draft(*layer, backend, kv, limits);
  const int ts = target.launch(testing::single_sequence_plan(tokens, 0, n, page, true));
  const int32_t next = target.wait(ts).tokens[0];
  std::vector<int32_t> shifted(tokens.begin() + 1, tokens.end());
  shifted.push_back(next);
  StepPlan catch_up = testing::single_sequence_plan(shifted, 0, n, page, true);
  catch_up.hidden_source = target.hidden_states(ts);
  for (int32_t i = 0; i < n; ++i) catch_up.hidden_rows.push_back(i);
  const int cs = draft.launch(catch_up);
  const StepResults cr = draft.wait(cs);
  std::vector<std::vector<float>> out{{cr.logits.begin(), cr.logits.end()}};
  std::vector<int32_t> chain_tokens(static_cast<size_t>(n) + 1, 0);
  chain_tokens.back() = cr.tokens[0];
  StepPlan chain = testing::single_sequence_plan(chain_tokens, n, 1, page, true);
  chain.hidden_source = draft.hidden_states(cs);
  chain.hidden_rows = {n - 1};
  const StepResults chr = draft.wait(draft.launch(chain));
  out.emplace_back(chr.logits.begin(), chr.logits.end());
  return out;
}

TEST(MtpCuda, LayerLogitsMatchTheCpu) {
  std::unique_ptr<Backend> gpu;
  try {
    gpu = create_backend(DeviceType::CUDA);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend: " << e.what();
  }
  auto cpu = create_backend(DeviceType::CPU);
  const Bf16Copy copy("deepseek_v3_mtp");
  auto on_gpu = LoadedModel::open(copy.path(), *gpu);
  auto on_cpu = LoadedModel::open(copy.path(), *cpu);
  const nlohmann::json ref = read_json(kData / "deepseek_v3_mtp" / "mtp_reference.json");
  for (const auto& p : ref["prompts"]) {
    const auto tokens = p["tokens"].get<std::vector<int32_t>>();
    const auto got = mtp_logits(*on_gpu, *gpu, tokens);
    const auto want = mtp_logits(*on_cpu, *cpu, tokens);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].size(), want[k].size());
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < got[k].size(); ++i) {
        max_diff = std::max(max_diff, std::abs(double(got[k][i]) - want[k][i]));
        max_abs = std::max(max_abs, std::abs(double(want[k][i])));
      }
      std::printf("[mtp cuda] %s %s: max-abs %.3g (|logit| up to %.2f)\n", p["name"].get<std::string>().c_str(),
                  k == 0 ? "first draft" : "chained draft", max_diff, max_abs);
      EXPECT_LE(max_diff, kRelTolerance * std::max(1.0, max_abs)) << p["name"] << " draft " << k;
    }
  }
}

// The "mtp" method on CUDA with the oracle checkpoint (bf16; its MTP layer
// computes the decoder's next-but-one token): the same greedy outputs as
// without speculation, nearly every draft accepted, far fewer steps.
TEST(MtpCuda, EngineAcceptsTheOraclesDrafts) {
  try {
    create_backend(DeviceType::CUDA);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend: " << e.what();
  }
  auto config = [](const std::string& speculative) {
    EngineConfig c;
    c.device = DeviceType::CUDA;
    c.model_path = (kData / "deepseek_v3_mtp_oracle").string();
    c.tokenizer_path = (kData / "tokenizer.json").string();
    c.max_model_len = 128;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.kv_cache_tokens = 4096;
    if (!speculative.empty()) c.speculative = spec::SpeculativeConfig::parse(speculative);
    return c;
  };
  std::vector<testing::ScriptedJob> jobs;
  const char* prompts[] = {"the quick brown fox jumps over", "a b c d e f g a b c", "hello world, hello",
                           "one two three four five six seven", "0 1 2 3 4 5 6 7 8 9", "xyz xyz xyz"};
  for (int i = 0; i < 6; ++i) {
    testing::ScriptedJob j;
    j.join_step = i * 2;
    j.prompt = prompts[i];
    j.params.temperature = 0.0f;
    j.params.ignore_eos = true;
    j.params.max_tokens = 30 + 3 * i;
    jobs.push_back(j);
  }
  Engine plain(config(""));
  const auto expected = testing::run_scripted(plain, jobs);
  const char* method = R"({"method": "mtp", "num_speculative_tokens": 4, "dynamic": false})";
  Engine engine(config(method));
  const auto got = testing::run_scripted(engine, jobs);
  int same = 0;
  for (size_t i = 0; i < jobs.size(); ++i) same += got[i].tokens == expected[i].tokens ? 1 : 0;
  const EngineStats s = engine.stats();
  std::printf("[mtp cuda oracle] %d/%zu outputs identical; %lld steps (plain %lld), drafts %lld verified / %lld "
              "accepted, %lld graph steps\n",
              same, jobs.size(), (long long)s.steps, (long long)plain.stats().steps,
              (long long)s.spec.num_draft_tokens, (long long)s.spec.num_accepted_tokens, (long long)s.graph_steps);
  testing::expect_same_results(expected, got, method);
  EXPECT_GT(s.spec.num_accepted_tokens, 0.8 * static_cast<double>(s.spec.num_draft_tokens));
  EXPECT_LT(s.steps * 2, plain.stats().steps);
}

}  // namespace
}  // namespace deepinfer
