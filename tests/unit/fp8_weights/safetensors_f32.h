// Test support for the FP8 weight tests: reading a tiny f32 safetensors
// checkpoint and writing edited or synthetic ones.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../support/checkpoint_copy.h"

namespace deepinfer::testing {

struct Tensor32 {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The f32 tensors of a tiny checkpoint, by name.
inline std::map<std::string, Tensor32> read_f32(const std::filesystem::path& file) {
  const std::string st = testing::read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(st.substr(8, n));
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

inline void write_safetensors(const std::filesystem::path& file, const std::map<std::string, Blob>& tensors) {
  nlohmann::json header = nlohmann::json::object();
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

}  // namespace deepinfer::testing
