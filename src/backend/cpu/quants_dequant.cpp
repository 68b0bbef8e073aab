// Dequantisation of every supported weight format, and the scalar quantisers
// of the 8-bit activation formats.
//
// The results equal the gguf reference bit for bit even when the compiler
// fuses `d * q + m` into one FMA: wherever a product is followed by an add or
// subtract, it is an f16 scale (11-bit significand) times small integer scales
// and quants, at most 22 significant bits, so it is exact in float and only
// the add or subtract rounds, fused or not.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/quants_internal.h"
#include "core/half.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace deepinfer::cpu::quants {

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(v));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ4_0>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    int q[kQK];
    unpack_nibbles(b[i].qs, q);
    for (int l = 0; l < kQK; ++l) dst[l] = d * static_cast<float>(q[l] - 8);
  }
}

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ4_1>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    const float m = f16_to_f32(b[i].m);
    int q[kQK];
    unpack_nibbles(b[i].qs, q);
    for (int l = 0; l < kQK; ++l) dst[l] = d * static_cast<float>(q[l]) + m;
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ5_0>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    int q[kQK];
    unpack_nibbles(b[i].qs, q);
    add_high_bits(b[i].qh, q);
    for (int l = 0; l < kQK; ++l) dst[l] = d * static_cast<float>(q[l] - 16);
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ5_1>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    const float m = f16_to_f32(b[i].m);
    int q[kQK];
    unpack_nibbles(b[i].qs, q);
    add_high_bits(b[i].qh, q);
    for (int l = 0; l < kQK; ++l) dst[l] = d * static_cast<float>(q[l]) + m;
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ8_0>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int l = 0; l < kQK; ++l) dst[l] = d * static_cast<float>(b[i].qs[l]);
  }
}

void dequantize_q2_k(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ2_K>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const float dmin = f16_to_f32(b[i].dmin);
    for (int e = 0; e < kQKK; e += 16, dst += 16) {
      const int h = e / 128, k = (e % 128) / 32, l0 = e % 32;
      const uint8_t sc = b[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0xF);
      const float ml = dmin * static_cast<float>(sc >> 4);
      const uint8_t* qs = b[i].qs + 32 * h + l0;
      for (int l = 0; l < 16; ++l) dst[l] = dl * static_cast<float>((qs[l] >> (2 * k)) & 3) - ml;
    }
  }
}

void dequantize_q3_k(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ3_K>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int e = 0; e < kQKK; e += 16, dst += 16) {
      const int h = e / 128, k = (e % 128) / 32, l0 = e % 32, bit = e / 32;
      const float dl = d * static_cast<float>(k3_scale(b[i].scales, e / 16));
      const uint8_t* qs = b[i].qs + 32 * h + l0;
      const uint8_t* hm = b[i].hmask + l0;
      for (int l = 0; l < 16; ++l) {
        const int q = ((qs[l] >> (2 * k)) & 3) - (((hm[l] >> bit) & 1) ? 0 : 4);
        dst[l] = dl * static_cast<float>(q);
      }
    }
  }
}

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ4_K>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const float dmin = f16_to_f32(b[i].dmin);
    for (int j = 0; j < 8; ++j, dst += 32) {
      int sc, m;
      k4_scale_min(b[i].scales, j, sc, m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      const uint8_t* qs = b[i].qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      for (int l = 0; l < 32; ++l) dst[l] = d1 * static_cast<float>((qs[l] >> shift) & 0xF) - m1;
    }
  }
}

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ5_K>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const float dmin = f16_to_f32(b[i].dmin);
    for (int j = 0; j < 8; ++j, dst += 32) {
      int sc, m;
      k4_scale_min(b[i].scales, j, sc, m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      const uint8_t* qs = b[i].qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0xF) | (((b[i].qh[l] >> j) & 1) << 4);
        dst[l] = d1 * static_cast<float>(q) - m1;
      }
    }
  }
}

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = blocks_of<BlockQ6_K>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int e = 0; e < kQKK; e += 16, dst += 16) {
      const int h = e / 128, k = (e % 128) / 32, l0 = e % 32;
      const float dl = d * static_cast<float>(b[i].scales[e / 16]);
      const uint8_t* ql = b[i].ql + 64 * h + 32 * (k & 1) + l0;
      const uint8_t* qh = b[i].qh + 32 * h + l0;
      const int shift = k >= 2 ? 4 : 0;
      for (int l = 0; l < 16; ++l) {
        const int q = (((ql[l] >> shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        dst[l] = dl * static_cast<float>(q);
      }
    }
  }
}

namespace scalar {

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    float amax = 0.0f;
    for (int l = 0; l < kQK; ++l) amax = std::max(amax, std::fabs(src[l]));
    b[i].d = q8_0_scale(amax);
    const float d = f16_to_f32(b[i].d);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int l = 0; l < kQK; ++l) {
      const float q = std::nearbyint(src[l] * id);
      b[i].qs[l] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
  }
}

void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  BlockQ8_0 q;
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    quantize_q8_0(src, &q, kQK);
    b[i].d = f16_to_f32(q.d);
    int sum = 0;
    for (int l = 0; l < kQK; ++l) sum += b[i].qs[l] = q.qs[l];
    b[i].s = b[i].d * static_cast<float>(sum);
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i, src += kQKK) {
    float amax = 0.0f;
    for (int l = 0; l < kQKK; ++l) amax = std::max(amax, std::fabs(src[l]));
    b[i].d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int l = 0; l < kQKK; ++l) {
      const float q = std::nearbyint(src[l] * id);
      b[i].qs[l] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
    for (int g = 0; g < kQKK / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b[i].qs[16 * g + l];
      b[i].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

}  // namespace scalar

uint16_t q8_0_scale(float amax) {
  uint16_t d = f32_to_f16(amax / 127.0f);
  if (f16_to_f32(d) * 127.0f < amax && d < 0x7BFF) ++d;
  return d;
}

}  // namespace deepinfer::cpu::quants
