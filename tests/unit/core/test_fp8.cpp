// FP8 e4m3 conversions against ml_dtypes' float8_e4m3fn
// (tests/data/fp8/e4m3_reference.txt, made by scripts/gen_fp8_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "core/dtype.h"
#include "core/fp8.h"

using namespace deepinfer;

namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

}  // namespace

TEST(Fp8E4m3, MatchesReferenceForEveryCodeAndRoundingCase) {
  const auto path = std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests/data/fp8/e4m3_reference.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  int decoded = 0, encoded = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "decode") {
      unsigned code = 0;
      std::string hex;
      fields >> code >> hex;
      const float want = from_bits(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
      const float got = f8e4m3_to_f32(static_cast<uint8_t>(code));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << code;
      } else {
        EXPECT_EQ(bits_of(got), bits_of(want)) << "code " << code;
      }
      ++decoded;
    } else {
      ASSERT_EQ(kind, "encode") << line;
      std::string hex;
      unsigned code = 0;
      fields >> hex >> code;
      const float x = from_bits(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
      EXPECT_EQ(f32_to_f8e4m3(x), code) << "input " << x << " (" << hex << ")";
      ++encoded;
    }
  }
  EXPECT_EQ(decoded, 256);
  EXPECT_GT(encoded, 2000);
}

TEST(Fp8E4m3, SaturatesInsteadOfOverflowing) {
  for (float x : {448.0f, 463.9f, 464.0f, 500.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(f32_to_f8e4m3(x), 0x7e) << x;
    EXPECT_EQ(f32_to_f8e4m3(-x), 0xfe) << -x;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Fp8E4m3, RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    // -0 comes back as -0 (code 0x80), every other value as its own code.
    EXPECT_EQ(f32_to_f8e4m3(v), c) << v;
  }
  EXPECT_EQ(row_bytes(DType::F8E4M3, 576), 576u);
  EXPECT_EQ(dtype_name(DType::F8E4M3), "f8_e4m3");
}
