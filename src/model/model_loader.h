// Opens a checkpoint (a .gguf file or a Hugging Face folder with config.json and
// *.safetensors), reads its configuration through the architecture registry and
// builds the model on a backend. The returned object keeps the file mappings
// alive for as long as the model's weight views need them.
#pragma once

#include <memory>
#include <string>

#include "model/fp8_weights.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace deepinfer {

class GgufFile;
class HfCheckpoint;
class WeightSource;

enum class CheckpointFormat : uint8_t { Gguf, HuggingFace };

class LoadedModel {
 public:
  // With tensor parallelism, this rank's slices only (tensor_parallel.h).
  // `quantization` quantises the linear weights at load (fp8_weights.h; the
  // CPU backend only).
  static std::unique_ptr<LoadedModel> open(const std::string& path, Backend& backend, TensorParallel tp = {},
                                           WeightQuantization quantization = WeightQuantization::None);
  ~LoadedModel();

  Model& model() { return *model_; }
  const ModelConfig& config() const { return model_->config(); }
  CheckpointFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  // The GGUF file (tokenizer metadata lives there); null for Hugging Face folders.
  const GgufFile* gguf() const { return gguf_.get(); }
  // The checkpoint's first multi-token-prediction layer as a model of its
  // own (DeepseekModel's MTP form), from the same weights, whole even when
  // the decoder is split over tensor-parallel ranks; throws
  // deepinfer::Error when the model has none.
  std::unique_ptr<Model> load_mtp_layer(Backend& backend) const;

 private:
  LoadedModel() = default;
  std::string path_;
  CheckpointFormat format_ = CheckpointFormat::Gguf;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<HfCheckpoint> hf_;
  std::unique_ptr<WeightSource> source_;
  std::unique_ptr<Model> model_;
  ModelConfig full_config_;  // before a tensor-parallel split narrowed the model's own
};

}  // namespace deepinfer
