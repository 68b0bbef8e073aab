// Portable dot products: each weight block is unpacked to small integers and
// multiplied with the 8-bit activation block in int32; one float multiply-add
// per block (or per super-block) applies the scales. These are the reference
// for the vectorised kernels and the fallback on CPUs without AVX2.
#include <cstring>

#include "backend/cpu/quants_internal.h"
#include "core/half.h"

namespace deepinfer::cpu::quants::scalar {

namespace {

inline int dot_i32(const int* q, const int8_t* a, int len) {
  int sum = 0;
  for (int l = 0; l < len; ++l) sum += q[l] * a[l];
  return sum;
}

// The 32-element formats store unsigned quants against Q8_1 activations:
// Q4_0/Q5_0 subtract a fixed offset, Q4_1/Q5_1 add a per-block min, either
// applied through the activation block's scaled sum s.
template <typename Block, bool kHasMin, int kOffset, bool kHighBits>
float dot_legacy(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<Block>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int q[kQK];
    unpack_nibbles(b[i].qs, q);
    if constexpr (kHighBits) add_high_bits(b[i].qh, q);
    const int qa = dot_i32(q, a[i].qs, kQK);
    const float dw = f16_to_f32(b[i].d);
    if constexpr (kHasMin) {
      acc += dw * a[i].d * static_cast<float>(qa) + f16_to_f32(b[i].m) * a[i].s;
    } else {
      acc += dw * a[i].d * static_cast<float>(qa) - static_cast<float>(kOffset) * dw * a[i].s;
    }
  }
  return acc;
}

}  // namespace

float dot_f32(const void* w, const void* x, int64_t n) {
  const auto* wf = static_cast<const float*>(w);
  const auto* xf = static_cast<const float*>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += wf[i] * xf[i];
  return acc;
}

float dot_f16(const void* w, const void* x, int64_t n) {
  const auto* wh = static_cast<const uint16_t*>(w);
  const auto* xf = static_cast<const float*>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += f16_to_f32(wh[i]) * xf[i];
  return acc;
}

float dot_bf16(const void* w, const void* x, int64_t n) {
  const auto* wh = static_cast<const uint16_t*>(w);
  const auto* xf = static_cast<const float*>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += bf16_to_f32(wh[i]) * xf[i];
  return acc;
}

float dot_q4_0(const void* w, const void* x, int64_t n) {
  return dot_legacy<BlockQ4_0, false, 8, false>(w, x, n);
}
float dot_q4_1(const void* w, const void* x, int64_t n) {
  return dot_legacy<BlockQ4_1, true, 0, false>(w, x, n);
}
float dot_q5_0(const void* w, const void* x, int64_t n) {
  return dot_legacy<BlockQ5_0, false, 16, true>(w, x, n);
}
float dot_q5_1(const void* w, const void* x, int64_t n) {
  return dot_legacy<BlockQ5_1, true, 0, true>(w, x, n);
}

float dot_q8_0(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ8_0>(w);
  const auto* a = blocks_of<BlockQ8_1>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sum = 0;
    for (int l = 0; l < kQK; ++l) sum += b[i].qs[l] * a[i].qs[l];
    acc += f16_to_f32(b[i].d) * a[i].d * static_cast<float>(sum);
  }
  return acc;
}

float dot_q2_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ2_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0, msum = 0;
    for (int g = 0; g < kQKK / 16; ++g) {
      const int e = 16 * g, h = e / 128, k = (e % 128) / 32;
      const uint8_t* qs = b[i].qs + 32 * h + e % 32;
      int q[16];
      for (int l = 0; l < 16; ++l) q[l] = (qs[l] >> (2 * k)) & 3;
      isum += (b[i].scales[g] & 0xF) * dot_i32(q, a[i].qs + e, 16);
      msum += (b[i].scales[g] >> 4) * a[i].bsums[g];
    }
    acc += a[i].d * (f16_to_f32(b[i].d) * static_cast<float>(isum) -
                     f16_to_f32(b[i].dmin) * static_cast<float>(msum));
  }
  return acc;
}

float dot_q3_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ3_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0;
    for (int g = 0; g < kQKK / 16; ++g) {
      const int e = 16 * g, h = e / 128, k = (e % 128) / 32, l0 = e % 32, bit = e / 32;
      int q[16];
      for (int l = 0; l < 16; ++l) {
        q[l] = ((b[i].qs[32 * h + l0 + l] >> (2 * k)) & 3) -
               (((b[i].hmask[l0 + l] >> bit) & 1) ? 0 : 4);
      }
      isum += k3_scale(b[i].scales, g) * dot_i32(q, a[i].qs + e, 16);
    }
    acc += a[i].d * f16_to_f32(b[i].d) * static_cast<float>(isum);
  }
  return acc;
}

namespace {
template <typename Block, bool kHighBits>
float dot_k4_family(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<Block>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      k4_scale_min(b[i].scales, j, sc, m);
      const uint8_t* qs = b[i].qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      int q[32];
      for (int l = 0; l < 32; ++l) {
        q[l] = (qs[l] >> shift) & 0xF;
        if constexpr (kHighBits) q[l] |= ((b[i].qh[l] >> j) & 1) << 4;
      }
      isum += sc * dot_i32(q, a[i].qs + 32 * j, 32);
      msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    acc += a[i].d * (f16_to_f32(b[i].d) * static_cast<float>(isum) -
                     f16_to_f32(b[i].dmin) * static_cast<float>(msum));
  }
  return acc;
}
}  // namespace

float dot_q4_k(const void* w, const void* x, int64_t n) {
  return dot_k4_family<BlockQ4_K, false>(w, x, n);
}
float dot_q5_k(const void* w, const void* x, int64_t n) {
  return dot_k4_family<BlockQ5_K, true>(w, x, n);
}

float dot_q6_k(const void* w, const void* x, int64_t n) {
  const auto* b = blocks_of<BlockQ6_K>(w);
  const auto* a = blocks_of<BlockQ8_K>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int isum = 0;
    for (int g = 0; g < kQKK / 16; ++g) {
      const int e = 16 * g, h = e / 128, k = (e % 128) / 32, l0 = e % 32;
      const uint8_t* ql = b[i].ql + 64 * h + 32 * (k & 1) + l0;
      const uint8_t* qh = b[i].qh + 32 * h + l0;
      const int shift = k >= 2 ? 4 : 0;
      int q[16];
      for (int l = 0; l < 16; ++l) {
        q[l] = (((ql[l] >> shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
      }
      isum += b[i].scales[g] * dot_i32(q, a[i].qs + e, 16);
    }
    acc += a[i].d * f16_to_f32(b[i].d) * static_cast<float>(isum);
  }
  return acc;
}

}  // namespace deepinfer::cpu::quants::scalar
