// Helpers for the loader tests: a tiny GGUF writer that can also produce
// malformed files, a safetensors writer, and temporary folders.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::test {

using Bytes = std::vector<uint8_t>;

inline std::filesystem::path source_dir() { return DEEPINFER_SOURCE_DIR; }
inline std::filesystem::path data_dir() { return source_dir() / "tests" / "data" / "loader"; }
inline std::filesystem::path models_dir() { return source_dir() / "models"; }

template <typename T>
void put(Bytes& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}
inline void put_str(Bytes& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// Builds a GGUF file piece by piece. Values are passed already encoded so tests
// can write anything, valid or not.
class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  GgufBuilder& kv_raw(std::string_view key, uint32_t type, const Bytes& encoded) {
    put_str(kvs_, key);
    put<uint32_t>(kvs_, type);
    kvs_.insert(kvs_.end(), encoded.begin(), encoded.end());
    ++n_kv_;
    return *this;
  }
  template <typename T>
  GgufBuilder& kv(std::string_view key, uint32_t type, T v) {
    Bytes b;
    put<T>(b, v);
    return kv_raw(key, type, b);
  }
  GgufBuilder& kv_str(std::string_view key, std::string_view v) {
    Bytes b;
    put_str(b, v);
    return kv_raw(key, 8, b);
  }
  // ne is innermost first, as ggml stores it.
  GgufBuilder& tensor(std::string_view name, uint32_t ggml_type, std::vector<uint64_t> ne, uint64_t offset) {
    put_str(infos_, name);
    put<uint32_t>(infos_, static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put<uint64_t>(infos_, d);
    put<uint32_t>(infos_, ggml_type);
    put<uint64_t>(infos_, offset);
    ++n_tensors_;
    return *this;
  }
  std::optional<uint64_t> n_kv_override, n_tensors_override;

  // Header, metadata, tensor infos, padding to `alignment`, then data_bytes of data.
  Bytes build(size_t data_bytes, uint64_t alignment = 32) const {
    Bytes out;
    out.insert(out.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(out, version_);
    put<uint64_t>(out, n_tensors_override.value_or(n_tensors_));
    put<uint64_t>(out, n_kv_override.value_or(n_kv_));
    out.insert(out.end(), kvs_.begin(), kvs_.end());
    out.insert(out.end(), infos_.begin(), infos_.end());
    while (out.size() % alignment) out.push_back(0);
    for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
    return out;
  }

 private:
  uint32_t version_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
  Bytes kvs_, infos_;
};

// A safetensors file from a JSON header text and a data section.
inline Bytes safetensors_bytes(std::string_view header, size_t data_bytes) {
  Bytes out;
  put<uint64_t>(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

inline void write_file(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
inline void write_file(const std::filesystem::path& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
}
inline Bytes read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

// A fresh folder under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("deepinfer_loader_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace deepinfer::test
