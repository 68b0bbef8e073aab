#include "backend/cpu/gemm_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/isa_target.h"
#include "backend/cpu/quants.h"
#include "backend/cpu/quants_internal.h"
#include "core/error.h"
#include "core/half.h"

namespace deepinfer::cpu::amx {

namespace {

using namespace quants;

constexpr int kTile = 16;      // rows of every tile: weight rows per A tile, activation rows per B tile
constexpr int kActBlock = 32;  // elements per activation scale (Q8_1)

// Expands one weight row of k elements to int8 quants q[k] and, for every
// group of `group` elements, the scale dw and min mw (weight = dw * q + mw),
// written kTile floats apart: the columns of a tile's scale table.
using UnpackFn = void (*)(const void* row, int64_t k, int8_t* q, float* dw, float* mw);

struct Format {
  int group = 0;         // elements per weight scale: 32, or 16 (Q6_K)
  bool has_min = false;  // blocks carry a min (added through the activation block sums)
  UnpackFn unpack = nullptr;
};

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles 0-3 serve even groups, 4-7 odd ones, so that one group's sums are
// read back while the next group's products run: 0/4 weights (16 rows x
// group bytes), 1/5 activations (group/4 rows x 16 activations x 4 bytes,
// loaded twice: the 8-bit values, then their residuals), 2/6 and 3/7 the
// int32 sums of the values and of the residuals.
TileConfig tile_config(int group) {
  TileConfig c;
  for (int t : {0, 4}) c.rows[t] = kTile, c.colsb[t] = static_cast<uint16_t>(group);
  for (int t : {1, 5}) c.rows[t] = static_cast<uint8_t>(group / 4), c.colsb[t] = 64;
  for (int t : {2, 3, 6, 7}) c.rows[t] = kTile, c.colsb[t] = 64;
  return c;
}

DEEPINFER_ISA_BEGIN(DEEPINFER_AMX_FEATURES)

// Bytes of 16 packed nibbles: elements 0..15 (low nibbles) and 16..31 (high).
inline void nibbles32(const uint8_t* qs, __m128i& lo, __m128i& hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0xF);
  lo = _mm_and_si128(raw, mask);
  hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
}

// Q4_0, Q4_1, Q5_0, Q5_1: quants minus kOffset, the fifth bit from qh.
template <typename Block, int kOffset, bool kHighBits, bool kMin>
void unpack_32(const void* row, int64_t k, int8_t* q, float* dw, float* mw) {
  const auto* b = blocks_of<Block>(row);
  const __m128i offset = _mm_set1_epi8(static_cast<char>(kOffset));
  for (int64_t i = 0; i < k / kQK; ++i, q += kQK) {
    __m128i lo, hi;
    nibbles32(b[i].qs, lo, hi);
    if constexpr (kHighBits) {
      uint32_t qh;
      std::memcpy(&qh, b[i].qh, 4);
      const __m128i bit = _mm_set1_epi8(0x10);  // bit 4 is clear: adding it sets it
      lo = _mm_mask_add_epi8(lo, static_cast<__mmask16>(qh & 0xFFFF), lo, bit);
      hi = _mm_mask_add_epi8(hi, static_cast<__mmask16>(qh >> 16), hi, bit);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_sub_epi8(lo, offset));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm_sub_epi8(hi, offset));
    dw[i * kTile] = f16_to_f32(b[i].d);
    if constexpr (kMin) mw[i * kTile] = f16_to_f32(b[i].m);
  }
}

void unpack_q8_0(const void* row, int64_t k, int8_t* q, float* dw, float*) {
  const auto* b = blocks_of<BlockQ8_0>(row);
  for (int64_t i = 0; i < k / kQK; ++i, q += kQK) {
    std::memcpy(q, b[i].qs, kQK);
    dw[i * kTile] = f16_to_f32(b[i].d);
  }
}

// Q4_K and Q5_K: eight 32-element groups per super-block, each with a six-bit
// scale and min: weight = d * sc * q - dmin * m.
template <typename Block, bool kHighBits>
void unpack_k4(const void* row, int64_t k, int8_t* q, float* dw, float* mw) {
  const auto* b = blocks_of<Block>(row);
  const __m256i mask = _mm256_set1_epi8(0xF);
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    __m256i qh;
    if constexpr (kHighBits) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qh));
    for (int j = 0; j < 8; ++j, q += 32) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * (j / 2)));
      __m256i v = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, mask);
      if constexpr (kHighBits) {
        const __mmask32 set = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << j)));
        v = _mm256_mask_add_epi8(v, set, v, _mm256_set1_epi8(0x10));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v);
      int sc, m;
      k4_scale_min(b[i].scales, j, sc, m);
      dw[(i * 8 + j) * kTile] = d * static_cast<float>(sc);
      mw[(i * 8 + j) * kTile] = -(dmin * static_cast<float>(m));
    }
  }
}

// Q6_K: sixteen 16-element groups per super-block with signed 8-bit scales.
void unpack_q6_k(const void* row, int64_t k, int8_t* q, float* dw, float*) {
  const auto* b = blocks_of<BlockQ6_K>(row);
  const __m128i low4 = _mm_set1_epi8(0xF), low2 = _mm_set1_epi8(3), bias = _mm_set1_epi8(32);
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int e = 0; e < kQKK; e += 16, q += 16) {
      const int h = e / 128, kk = (e % 128) / 32, l0 = e % 32;
      __m128i ql = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].ql + 64 * h + 32 * (kk & 1) + l0));
      __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qh + 32 * h + l0));
      if (kk >= 2) ql = _mm_srli_epi16(ql, 4);
      ql = _mm_and_si128(ql, low4);
      qh = _mm_and_si128(_mm_srl_epi16(qh, _mm_cvtsi32_si128(2 * kk)), low2);
      const __m128i v = _mm_or_si128(ql, _mm_slli_epi16(qh, 4));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_sub_epi8(v, bias));
      dw[(i * 16 + e / 16) * kTile] = d * static_cast<float>(b[i].scales[e / 16]);
    }
  }
}

// Activations are carried as two int8 planes: q1, the Q8_1 quants (scale d),
// and q2, the rounding residual x - d q1 quantised with scale d / 128
// (|residual| <= d / 2, so |q2| <= 64). x = d (q1 + q2 / 128) to within
// d / 256: about 15 bits per block instead of 8, which keeps prefill logits as
// close to the exact ones as f32 activations do, for one more tile product
// and a shift-add per group. The int32 sums combine as 128 S1 + S2 (|S1| <=
// 32 * 128 * 128, far from overflow) and scale by dw * d / 128.

// q2 for one 32-element block; sum = the block's sum of x (for the min term).
void quantize_residual(const float* x, const int8_t* q1, float d, int8_t* q2, float& sum) {
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  sum = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
  if (d == 0.0f) {
    std::memset(q2, 0, kActBlock);
    return;
  }
  const __m512 vd = _mm512_set1_ps(d), inv = _mm512_set1_ps(128.0f / d);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int h = 0; h < 2; ++h) {
    const __m512 xv = h ? x1 : x0;
    const __m512 qv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q1 + 16 * h))));
    const __m512 r = _mm512_mul_ps(_mm512_fnmadd_ps(qv, vd, xv), inv);
    __m512i ri = _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    ri = _mm512_min_epi32(_mm512_max_epi32(ri, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16 * h), _mm512_cvtepi32_epi8(ri));
  }
}

// acc[r] holds weight row r over 16 activation rows; afterwards acc[i] holds
// activation row i over the 16 weight rows (a 16 x 16 transpose in registers:
// 32-bit and 64-bit interleaves within 128-bit lanes, then lane shuffles).
inline void transpose16(__m512* acc) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]);
  }
  // r[4i + c], 128-bit lane L: weight rows 4i..4i+3 of activation row 4L + c.
  __m512 r[16];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 lo01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), lo23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 hi01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE), hi23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    acc[c] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
    acc[4 + c] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
    acc[8 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
    acc[12 + c] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
  }
}

// One 16 x 16 block of the output: weight rows of one tile (wq: 16 rows of k
// int8, scale tables dw/mw) times 16 activation rows (a1/a2: their VNNI tile
// column in both planes, da: d / 128 per block, sa: sum of x per block), over
// all k. Written to out (activation row i at out + i * o_stride, weight row r
// at column r) for the first `acts` activation rows and `rows` weight rows,
// plus bias (null: none). cbuf: 4 x 256 int32 of scratch.
template <int kGroup, bool kMin>
void tile_product(const int8_t* wq, int64_t k, const float* dw, const float* mw, const int8_t* a1,
                  const int8_t* a2, const float* da, const float* sa, int32_t* cbuf, float* out, int64_t o_stride,
                  int acts, int rows, const float* bias) {
  __m512 acc[kTile];
#pragma GCC unroll 16
  for (int r = 0; r < kTile; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t groups = k / kGroup;
  auto scale_in = [&](const int32_t* c1, const int32_t* c2, int64_t g) {
    const int64_t ab = g * kGroup / kActBlock;
    const __m512 dav = _mm512_load_ps(da + ab * kTile);
    const __m512 sav = kMin ? _mm512_load_ps(sa + ab * kTile) : _mm512_setzero_ps();
    const float* dwg = dw + g * kTile;
    const float* mwg = mw + g * kTile;
#pragma GCC unroll 16
    for (int r = 0; r < kTile; ++r) {
      const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c1 + r * kTile), 7),
                                         _mm512_load_si512(c2 + r * kTile));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dwg[r]), dav), acc[r]);
      if constexpr (kMin) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(mwg[r]), sav, acc[r]);
    }
  };
  constexpr int64_t kActBytesPerGroup = kGroup / 4 * 64;  // rows of the B operand per group
  constexpr int kSums = kTile * kTile;
  for (int64_t g = 0; g < groups; g += 2) {
    const bool pair = g + 1 < groups;
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(0, wq + g * kGroup, k);
    _tile_loadd(1, a1 + g * kActBytesPerGroup, 64);
    _tile_dpbssd(2, 0, 1);
    _tile_loadd(1, a2 + g * kActBytesPerGroup, 64);
    _tile_dpbssd(3, 0, 1);
    if (pair) {
      _tile_zero(6);
      _tile_zero(7);
      _tile_loadd(4, wq + (g + 1) * kGroup, k);
      _tile_loadd(5, a1 + (g + 1) * kActBytesPerGroup, 64);
      _tile_dpbssd(6, 4, 5);
      _tile_loadd(5, a2 + (g + 1) * kActBytesPerGroup, 64);
      _tile_dpbssd(7, 4, 5);
    }
    _tile_stored(2, cbuf, 64);
    _tile_stored(3, cbuf + kSums, 64);
    scale_in(cbuf, cbuf + kSums, g);
    if (pair) {
      _tile_stored(6, cbuf + 2 * kSums, 64);
      _tile_stored(7, cbuf + 3 * kSums, 64);
      scale_in(cbuf + 2 * kSums, cbuf + 3 * kSums, g + 1);
    }
  }
  transpose16(acc);
  const __mmask16 cols = static_cast<__mmask16>((1u << rows) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(cols, bias) : _mm512_setzero_ps();
  for (int i = 0; i < acts; ++i) _mm512_mask_storeu_ps(out + i * o_stride, cols, _mm512_add_ps(acc[i], b));
}

using TileProductFn = void (*)(const int8_t*, int64_t, const float*, const float*, const int8_t*, const int8_t*,
                               const float*, const float*, int32_t*, float*, int64_t, int, int, const float*);

void load_tile_config(const TileConfig& c) { _tile_loadconfig(&c); }
void release_tiles() { _tile_release(); }

DEEPINFER_ISA_END

const Format* format_of(DType weight) {
  static const Format q4_0{32, false, unpack_32<BlockQ4_0, 8, false, false>};
  static const Format q4_1{32, true, unpack_32<BlockQ4_1, 0, false, true>};
  static const Format q5_0{32, false, unpack_32<BlockQ5_0, 16, true, false>};
  static const Format q5_1{32, true, unpack_32<BlockQ5_1, 0, true, true>};
  static const Format q8_0{32, false, unpack_q8_0};
  static const Format q4_k{32, true, unpack_k4<BlockQ4_K, false>};
  static const Format q5_k{32, true, unpack_k4<BlockQ5_K, true>};
  static const Format q6_k{16, false, unpack_q6_k};
  switch (weight) {
    case DType::Q4_0: return &q4_0;
    case DType::Q4_1: return &q4_1;
    case DType::Q5_0: return &q5_0;
    case DType::Q5_1: return &q5_1;
    case DType::Q8_0: return &q8_0;
    case DType::Q4_K: return &q4_k;
    case DType::Q5_K: return &q5_k;
    case DType::Q6_K: return &q6_k;
    default: return nullptr;
  }
}

TileProductFn tile_product_for(const Format& f) {
  if (f.group == 16) return tile_product<16, false>;
  return f.has_min ? tile_product<32, true> : tile_product<32, false>;
}

size_t round64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

bool supports(DType weight) { return format_of(weight) != nullptr; }

void linear(ThreadPool& pool, ScratchBuffer& act_scratch, std::vector<ScratchBuffer>& thread_scratch,
            const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor out) {
  const Format* format = format_of(weight.dtype());
  DI_CHECK(format != nullptr && active_isa() == CpuIsa::Amx, "AMX GEMM called for {} on a {} machine",
           dtype_name(weight.dtype()), isa_name(active_isa()));
  const int64_t n = x.size(0), k = x.size(1), m = weight.size(0);
  DI_CHECK(k % dtype_info(weight.dtype()).block_elems == 0 && k % kActBlock == 0,
           "AMX GEMM: row length {} is not a multiple of the {} block", k, dtype_name(weight.dtype()));

  // Activations: two int8 planes per 32-element block (see quantize_residual), in VNNI tile order.
  const int64_t act_tiles = (n + kTile - 1) / kTile;
  const int64_t act_blocks = k / kActBlock;
  const size_t q_bytes = static_cast<size_t>(act_tiles * kTile * k);
  const size_t scale_bytes = round64(static_cast<size_t>(act_tiles * act_blocks * kTile) * sizeof(float));
  char* base = act_scratch.get<char>(2 * q_bytes + 2 * scale_bytes);
  auto* aq1 = reinterpret_cast<int8_t*>(base);
  auto* aq2 = reinterpret_cast<int8_t*>(base + q_bytes);
  auto* da = reinterpret_cast<float*>(base + 2 * q_bytes);
  auto* sa = reinterpret_cast<float*>(base + 2 * q_bytes + scale_bytes);
  if (n % kTile != 0) {  // padding rows of the last tile multiply as zeros
    const int64_t t = act_tiles - 1;
    std::memset(aq1 + t * kTile * k, 0, static_cast<size_t>(kTile * k));
    std::memset(aq2 + t * kTile * k, 0, static_cast<size_t>(kTile * k));
    std::memset(da + t * act_blocks * kTile, 0, static_cast<size_t>(act_blocks * kTile) * sizeof(float));
    std::memset(sa + t * act_blocks * kTile, 0, static_cast<size_t>(act_blocks * kTile) * sizeof(float));
  }
  const QuantKernels& act_kernels = quant_kernels(DType::Q8_0);  // Q8_1 activations
  const size_t act_row_bytes = row_bytes(act_kernels.act, k);
  const char* xb = static_cast<const char*>(x.data());
  const int64_t x_stride = x.stride_bytes(0);
  pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread) {
    auto* row = thread_scratch[static_cast<size_t>(thread)].get<BlockQ8_1>(act_row_bytes + kActBlock);
    auto* residual = reinterpret_cast<int8_t*>(reinterpret_cast<char*>(row) + act_row_bytes);
    for (int64_t i = begin; i < end; ++i) {
      const auto* xi = reinterpret_cast<const float*>(xb + i * x_stride);
      act_kernels.quantize_act(xi, row, k);
      const int64_t t = i / kTile, r = i % kTile;
      int8_t* col1 = aq1 + t * kTile * k + r * 4;
      int8_t* col2 = aq2 + t * kTile * k + r * 4;
      for (int64_t b = 0; b < act_blocks; ++b) {
        float sum;
        quantize_residual(xi + b * kActBlock, row[b].qs, row[b].d, residual, sum);
        for (int j = 0; j < kActBlock / 4; ++j) {
          std::memcpy(col1 + (b * 8 + j) * 64, row[b].qs + 4 * j, 4);
          std::memcpy(col2 + (b * 8 + j) * 64, residual + 4 * j, 4);
        }
        da[(t * act_blocks + b) * kTile + r] = row[b].d * (1.0f / 128.0f);
        sa[(t * act_blocks + b) * kTile + r] = sum;
      }
    }
  }, 16);

  // Weights: 16 rows at a time, expanded once and multiplied with every activation tile.
  const int64_t groups = k / format->group;
  const size_t wq_bytes = static_cast<size_t>(kTile * k);
  const size_t table_bytes = round64(static_cast<size_t>(groups * kTile) * sizeof(float));
  const size_t scratch_bytes = wq_bytes + 2 * table_bytes + 4 * kTile * kTile * sizeof(int32_t);
  const TileConfig config = tile_config(format->group);
  const TileProductFn product = tile_product_for(*format);
  const char* wb = static_cast<const char*>(weight.data());
  const int64_t w_stride = weight.stride_bytes(0);
  char* ob = static_cast<char*>(out.data());
  const int64_t o_stride = out.stride_bytes(0);
  const float* bias_data = bias.defined() ? bias.data_as<float>() : nullptr;
  const int64_t weight_tiles = (m + kTile - 1) / kTile;
  pool.parallel_for(weight_tiles, [&](int64_t begin, int64_t end, int thread) {
    char* s = thread_scratch[static_cast<size_t>(thread)].get<char>(round64(wq_bytes) + scratch_bytes);
    auto* wq = reinterpret_cast<int8_t*>(s);
    auto* dw = reinterpret_cast<float*>(s + round64(wq_bytes));
    auto* mw = reinterpret_cast<float*>(s + round64(wq_bytes) + table_bytes);
    auto* cbuf = reinterpret_cast<int32_t*>(s + round64(wq_bytes) + 2 * table_bytes);
    load_tile_config(config);
    for (int64_t wt = begin; wt < end; ++wt) {
      const int64_t j0 = wt * kTile;
      const int64_t rows = std::min<int64_t>(kTile, m - j0);
      for (int64_t r = 0; r < kTile; ++r) {
        if (r < rows) {
          format->unpack(wb + (j0 + r) * w_stride, k, wq + r * k, dw + r, mw + r);
        } else {  // rows past the matrix multiply as zeros
          std::memset(wq + r * k, 0, static_cast<size_t>(k));
          for (int64_t g = 0; g < groups; ++g) dw[g * kTile + r] = mw[g * kTile + r] = 0.0f;
        }
      }
      for (int64_t t = 0; t < act_tiles; ++t) {
        const int acts = static_cast<int>(std::min<int64_t>(kTile, n - t * kTile));
        product(wq, k, dw, mw, aq1 + t * kTile * k, aq2 + t * kTile * k, da + t * act_blocks * kTile,
                sa + t * act_blocks * kTile, cbuf, reinterpret_cast<float*>(ob + t * kTile * o_stride) + j0,
                o_stride / static_cast<int64_t>(sizeof(float)), acts, static_cast<int>(rows),
                bias_data ? bias_data + j0 : nullptr);
      }
    }
    release_tiles();
  }, 1);
}

}  // namespace deepinfer::cpu::amx
