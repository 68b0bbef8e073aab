// Test support for malformed-checkpoint tests on the tiny Hugging Face
// models: a temporary copy of a case folder with its config.json replaced and,
// optionally, the safetensors header edited (tensors renamed or dropped), and
// the error the loader gives for it.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model_loader.h"

namespace deepinfer::testing {

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  DI_CHECK(f.good(), "cannot read {}", p.string());
  return nlohmann::json::parse(f);
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class CheckpointCopy {
 public:
  using HeaderEdit = std::function<void(nlohmann::json&)>;

  CheckpointCopy(const std::filesystem::path& case_dir, const nlohmann::json& config,
                 const HeaderEdit& edit_header = {}) {
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("deepinfer_ckpt_{}_{}_{}", getpid(), case_dir.filename().string(), counter_++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
    std::ofstream(path_ / "config.json") << config.dump();
    std::string st = read_file(case_dir / "model.safetensors");
    if (edit_header) {
      uint64_t header_len = 0;
      std::memcpy(&header_len, st.data(), 8);
      nlohmann::json header = nlohmann::json::parse(st.substr(8, header_len));
      edit_header(header);
      const std::string text = header.dump();
      const uint64_t len = text.size();
      st = std::string(reinterpret_cast<const char*>(&len), 8) + text + st.substr(8 + header_len);
    }
    std::ofstream(path_ / "model.safetensors", std::ios::binary) << st;
  }
  ~CheckpointCopy() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  CheckpointCopy(const CheckpointCopy&) = delete;
  CheckpointCopy& operator=(const CheckpointCopy&) = delete;

  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// The loader's error for a checkpoint folder on the CPU backend, or
// "(loaded without error)".
inline std::string load_error(const std::string& path) {
  auto backend = create_backend(DeviceType::CPU);
  try {
    LoadedModel::open(path, *backend);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded without error)";
}

}  // namespace deepinfer::testing
