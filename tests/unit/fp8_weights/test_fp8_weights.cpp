// FP8 checkpoints (quantization_config "fp8", e4m3 weights with scales, as
// DeepSeek-V3 and the Qwen3 FP8 releases ship them) load as e4m3 row blocks
// where the scale blocks allow, else dequantised to bf16
// (model/weight_source.h); `--quantization fp8` quantises 16/32-bit weights
// at load (model/fp8_weights.h). Each test quantises an f32 checkpoint's
// linear weights here — block scales (`weight_scale_inv`) or per-channel /
// per-tensor ones (`weight_scale`) — and writes beside it a twin with those
// weights as the values the scales give: exact in f32 where the loader keeps
// row blocks, rounded to bf16 where it dequantises. The FP8 checkpoint must
// give the twin's logits (up to the order of the sums: a row block's sum is
// scaled once) and stay near the f32 original (the quantisation error,
// printed). Malformed scales are refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/fp8_blocks.h"
#include "core/half.h"
#include "model/fp8_weights.h"
#include "model/model_loader.h"
#include "../../support/checkpoint_copy.h"
#include "../../support/prompt_logits.h"
#include "safetensors_f32.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Blob;
using testing::Tensor32;
using testing::bytes_of;
using testing::read_f32;
using testing::write_safetensors;

const fs::path kTiny = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";

enum class Scales { Block, PerChannel, PerTensor };

// The linear weights an FP8 release stores in e4m3 (norms, embeddings, the
// LM head and the MoE router stay in higher precision).
bool quantised(const std::string& name, const Tensor32& t) {
  if (t.shape.size() != 2 || name.find("layers.") == std::string::npos) return false;
  if (name.find("norm") != std::string::npos || name.size() < 7 || name.substr(name.size() - 7) != ".weight") return false;
  return name.find("mlp.gate.weight") == std::string::npos;
}

// Two copies of an f32 checkpoint: `fp8` with its linear weights in e4m3 and
// their scales, `twin` with those weights as the values the scales give
// (rounded to bf16, exact in f32, or per weight as the loader keeps it).
enum class Twin { Bf16, F32, AsLoaded };

// Whether the loader keeps an FP8 weight of this name and width as row
// blocks (fp8_linear_weight on its canonical name: not a router, nor MLA's
// kv_b or the MTP eh_proj, which are taken apart byte by byte).
bool loads_as_row_blocks(const std::string& hf_name, int64_t cols, int64_t block_cols) {
  for (const char* kept : {"kv_b_proj", "eh_proj", "block_sparse_moe.gate.", "mlp.gate."}) {
    if (hf_name.find(kept) != std::string::npos) return false;
  }
  return cols % kF8BlockElems == 0 && block_cols % kF8BlockElems == 0;
}

class Fp8Pair {
 public:
  Fp8Pair(const std::string& model, Scales scales, int64_t block_rows = 128, int64_t block_cols = 128)
      : Fp8Pair(kTiny / model, scales, block_rows, block_cols, Twin::AsLoaded) {}
  Fp8Pair(const fs::path& source, Scales scales, int64_t block_rows, int64_t block_cols, Twin twin) {
    base_ = fs::temp_directory_path() / ("deepinfer_fp8_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(base_);
    fs::create_directories(base_ / "fp8");
    fs::create_directories(base_ / "bf16");
    json config = testing::read_json(source / "config.json");
    std::ofstream(base_ / "bf16" / "config.json") << config.dump();
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}};
    if (scales == Scales::Block) config["quantization_config"]["weight_block_size"] = {block_rows, block_cols};
    std::ofstream(base_ / "fp8" / "config.json") << config.dump();

    std::map<std::string, Blob> fp8, bf16;
    for (auto& [name, t] : read_f32(source / "model.safetensors")) {
      if (!quantised(name, t)) {
        fp8[name] = bf16[name] = Blob{"F32", t.shape, bytes_of(t.values)};
        continue;
      }
      ++num_quantised_;
      const int64_t rows = t.shape[0], cols = t.shape[1];
      int64_t br = rows, bc = cols;
      if (scales == Scales::Block) br = block_rows, bc = block_cols;
      if (scales == Scales::PerChannel) br = 1;
      const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
      // The block's largest magnitude maps to e4m3's largest (448).
      std::vector<float> scale(static_cast<size_t>(sr * sc), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          float& s = scale[static_cast<size_t>((r / br) * sc + c / bc)];
          s = std::max(s, std::fabs(t.values[static_cast<size_t>(r * cols + c)]) / kF8E4M3Max);
        }
      }
      for (float& s : scale) s = s > 0 ? s : 1.0f;
      std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
      std::vector<uint16_t> deq(q.size());
      std::vector<float> exact(q.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          const float s = scale[static_cast<size_t>((r / br) * sc + c / bc)];
          q[i] = f32_to_f8e4m3(t.values[i] / s);
          exact[i] = f8e4m3_to_f32(q[i]) * s;
          deq[i] = f32_to_bf16(exact[i]);
        }
      }
      fp8[name] = Blob{"F8_E4M3", t.shape, bytes_of(q)};
      if (scales == Scales::Block) {
        fp8[name + "_scale_inv"] = Blob{"F32", {sr, sc}, bytes_of(scale)};
      } else if (scales == Scales::PerChannel) {
        fp8[name + "_scale"] = Blob{"F32", {rows, 1}, bytes_of(scale)};
      } else {
        fp8[name + "_scale"] = Blob{"F32", {}, bytes_of(scale)};
      }
      const bool exact_twin = twin == Twin::F32 || (twin == Twin::AsLoaded && loads_as_row_blocks(name, cols, bc));
      num_row_blocks_ += exact_twin ? 1 : 0;
      bf16[name] = exact_twin ? Blob{"F32", t.shape, bytes_of(exact)} : Blob{"BF16", t.shape, bytes_of(deq)};
    }
    write_safetensors(base_ / "fp8" / "model.safetensors", fp8);
    write_safetensors(base_ / "bf16" / "model.safetensors", bf16);
  }
  ~Fp8Pair() {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  std::string fp8() const { return (base_ / "fp8").string(); }
  std::string bf16() const { return (base_ / "bf16").string(); }  // the twin
  int num_quantised() const { return num_quantised_; }
  int num_row_blocks() const { return num_row_blocks_; }  // of them, twins in exact f32

 private:
  static inline int counter_ = 0;
  fs::path base_;
  int num_quantised_ = 0, num_row_blocks_ = 0;
};

std::vector<float> logits_of(const std::string& path, const std::vector<int32_t>& tokens) {
  auto backend = create_backend(DeviceType::CPU);
  auto loaded = LoadedModel::open(path, *backend);
  return testing::prompt_logits(*loaded, *backend, tokens);
}

struct Case {
  const char* model;
  Scales scales;
  int64_t block_rows, block_cols;
};

class Fp8Checkpoint : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Checkpoint, GivesTheLogitsOfItsDequantisedWeights) {
  const Case c = GetParam();
  const Fp8Pair pair(c.model, c.scales, c.block_rows, c.block_cols);
  ASSERT_GT(pair.num_quantised(), 4);
  const std::vector<int32_t> tokens = {1, 17, 42, 99, 5, 250, 7, 63, 128, 3, 77};
  const std::vector<float> fp8 = logits_of(pair.fp8(), tokens);
  const std::vector<float> twin = logits_of(pair.bf16(), tokens);
  const std::vector<float> f32 = logits_of((kTiny / c.model).string(), tokens);
  ASSERT_EQ(fp8.size(), twin.size());
  ASSERT_FALSE(fp8.empty());
  // Only bf16 weights: the same values and kernels, the same bits.
  const bool all_bf16 = pair.num_row_blocks() == 0;
  double max_twin = 0, max_twin_ref = 0;
  for (size_t i = 0; i < fp8.size(); ++i) {
    if (all_bf16) {
      ASSERT_EQ(fp8[i], twin[i]) << "logit " << i;
    }
    max_twin = std::max(max_twin, static_cast<double>(std::fabs(fp8[i] - twin[i])));
    max_twin_ref = std::max(max_twin_ref, static_cast<double>(std::fabs(twin[i])));
  }
  EXPECT_LE(max_twin, 1e-4 * max_twin_ref);
  // The quantisation's own error, against the f32 checkpoint.
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < fp8.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(fp8[i] - f32[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(f32[i])));
  }
  const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
  std::printf("%s: %d FP8 weights (%d as row blocks), max |logit - f32 logit| %.4f (largest f32 logit %.3f), top-1 %s\n",
              c.model, pair.num_quantised(), pair.num_row_blocks(), max_diff, max_ref,
              top(fp8) == top(f32) ? "same" : "differs");
  // e4m3 keeps 3 mantissa bits: the weights did change, and random tiny
  // weights are no guide to a real model's error (a changed expert choice
  // moves the MoE models' logits by whole units); only gross damage fails here.
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, max_ref);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, Fp8Checkpoint,
    ::testing::Values(Case{"llama", Scales::Block, 128, 128}, Case{"llama", Scales::Block, 16, 32},
                      Case{"qwen3_moe", Scales::Block, 16, 32}, Case{"deepseek_v3", Scales::Block, 128, 128},
                      Case{"deepseek_v3", Scales::Block, 32, 16}, Case{"mixtral", Scales::PerChannel, 0, 0},
                      Case{"llama", Scales::PerTensor, 0, 0}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      const char* kind = c.scales == Scales::Block ? "block" : c.scales == Scales::PerChannel ? "channel" : "tensor";
      return std::string(c.model) + "_" + kind +
             (c.scales == Scales::Block ? "_" + std::to_string(c.block_rows) + "x" + std::to_string(c.block_cols)
                                        : "");
    });

// An edited copy of the FP8 checkpoint's header and config, and the loader's error.
std::string load_error_after(const Fp8Pair& pair, const std::function<void(json&)>& edit_header,
                             const std::function<void(json&)>& edit_config = {}) {
  json config = testing::read_json(fs::path(pair.fp8()) / "config.json");
  if (edit_config) edit_config(config);
  // CheckpointCopy copies the safetensors file of a case folder and edits its header.
  testing::CheckpointCopy copy(pair.fp8(), config, edit_header);
  return testing::load_error(copy.path());
}

TEST(Fp8Checkpoint, MalformedScalesAreRefused) {
  const Fp8Pair pair("llama", Scales::Block, 16, 32);
  const std::string q = "model.layers.0.mlp.up_proj.weight";
  EXPECT_NE(load_error_after(pair, [&](json& h) { h.erase(q + "_scale_inv"); }).find("has no scale"),
            std::string::npos);
  // The scale of another shape: the block size the config names does not fit it.
  const std::string wrong = load_error_after(pair, {}, [](json& c) {
    c["quantization_config"]["weight_block_size"] = {32, 32};
  });
  EXPECT_NE(wrong.find("blocks of 32 x 32"), std::string::npos) << wrong;
  const std::string bad_block = load_error_after(pair, {}, [](json& c) {
    c["quantization_config"]["weight_block_size"] = {0, 128};
  });
  EXPECT_NE(bad_block.find("weight_block_size"), std::string::npos) << bad_block;
  // An e4m3 weight whose bytes are too few for its shape is the safetensors
  // reader's error; a scale of the wrong dtype is ours.
  const std::string dtype = load_error_after(pair, [&](json& h) { h[q + "_scale_inv"]["dtype"] = "I32"; });
  EXPECT_NE(dtype.find("expected contiguous f32 or bf16"), std::string::npos) << dtype;
}

TEST(Fp8Checkpoint, ANanWeightIsRefused) {
  const Fp8Pair pair("llama", Scales::PerTensor);
  // Overwrite the first byte of one FP8 weight with e4m3's NaN (0x7f).
  const fs::path file = fs::path(pair.fp8()) / "model.safetensors";
  std::string st = testing::read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  const json header = json::parse(st.substr(8, n));
  const auto begin = header["model.layers.0.mlp.up_proj.weight"]["data_offsets"][0].get<size_t>();
  st[8 + n + begin] = static_cast<char>(0x7f);
  std::ofstream(file, std::ios::binary) << st;
  const std::string err = testing::load_error(pair.fp8());
  EXPECT_NE(err.find("not finite"), std::string::npos) << err;
}

// ---- Row blocks: linear weights whose rows are whole 64-element blocks ----

// A Qwen3-MoE checkpoint of random f32 weights wide enough for row blocks
// (hidden 128, 4 heads of 32, FFN 256, experts 128 wide; layer 1 routes over 8
// per-expert tensors, layers 0 and 2 are dense).
class WideCheckpoint {
 public:
  WideCheckpoint() {
    dir_ = fs::temp_directory_path() / ("deepinfer_fp8_wide_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    json config = testing::read_json(kTiny / "qwen3_moe" / "config.json");
    const int64_t H = 128, heads = 4, kv_heads = 2, hd = 32, F = 256, Fm = 128, E = 8, V = 320;
    config["hidden_size"] = H;
    config["intermediate_size"] = F;
    config["moe_intermediate_size"] = Fm;
    std::ofstream(dir_ / "config.json") << config.dump();
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::map<std::string, Blob> tensors;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, float stddev, float mean = 0.0f) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = mean + stddev * normal(rng);
      tensors[name] = Blob{"F32", std::move(shape), bytes_of(v)};
    };
    add("model.embed_tokens.weight", {V, H}, 1.0f);
    add("lm_head.weight", {V, H}, 0.1f);
    add("model.norm.weight", {H}, 0.05f, 1.0f);
    for (int l = 0; l < 3; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {H}, 0.05f, 1.0f);
      add(p + "post_attention_layernorm.weight", {H}, 0.05f, 1.0f);
      add(p + "self_attn.q_norm.weight", {hd}, 0.05f, 1.0f);
      add(p + "self_attn.k_norm.weight", {hd}, 0.05f, 1.0f);
      add(p + "self_attn.q_proj.weight", {heads * hd, H}, 0.09f);
      add(p + "self_attn.k_proj.weight", {kv_heads * hd, H}, 0.09f);
      add(p + "self_attn.v_proj.weight", {kv_heads * hd, H}, 0.09f);
      add(p + "self_attn.o_proj.weight", {H, heads * hd}, 0.09f);
      if (l == 1) {
        add(p + "mlp.gate.weight", {E, H}, 0.2f);
        for (int e = 0; e < E; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          add(x + "gate_proj.weight", {Fm, H}, 0.09f);
          add(x + "up_proj.weight", {Fm, H}, 0.09f);
          add(x + "down_proj.weight", {H, Fm}, 0.09f);
        }
      } else {
        add(p + "mlp.gate_proj.weight", {F, H}, 0.09f);
        add(p + "mlp.up_proj.weight", {F, H}, 0.09f);
        add(p + "mlp.down_proj.weight", {H, F}, 0.06f);
      }
    }
    write_safetensors(dir_ / "model.safetensors", tensors);
  }
  ~WideCheckpoint() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

// Last-position logits of a short prompt (the decode kernels: few rows) and a
// long one (the prefill GEMM), and the bytes a decode step reads.
struct Scores {
  std::vector<float> logits;
  size_t weight_bytes = 0;
};

Scores scores_of(const std::string& path, WeightQuantization q = WeightQuantization::None) {
  auto backend = create_backend(DeviceType::CPU);
  auto loaded = LoadedModel::open(path, *backend, {}, q);
  Scores s;
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{5, 77}, std::vector<int32_t>{1, 17, 42, 99, 5, 250, 7, 63, 128, 3, 77, 300, 12, 8, 9,
                                                          10, 11, 200, 150, 64, 32, 16}}) {
    const std::vector<float> l = testing::prompt_logits(*loaded, *backend, prompt);
    s.logits.insert(s.logits.end(), l.begin(), l.end());
  }
  s.weight_bytes = loaded->model().weight_bytes();
  return s;
}

struct Diff {
  double max_diff = 0, max_ref = 0;
};
Diff diff_of(const std::vector<float>& a, const std::vector<float>& ref) {
  Diff d;
  EXPECT_EQ(a.size(), ref.size());
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    d.max_diff = std::max(d.max_diff, static_cast<double>(std::fabs(a[i] - ref[i])));
    d.max_ref = std::max(d.max_ref, static_cast<double>(std::fabs(ref[i])));
  }
  return d;
}

struct RowBlockCase {
  Scales scales;
  int64_t block_rows, block_cols;
};

class Fp8RowBlocks : public ::testing::TestWithParam<RowBlockCase> {};

// Codes and scales go into row blocks as they are: the logits are those of
// the exact dequantised weights in f32 up to the order of the sums (the row
// blocks scale a block's sum once), and a step reads about a third of the f32
// twin's bytes.
TEST_P(Fp8RowBlocks, CheckpointKeepsItsCodesAndScales) {
  const RowBlockCase c = GetParam();
  const WideCheckpoint wide;
  const Fp8Pair pair(wide.dir(), c.scales, c.block_rows, c.block_cols, Twin::F32);
  const Scores fp8 = scores_of(pair.fp8()), twin = scores_of(pair.bf16());
  const Diff d = diff_of(fp8.logits, twin.logits);
  std::printf("row blocks: %zu weight bytes per step vs %zu for the f32 twin; max |logit diff| %.2e of %.3f\n",
              fp8.weight_bytes, twin.weight_bytes, d.max_diff, d.max_ref);
  EXPECT_LE(d.max_diff, 1e-4 * d.max_ref);
  EXPECT_LT(fp8.weight_bytes * 2, twin.weight_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    WideQwen3Moe, Fp8RowBlocks,
    ::testing::Values(RowBlockCase{Scales::Block, 128, 128}, RowBlockCase{Scales::Block, 32, 256},
                      RowBlockCase{Scales::Block, 1, 128}, RowBlockCase{Scales::PerChannel, 0, 0},
                      RowBlockCase{Scales::PerTensor, 0, 0}),
    [](const ::testing::TestParamInfo<RowBlockCase>& info) {
      const RowBlockCase& c = info.param;
      if (c.scales == Scales::PerChannel) return std::string("channel");
      if (c.scales == Scales::PerTensor) return std::string("tensor");
      return "block_" + std::to_string(c.block_rows) + "x" + std::to_string(c.block_cols);
    });

// Scale blocks narrower than a row block cannot give one scale per 64
// elements: those weights come as bf16, exactly the bf16 twin.
TEST(Fp8RowBlocks, NarrowScaleBlocksFallBackToBf16) {
  const WideCheckpoint wide;
  const Fp8Pair pair(wide.dir(), Scales::Block, 128, 32, Twin::Bf16);
  const Scores fp8 = scores_of(pair.fp8()), twin = scores_of(pair.bf16());
  ASSERT_EQ(fp8.logits.size(), twin.logits.size());
  for (size_t i = 0; i < fp8.logits.size(); ++i) ASSERT_EQ(fp8.logits[i], twin.logits[i]) << "logit " << i;
  EXPECT_EQ(fp8.weight_bytes, twin.weight_bytes);
}

// --quantization fp8 rounds each 64-element row block with scale amax / 448:
// the same codes and scales as an FP8 checkpoint quantised that way, so the
// same logits bit for bit; against the f32 weights, e4m3's error.
TEST(Fp8RowBlocks, QuantizationFp8IsTheCheckpointWithRowBlockScales) {
  const WideCheckpoint wide;
  const Fp8Pair pair(wide.dir(), Scales::Block, 1, kF8BlockElems, Twin::F32);
  const Scores quantised = scores_of(wide.dir().string(), WeightQuantization::Fp8);
  const Scores checkpoint = scores_of(pair.fp8());
  const Scores f32 = scores_of(wide.dir().string());
  ASSERT_EQ(quantised.logits.size(), checkpoint.logits.size());
  for (size_t i = 0; i < quantised.logits.size(); ++i) {
    ASSERT_EQ(quantised.logits[i], checkpoint.logits[i]) << "logit " << i;
  }
  EXPECT_EQ(quantised.weight_bytes, checkpoint.weight_bytes);
  EXPECT_LT(quantised.weight_bytes * 2, f32.weight_bytes);
  const Diff d = diff_of(quantised.logits, f32.logits);
  std::printf("--quantization fp8: max |logit - f32 logit| %.4f of %.3f\n", d.max_diff, d.max_ref);
  EXPECT_GT(d.max_diff, 0.0);
  EXPECT_LT(d.max_diff, 0.1 * d.max_ref);
}

// A source of named host tensors, for the quantising source's own test.
class MapSource final : public WeightSource {
 public:
  std::optional<Tensor> find(std::string_view name) const override {
    auto it = tensors.find(std::string(name));
    if (it == tensors.end()) return std::nullopt;
    return it->second;
  }
  std::map<std::string, Tensor> tensors;
};

// What --quantization fp8 takes: the linear weights in f32 / f16 / bf16 whose
// rows are whole blocks; embeddings, the LM head, routers, biases, narrower
// rows and already quantised weights stay as they are.
TEST(Fp8RowBlocks, QuantizationTakesOnlyLinearWeightsOfWholeBlocks) {
  std::vector<uint16_t> bf16(4 * 128), narrow(4 * 80);
  std::vector<float> f32(2 * 3 * 64);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(0.01f * static_cast<float>(i % 97) - 0.4f);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = 0.02f * static_cast<float>(i % 31) - 0.3f;
  std::vector<uint8_t> q8(4 * 34 * 4);  // 4 rows of 128 in Q8_0 blocks
  auto inner = std::make_unique<MapSource>();
  inner->tensors["blk.0.attn_q.weight"] = Tensor(bf16.data(), DType::BF16, {4, 128});
  inner->tensors["blk.0.ffn_up_exps.weight"] = Tensor(f32.data(), DType::F32, {2, 3, 64});
  inner->tensors["blk.0.ffn_down.weight"] = Tensor(narrow.data(), DType::BF16, {4, 80});
  inner->tensors["blk.0.attn_k.weight"] = Tensor(q8.data(), DType::Q8_0, {4, 128});
  inner->tensors["blk.0.ffn_gate_inp.weight"] = Tensor(bf16.data(), DType::BF16, {4, 128});
  inner->tensors["token_embd.weight"] = Tensor(bf16.data(), DType::BF16, {4, 128});
  inner->tensors["output.weight"] = Tensor(bf16.data(), DType::BF16, {4, 128});
  Fp8QuantizingSource source(std::move(inner));

  const Tensor q = source.get("blk.0.attn_q.weight", {4, 128});
  ASSERT_EQ(q.dtype(), DType::F8E4M3_B64);
  std::vector<float> back(128);
  for (int64_t r = 0; r < 4; ++r) {
    dequantize_f8_blocks(static_cast<const F8Block*>(q.row(r).data()), back.data(), 128);
    for (int64_t c = 0; c < 128; ++c) {
      const float want = bf16_to_f32(bf16[static_cast<size_t>(r * 128 + c)]);
      EXPECT_LE(std::fabs(back[static_cast<size_t>(c)] - want), std::fabs(want) / 16 + 1e-4f) << r << "," << c;
    }
  }
  EXPECT_EQ(source.get("blk.0.attn_q.weight").data(), q.data()) << "quantised once";
  const Tensor experts = source.get("blk.0.ffn_up_exps.weight", {2, 3, 64});
  EXPECT_EQ(experts.dtype(), DType::F8E4M3_B64);
  for (const char* kept : {"blk.0.ffn_down.weight", "blk.0.attn_k.weight", "blk.0.ffn_gate_inp.weight",
                           "token_embd.weight", "output.weight"}) {
    const Tensor t = source.get(kept);
    EXPECT_NE(t.dtype(), DType::F8E4M3_B64) << kept;
  }
  EXPECT_FALSE(source.find("blk.0.attn_v.weight").has_value());
  EXPECT_EQ(source.stats().quantized, 2);
  EXPECT_EQ(source.stats().kept, 2);  // ffn_down (80 wide) and the Q8_0 attn_k
  EXPECT_EQ(source.stats().bytes_before, bf16.size() * 2 + f32.size() * 4);
  EXPECT_EQ(source.stats().bytes_after, (4 * 2 + 6) * sizeof(F8Block));
}

// A weight that is not finite cannot be quantised: a clear error.
TEST(Fp8RowBlocks, QuantizationRefusesNonFiniteWeights) {
  std::vector<float> w(2 * 64, 0.5f);
  w[70] = std::numeric_limits<float>::infinity();
  auto inner = std::make_unique<MapSource>();
  inner->tensors["blk.1.ffn_gate.weight"] = Tensor(w.data(), DType::F32, {2, 64});
  Fp8QuantizingSource source(std::move(inner));
  try {
    source.get("blk.1.ffn_gate.weight");
    ADD_FAILURE() << "an infinite weight was quantised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blk.1.ffn_gate.weight' holds a value that is not finite (element 6 of row 1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Fp8RowBlocks, QuantizationNamesAreChecked) {
  EXPECT_EQ(parse_weight_quantization(""), WeightQuantization::None);
  EXPECT_EQ(parse_weight_quantization("none"), WeightQuantization::None);
  EXPECT_EQ(parse_weight_quantization("fp8"), WeightQuantization::Fp8);
  try {
    parse_weight_quantization("int4");
    ADD_FAILURE() << "int4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use fp8"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fp8_linear_weight("blk.3.attn_q.weight"));
  EXPECT_TRUE(fp8_linear_weight("blk.0.ffn_down_exps.weight"));
  EXPECT_FALSE(fp8_linear_weight("blk.0.attn_kv_b.weight"));
  EXPECT_FALSE(fp8_linear_weight("blk.0.ffn_gate_inp.weight"));
  EXPECT_FALSE(fp8_linear_weight("token_embd.weight"));
  EXPECT_FALSE(fp8_linear_weight("output.weight"));
  EXPECT_FALSE(fp8_linear_weight("blk.0.attn_q.bias"));
}

}  // namespace
}  // namespace deepinfer
