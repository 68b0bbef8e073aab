#include "model/model_loader.h"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "loader/gguf.h"
#include "loader/hf_checkpoint.h"
#include "model/arch_registry.h"
#include "model/decoder_model.h"
#include "model/deepseek_model.h"
#include "model/weight_source.h"

namespace deepinfer {

namespace {

// config.json's layer count sizes per-layer lists before any weight is read;
// every layer holds tensors, so a count above the checkpoint's tensor count is
// forged or broken and is refused before anything is allocated by it.
void check_layer_count(const nlohmann::json& cfg, const HfCheckpoint& ckpt) {
  const nlohmann::json* scope = &cfg;
  if (auto t = cfg.find("text_config"); t != cfg.end() && t->is_object()) scope = &*t;
  auto it = scope->find("num_hidden_layers");
  // Negative or fractional values are left to the architecture's reader, which names them.
  if (it == scope->end() || !it->is_number_unsigned()) return;
  const uint64_t layers = it->get<uint64_t>();
  const size_t tensors = ckpt.tensor_names().size();
  DI_CHECK(layers <= tensors, "config.json: num_hidden_layers = {}, but the checkpoint holds {} tensors", layers, tensors);
}

}  // namespace

LoadedModel::~LoadedModel() = default;

std::unique_ptr<LoadedModel> LoadedModel::open(const std::string& path, Backend& backend, TensorParallel tp,
                                               WeightQuantization quantization) {
  DI_CHECK(quantization == WeightQuantization::None || backend.reads_host_weights() || backend.stores_fp8_weights(),
           "--quantization fp8: the {} backend does not keep FP8 weights (FP8 checkpoints load there dequantised)",
           backend.name());
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<LoadedModel> m(new LoadedModel());
  m->path_ = path;
  std::error_code ec;
  DI_CHECK(fs::exists(path, ec), "model path '{}' does not exist", path);
  ModelConfig config;
  bool post_attention_is_ffn_norm = true;
  if (fs::is_directory(path, ec)) {
    m->format_ = CheckpointFormat::HuggingFace;
    m->hf_ = std::make_unique<HfCheckpoint>(HfCheckpoint::open(path));
    const nlohmann::json& cfg = m->hf_->config();
    auto archs = cfg.find("architectures");
    DI_CHECK(archs != cfg.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string(),
             "{}/config.json has no 'architectures' list", path);
    const std::string hf_arch = (*archs)[0].get<std::string>();
    const ArchSpec& spec = find_arch_for_hf(hf_arch);
    check_layer_count(cfg, *m->hf_);
    config = spec.from_hf(cfg, hf_arch);
    post_attention_is_ffn_norm = spec.hf_post_attention_is_ffn_norm;
    m->source_ = std::make_unique<HfWeightSource>(*m->hf_, post_attention_is_ffn_norm, spec.hf_expert_layout);
  } else {
    m->format_ = CheckpointFormat::Gguf;
    m->gguf_ = std::make_unique<GgufFile>(GgufFile::open(path));
    const std::string arch(m->gguf_->get_string("general.architecture"));
    const ArchSpec& spec = find_arch_for_gguf(arch);
    config = spec.from_gguf(*m->gguf_, arch);
    m->source_ = std::make_unique<GgufWeightSource>(*m->gguf_);
  }
  log_info("model: {}", config.summary());
  Fp8QuantizingSource* fp8 = nullptr;
  if (quantization == WeightQuantization::Fp8) {
    auto wrapped = std::make_unique<Fp8QuantizingSource>(std::move(m->source_));
    fp8 = wrapped.get();
    m->source_ = std::move(wrapped);
  }
  m->full_config_ = config;
  if (config.mla.enabled()) {
    m->model_ = std::make_unique<DeepseekModel>(std::move(config), *m->source_, backend, -1, tp);
  } else {
    m->model_ = std::make_unique<DecoderModel>(std::move(config), *m->source_, backend, tp);
  }
  if (fp8) {
    const Fp8QuantizingSource::Stats& st = fp8->stats();
    log_info("model: --quantization fp8: {} linear weights to FP8 ({:.1f} -> {:.1f} MiB), {} left as they were (rows "
             "not whole 64-element blocks, or already quantised)",
             st.quantized, st.bytes_before / 1048576.0, st.bytes_after / 1048576.0, st.kept);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("model: loaded {:.1f} MiB of weights from {} in {:.2f} s", m->model_->weight_bytes() / 1048576.0,
           path, secs);
  return m;
}

std::unique_ptr<Model> LoadedModel::load_mtp_layer(Backend& backend) const {
  const ModelConfig& c = full_config_;
  DI_CHECK(c.mla.enabled() && c.mtp_layers > 0,
           "{} has no multi-token-prediction layer (num_nextn_predict_layers in config.json): the \"mtp\" method "
           "drafts with DeepSeek-V3-style MTP layers",
           c.arch);
  return std::make_unique<DeepseekModel>(c, *source_, backend, c.n_layers);
}

}  // namespace deepinfer
