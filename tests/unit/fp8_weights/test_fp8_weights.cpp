// FP8 checkpoints (quantization_config "fp8", e4m3 weights with scales, as
// DeepSeek-V3 and the Qwen3 FP8 releases ship them) load dequantised to bf16
// (model/weight_source.h). Each test quantises a tiny f32 checkpoint's linear
// weights here — block scales (`weight_scale_inv`) or per-channel / per-tensor
// ones (`weight_scale`) — and writes beside it the same checkpoint with those
// weights as the bf16 values the scales give. The FP8 checkpoint must give
// exactly the logits of that bf16 one (the dequantisation is exact: an e4m3
// value times an f32 scale, rounded to bf16 once), and stay near the f32
// original (the quantisation error, printed). Malformed scales are refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "model/model_loader.h"
#include "../../support/checkpoint_copy.h"
#include "../../support/prompt_logits.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kTiny = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "data" / "hf_tiny";

enum class Scales { Block, PerChannel, PerTensor };

struct Tensor32 {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The f32 tensors of a tiny checkpoint, by name.
std::map<std::string, Tensor32> read_f32(const fs::path& file) {
  const std::string st = testing::read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  const json header = json::parse(st.substr(8, n));
  std::map<std::string, Tensor32> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(info["dtype"], "F32") << name;
    Tensor32 t;
    t.shape = info["shape"].get<std::vector<int64_t>>();
    const auto begin = info["data_offsets"][0].get<size_t>(), end = info["data_offsets"][1].get<size_t>();
    t.values.resize((end - begin) / 4);
    std::memcpy(t.values.data(), st.data() + 8 + n + begin, end - begin);
    out[name] = std::move(t);
  }
  return out;
}

struct Blob {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void write_safetensors(const fs::path& file, const std::map<std::string, Blob>& tensors) {
  json header = json::object();
  std::string data;
  for (const auto& [name, b] : tensors) {
    header[name] = {{"dtype", b.dtype}, {"shape", b.shape}, {"data_offsets", {data.size(), data.size() + b.bytes.size()}}};
    data += b.bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t len = text.size();
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text << data;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The linear weights an FP8 release stores in e4m3 (norms, embeddings, the
// LM head and the MoE router stay in higher precision).
bool quantised(const std::string& name, const Tensor32& t) {
  if (t.shape.size() != 2 || name.find("layers.") == std::string::npos) return false;
  if (name.find("norm") != std::string::npos || name.size() < 7 || name.substr(name.size() - 7) != ".weight") return false;
  return name.find("mlp.gate.weight") == std::string::npos;
}

// Two copies of a tiny checkpoint: `fp8` with its linear weights in e4m3 and
// their scales, `bf16` with those weights as the values the scales give.
class Fp8Pair {
 public:
  Fp8Pair(const std::string& model, Scales scales, int64_t block_rows = 128, int64_t block_cols = 128) {
    base_ = fs::temp_directory_path() / ("deepinfer_fp8_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(base_);
    fs::create_directories(base_ / "fp8");
    fs::create_directories(base_ / "bf16");
    json config = testing::read_json(kTiny / model / "config.json");
    std::ofstream(base_ / "bf16" / "config.json") << config.dump();
    config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}};
    if (scales == Scales::Block) config["quantization_config"]["weight_block_size"] = {block_rows, block_cols};
    std::ofstream(base_ / "fp8" / "config.json") << config.dump();

    std::map<std::string, Blob> fp8, bf16;
    for (auto& [name, t] : read_f32(kTiny / model / "model.safetensors")) {
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
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          const float s = scale[static_cast<size_t>((r / br) * sc + c / bc)];
          q[i] = f32_to_f8e4m3(t.values[i] / s);
          deq[i] = f32_to_bf16(f8e4m3_to_f32(q[i]) * s);
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
      bf16[name] = Blob{"BF16", t.shape, bytes_of(deq)};
    }
    write_safetensors(base_ / "fp8" / "model.safetensors", fp8);
    write_safetensors(base_ / "bf16" / "model.safetensors", bf16);
  }
  ~Fp8Pair() {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  std::string fp8() const { return (base_ / "fp8").string(); }
  std::string bf16() const { return (base_ / "bf16").string(); }
  int num_quantised() const { return num_quantised_; }

 private:
  static inline int counter_ = 0;
  fs::path base_;
  int num_quantised_ = 0;
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
  const std::vector<float> bf16 = logits_of(pair.bf16(), tokens);
  const std::vector<float> f32 = logits_of((kTiny / c.model).string(), tokens);
  ASSERT_EQ(fp8.size(), bf16.size());
  ASSERT_FALSE(fp8.empty());
  for (size_t i = 0; i < fp8.size(); ++i) ASSERT_EQ(fp8[i], bf16[i]) << "logit " << i;
  // The quantisation's own error, against the f32 checkpoint.
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < fp8.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(fp8[i] - f32[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(f32[i])));
  }
  const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
  std::printf("%s: %d FP8 weights, max |logit - f32 logit| %.4f (largest f32 logit %.3f), top-1 %s\n", c.model,
              pair.num_quantised(), max_diff, max_ref, top(fp8) == top(f32) ? "same" : "differs");
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

}  // namespace
}  // namespace deepinfer
