// A Hugging Face checkpoint folder: config.json plus safetensors weights, either
// sharded with model.safetensors.index.json or as every *.safetensors file.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "loader/safetensors.h"

namespace deepinfer {

class HfCheckpoint {
 public:
  static constexpr std::string_view kIndexFile = "model.safetensors.index.json";

  // Throws deepinfer::Error if config.json is missing or invalid, if the index
  // names a missing file or a tensor its file lacks, or if a tensor is defined
  // in two files.
  static HfCheckpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // Sorted.
  const std::vector<std::string>& tensor_names() const { return names_; }
  bool has_tensor(std::string_view name) const { return find_tensor(name) != nullptr; }
  const SafetensorsTensorInfo* find_tensor(std::string_view name) const;
  // A CPU view into the mapped shard (read-only by contract).
  Tensor tensor(std::string_view name) const;

 private:
  struct Entry {
    size_t file;
    const SafetensorsTensorInfo* info;
  };
  void add(std::string name, size_t file, const SafetensorsTensorInfo* info);

  std::string dir_;
  nlohmann::json config_;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> names_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace deepinfer
