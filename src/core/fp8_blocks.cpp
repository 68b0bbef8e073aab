#include "core/fp8_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp8.h"

namespace deepinfer {

int64_t quantize_f8_blocks(const float* src, F8Block* dst, int64_t n) {
  for (int64_t b = 0; b < n / kF8BlockElems; ++b) {
    const float* x = src + b * kF8BlockElems;
    float amax = 0.0f;
    for (int i = 0; i < kF8BlockElems; ++i) {
      if (!std::isfinite(x[i])) return b * kF8BlockElems + i;
      amax = std::max(amax, std::fabs(x[i]));
    }
    F8Block& out = dst[b];
    out.scale = amax / kF8E4M3Max;
    for (int i = 0; i < kF8BlockElems; ++i) {
      // x / scale is at most 448 up to one rounding, which saturates to 448.
      out.codes[i] = out.scale > 0.0f ? f32_to_f8e4m3(x[i] / out.scale) : 0;
    }
  }
  return -1;
}

int64_t pack_f8_blocks(const uint8_t* codes, const float* block_scales, F8Block* dst, int64_t n) {
  for (int64_t b = 0; b < n / kF8BlockElems; ++b) {
    if (!std::isfinite(block_scales[b])) return -2 - b;
    dst[b].scale = block_scales[b];
    const uint8_t* c = codes + b * kF8BlockElems;
    for (int i = 0; i < kF8BlockElems; ++i) {
      if ((c[i] & 0x7f) == 0x7f) return b * kF8BlockElems + i;
      dst[b].codes[i] = c[i];
    }
  }
  return -1;
}

void dequantize_f8_blocks(const F8Block* src, float* dst, int64_t n) {
  const auto& table = f8e4m3_table();
  for (int64_t b = 0; b < n / kF8BlockElems; ++b) {
    for (int i = 0; i < kF8BlockElems; ++i) dst[b * kF8BlockElems + i] = table[src[b].codes[i]] * src[b].scale;
  }
}

void split_f8_rows(const F8Block* src, int64_t rows, int64_t k, uint8_t* dst) {
  const int64_t nb = k / kF8BlockElems;
  for (int64_t r = 0; r < rows; ++r, src += nb) {
    uint8_t* codes = dst + r * nb * static_cast<int64_t>(sizeof(F8Block));
    uint8_t* scales = codes + k;
    for (int64_t b = 0; b < nb; ++b) {
      std::memcpy(codes + b * kF8BlockElems, src[b].codes, kF8BlockElems);
      std::memcpy(scales + b * 4, &src[b].scale, 4);
    }
  }
}

void join_f8_rows(const uint8_t* src, int64_t rows, int64_t k, F8Block* dst) {
  const int64_t nb = k / kF8BlockElems;
  for (int64_t r = 0; r < rows; ++r, dst += nb) {
    const uint8_t* codes = src + r * nb * static_cast<int64_t>(sizeof(F8Block));
    const uint8_t* scales = codes + k;
    for (int64_t b = 0; b < nb; ++b) {
      std::memcpy(dst[b].codes, codes + b * kF8BlockElems, kF8BlockElems);
      std::memcpy(&dst[b].scale, scales + b * 4, 4);
    }
  }
}

}  // namespace deepinfer
