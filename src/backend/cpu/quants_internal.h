// Block layouts (byte for byte as in GGUF files) and the individual kernels
// behind quant_kernels(); only the quants*.cpp files include this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace deepinfer::cpu::quants {

constexpr int kQK = 32;    // elements per block of the 32-element formats
constexpr int kQKK = 256;  // elements per super-block of the K-quants

// f16 fields are kept as raw bits: the files store IEEE half floats.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];  // element i in the low nibble of qs[i], i + 16 in the high one
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit i (little endian u32) = bit 4 of element i
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// The activations of the 32-element formats' dots: Q8_0's quants and
// (f16-rounded) scale, kept as f32 next to s = d * sum(qs), so that a weight
// block's offset (Q4_0/Q5_0) or min (Q4_1/Q5_1) term is one multiply-add
// instead of a second byte dot per weight row.
struct BlockQ8_1 {
  float d;
  float s;
  int8_t qs[kQK];
};
// K-quants: a 256-element super-block with one f16 scale (and min scale), and
// small integer scales per 16- or 32-element sub-block.
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];  // low nibble scale, high nibble min, per 16 elements
  uint8_t qs[kQKK / 4];       // element 128h+32k+l: bits 2k..2k+1 of qs[32h+l]
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];  // element 32b+l: bit b of hmask[l]; a clear bit subtracts 4
  uint8_t qs[kQKK / 4];     // low two bits, as in Q2_K
  uint8_t scales[12];       // 16 six-bit scales, biased by 32
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];     // 8 six-bit scales and 8 six-bit mins, per 32 elements
  uint8_t qs[kQKK / 2];   // element 64j+l: low nibble of qs[32j+l]; 64j+32+l: high nibble
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];   // element 32b+l: bit b of qh[l] is bit 4
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];   // element 128h+32k+l: nibble of ql[64h+32(k&1)+l], high if k>=2
  uint8_t qh[kQKK / 4];   // bits 2k..2k+1 of qh[32h+l] are bits 4..5; value biased by 32
  int8_t scales[kQKK / 16];
  uint16_t d;
};
// Activation format for the K-quant dots; bsums lets the dots fold in the mins
// and biases without touching the activations again.
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];  // sum of each 16 consecutive qs
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 40);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// Six-bit scale j and min j of a Q4_K/Q5_K scales array.
inline void k4_scale_min(const uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Signed scale j (-32..31) of a Q3_K scales array.
inline int k3_scale(const uint8_t* s, int j) {
  int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  int high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

using DequantizeFn = void (*)(const void*, float*, int64_t);
using QuantizeFn = void (*)(const float*, void*, int64_t);
using DotFn = float (*)(const void*, const void*, int64_t);

// Exact dequantisation (same floats as the gguf reference).
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q2_k(const void* src, float* dst, int64_t n);
void dequantize_q3_k(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);
void dequantize_f8_b64(const void* src, float* dst, int64_t n);

// f16 scale of a 32-element activation block (Q8_0's format; Q8_1 keeps it
// as f32): the smallest one with 127 * d >= amax, so that rounding never has
// to clip (d saturates at the largest finite f16).
uint16_t q8_0_scale(float amax);

// Activation quantisers: symmetric 8-bit with one scale per block.
// Helpers shared by the portable kernels (and blocks_of by all of them).
template <typename Block>
const Block* blocks_of(const void* p) {
  return static_cast<const Block*>(p);
}

// Low and high nibbles of 16 bytes: elements 0..15 and 16..31 of a block.
inline void unpack_nibbles(const uint8_t* qs, int* q) {
  for (int l = 0; l < 16; ++l) {
    q[l] = qs[l] & 0xF;
    q[l + 16] = qs[l] >> 4;
  }
}

// ORs the fifth bit of each element (Q5 formats) from 4 little-endian bytes.
inline void add_high_bits(const uint8_t* qh_bytes, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int l = 0; l < kQK; ++l) q[l] |= static_cast<int>((qh >> l) & 1u) << 4;
}

#if defined(__AVX2__)
// Software prefetch into L2 of [p, p + bytes) shifted kPrefetchAhead bytes
// ahead, issued by the AVX2 and AVX-512 dot products for the weights they are
// about to read: the hardware prefetchers alone leave one core well short of
// its streaming-read bandwidth on these kernels. Past a row's end it reaches
// into the next row, which a matrix-vector product reads next (prefetches
// never fault). Defined outside any AVX-512 region: baseline code.
constexpr size_t kPrefetchAhead = 2048;
inline void prefetch_weights(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p) + kPrefetchAhead;
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
}
#endif

namespace scalar {
void quantize_q8_0(const float* src, void* dst, int64_t n);
void quantize_q8_1(const float* src, void* dst, int64_t n);
void quantize_q8_k(const float* src, void* dst, int64_t n);
}  // namespace scalar

// One set of dot products per instruction set; weight row first, activation second.
#define DEEPINFER_QUANT_DOTS                             \
  float dot_f32(const void* w, const void* x, int64_t n);  \
  float dot_f16(const void* w, const void* x, int64_t n);  \
  float dot_bf16(const void* w, const void* x, int64_t n); \
  float dot_q4_0(const void* w, const void* x, int64_t n); \
  float dot_q4_1(const void* w, const void* x, int64_t n); \
  float dot_q5_0(const void* w, const void* x, int64_t n); \
  float dot_q5_1(const void* w, const void* x, int64_t n); \
  float dot_q8_0(const void* w, const void* x, int64_t n); \
  float dot_q2_k(const void* w, const void* x, int64_t n); \
  float dot_q3_k(const void* w, const void* x, int64_t n); \
  float dot_q4_k(const void* w, const void* x, int64_t n); \
  float dot_q5_k(const void* w, const void* x, int64_t n); \
  float dot_q6_k(const void* w, const void* x, int64_t n);  \
  float dot_f8_b64(const void* w, const void* x, int64_t n);

namespace scalar {
DEEPINFER_QUANT_DOTS
}  // namespace scalar

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DEEPINFER_QUANTS_AVX2 1
namespace avx2 {
DEEPINFER_QUANT_DOTS
void quantize_q8_1(const float* src, void* dst, int64_t n);
void quantize_q8_k(const float* src, void* dst, int64_t n);
// Vectorised dequantisation (quants_dequant_avx2.cpp), bit for bit the portable one.
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);
void dequantize_f8_b64(const void* src, float* dst, int64_t n);

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

// Sums of 4 adjacent products of unsigned bytes u and signed bytes s, as 8
// int32. maddubs saturates at 16 bits: callers keep 2 * u * |s| below 32768.
inline __m256i dot_u8_i8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// The same for two signed vectors: move the sign of x onto y. x may hold -128
// (weights), y must not (activations are clamped to +-127).
inline __m256i dot_i8_i8(__m256i x, __m256i y) {
  return dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}
}  // namespace avx2
#endif

// AVX-512 + VNNI kernels (quants_dot_avx512*.cpp). Those files are compiled
// for the build's baseline and switch their own functions to AVX-512 with
// `#pragma GCC target`, so that no inline function they share with the rest
// of the program (the standard library, core/) is emitted with instructions
// an AVX2-only machine lacks; they run only where cpu_isa.h found AVX-512.
#if defined(DEEPINFER_QUANTS_AVX2) && defined(__x86_64__) && defined(__GNUC__)
#define DEEPINFER_QUANTS_AVX512 1
namespace avx512 {
DEEPINFER_QUANT_DOTS
void quantize_q8_1(const float* src, void* dst, int64_t n);
void quantize_q8_k(const float* src, void* dst, int64_t n);
}  // namespace avx512
#endif

#undef DEEPINFER_QUANT_DOTS

}  // namespace deepinfer::cpu::quants
