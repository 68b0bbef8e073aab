// Loads tests/data/quants/<dtype>.bin written by scripts/gen_quant_reference.py:
// raw GGUF rows of one dtype and the floats the gguf package dequantises them to.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "core/dtype.h"

namespace deepinfer::test {

struct QuantReference {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  std::vector<uint8_t> raw;     // rows * row_bytes
  std::vector<float> expected;  // rows * cols

  const uint8_t* row(int64_t r) const { return raw.data() + r * row_bytes; }
  const float* expected_row(int64_t r) const { return expected.data() + r * cols; }
};

inline DType dtype_from_name(const std::string& name) {
  for (int i = 0; i < static_cast<int>(DType::Count); ++i) {
    if (dtype_name(static_cast<DType>(i)) == name) return static_cast<DType>(i);
  }
  ADD_FAILURE() << "unknown dtype name " << name;
  return DType::Count;
}

// Fails the current test (and returns an empty reference) on a malformed file.
inline QuantReference load_quant_reference(const std::string& name) {
  const std::string path = std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/quants/" + name + ".bin";
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  QuantReference ref;
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    if (pos + n > file.size()) return false;
    std::memcpy(dst, file.data() + pos, n);
    pos += n;
    return true;
  };
  char magic[4];
  uint32_t name_len = 0;
  if (!take(magic, 4) || std::memcmp(magic, "DIQ1", 4) != 0 || !take(&name_len, 4) || name_len > 16) {
    ADD_FAILURE() << "bad header in " << path;
    return {};
  }
  std::string stored(name_len, '\0');
  uint32_t dims[3];
  if (!take(stored.data(), name_len) || !take(dims, sizeof(dims))) {
    ADD_FAILURE() << "truncated header in " << path;
    return {};
  }
  ref.dtype = dtype_from_name(stored);
  ref.rows = dims[0];
  ref.cols = dims[1];
  ref.row_bytes = dims[2];
  if (stored != name || ref.dtype == DType::Count ||
      static_cast<int64_t>(deepinfer::row_bytes(ref.dtype, ref.cols)) != ref.row_bytes) {
    ADD_FAILURE() << "inconsistent header in " << path;
    return {};
  }
  ref.raw.resize(static_cast<size_t>(ref.rows * ref.row_bytes));
  ref.expected.resize(static_cast<size_t>(ref.rows * ref.cols));
  if (!take(ref.raw.data(), ref.raw.size()) ||
      !take(ref.expected.data(), ref.expected.size() * sizeof(float)) || pos != file.size()) {
    ADD_FAILURE() << "bad payload size in " << path;
    return {};
  }
  return ref;
}

// The dtypes with CPU kernels, by the names the data files use.
inline const std::vector<std::string>& kernel_dtype_names() {
  static const std::vector<std::string> names = {"f32",  "f16",  "bf16", "q4_0", "q4_1",
                                                 "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                                                 "q4_K", "q5_K", "q6_K"};
  return names;
}

// The quantisation kernel levels this machine runs (AMX adds no dot products
// of its own); the others are reported as not tested (a test on a wider
// machine covers them).
inline std::vector<cpu::CpuIsa> kernel_levels_here() {
  std::vector<cpu::CpuIsa> levels;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::Scalar, cpu::CpuIsa::Avx2, cpu::CpuIsa::Avx512}) {
    if (cpu::isa_available(isa)) {
      levels.push_back(isa);
    } else {
      std::printf("[  NOTE    ] %s kernels not tested: this CPU lacks them\n", std::string(cpu::isa_name(isa)).c_str());
    }
  }
  return levels;
}

}  // namespace deepinfer::test
