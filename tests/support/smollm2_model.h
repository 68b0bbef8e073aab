// The SmolLM2-135M-Instruct GGUF that ./build.sh fetches into models/: the
// real model the engine-level tests run on the CPU. Tests skip when it is
// absent (a tree without the download).
#pragma once

#include <filesystem>
#include <string>

namespace deepinfer::testing {

inline std::string smollm2_path() {
  return std::string(DEEPINFER_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace deepinfer::testing

#define REQUIRE_SMOLLM2()                                                      \
  if (!std::filesystem::exists(::deepinfer::testing::smollm2_path()))         \
  GTEST_SKIP() << "model not fetched: run ./build.sh"
