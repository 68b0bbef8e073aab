// Row-wise and element-wise kernels of the CUDA backend: embedding, RMSNorm
// (optionally fused with the residual add), gated activations, add/scale, row
// gathers, bias add and conversions (RoPE and KV-cache writes: cuda_rope_kv.cu).
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::cuda {

bool chained_launch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DEEPINFER_PDL");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return enabled;
}

namespace {

cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s); }

__global__ void zero_rows_at_position_kernel(RowView x, int elem_bytes, const int32_t* positions, int32_t position) {
  const int64_t r = blockIdx.x;
  if (positions[r] != position) return;
  char* row = row_ptr(x, r);
  for (int64_t i = threadIdx.x; i < x.cols * elem_bytes; i += blockDim.x) row[i] = 0;
}

// One block per row: the row's finite maximum, then the sum of exp(l - max)
// over finite logits, both reduced through warps and shared memory.
__global__ void token_probs_kernel(const float* logits, int64_t vocab, int64_t row_stride, const int32_t* tokens,
                                   float* out) {
  __shared__ float partial[32];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * row_stride;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (isfinite(l[i])) m = fmaxf(m, l[i]);
  }
  m = warp_max(m);
  if (lane == 0) partial[warp] = m;
  __syncthreads();
  m = lane < warps ? partial[lane] : -INFINITY;
  m = warp_max(m);
  __syncthreads();
  float s = 0.0f;
  if (isfinite(m)) {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (isfinite(l[i])) s += expf(l[i] - m);
    }
  }
  s = warp_sum(s);
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += partial[w];
  const int32_t t = tokens[r];
  out[r] = (!isfinite(m) || t < 0 || t >= vocab || !isfinite(l[t]) || total <= 0.0f) ? 0.0f : expf(l[t] - m) / total;
}

__global__ void sanitize_ids_kernel(int32_t* ids, int64_t n, int64_t limit) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && (ids[i] < 0 || ids[i] >= limit)) ids[i] = 0;
}

template <typename TT, typename TO>
__global__ void embedding_kernel(const char* table, int64_t table_stride, int64_t first_id, int64_t rows,
                                 int64_t vocab, const int32_t* ids, RowView out, uint32_t* err) {
  wait_for_prior_kernel();
  release_next_kernel();
  int64_t i = blockIdx.x;
  int32_t id = ids[i];
  TO* o = row_as<TO>(out, i);
  const int64_t r = int64_t{id} - first_id;
  if (id < 0 || id >= vocab || r < 0 || r >= rows) {
    // An id of another rank's vocabulary slice is a zero row; one outside the vocabulary an error.
    if ((id < 0 || id >= vocab) && threadIdx.x == 0) atomicOr(err, kErrEmbeddingId);
    for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) o[c] = from_f<TO>(0.0f);
    return;
  }
  const TT* row = reinterpret_cast<const TT*>(table + r * table_stride);
  for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) o[c] = from_f<TO>(to_f(row[c]));
}

// One row per warp (short rows) or per block (long rows); sum of squares in f32.
// With add_residual, residual += x first (rounded to T, as the model keeps it)
// and the normalised value is taken of the updated residual.
template <typename T, bool kWarpPerRow>
__global__ void rms_norm_kernel(RowView x, RowView residual, const float* weight, float eps, float offset,
                                RowView out, bool add_residual) {
  wait_for_prior_kernel();
  release_next_kernel();
  __shared__ float partial[32];
  int64_t r;
  int lane_count, lane;
  if (kWarpPerRow) {
    r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= x.rows) return;
    lane_count = 32;
    lane = threadIdx.x % 32;
  } else {
    r = blockIdx.x;
    lane_count = blockDim.x;
    lane = threadIdx.x;
  }
  const T* xr = row_as<T>(x, r);
  T* src = const_cast<T*>(xr);
  float ss = 0.0f;
  if (add_residual) {
    T* res = row_as<T>(residual, r);
    for (int64_t c = lane; c < x.cols; c += lane_count) {
      T v = from_f<T>(to_f(res[c]) + to_f(xr[c]));
      res[c] = v;
      float f = to_f(v);
      ss += f * f;
    }
    src = res;
  } else {
    for (int64_t c = lane; c < x.cols; c += lane_count) {
      float f = to_f(xr[c]);
      ss += f * f;
    }
  }
  ss = warp_sum(ss);
  if (!kWarpPerRow) {
    if (lane % 32 == 0) partial[lane / 32] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int w = 0; w < lane_count / 32; ++w) ss += partial[w];
  }
  float inv = 1.0f / sqrtf(ss / static_cast<float>(x.cols) + eps);
  T* o = row_as<T>(out, r);
  for (int64_t c = lane; c < x.cols; c += lane_count) o[c] = from_f<T>(to_f(src[c]) * inv * (weight[c] + offset));
}

// Rows of a 16-bit type in 16-byte chunks: each row is shared by kWarps warps
// (a 256-thread block holds 8 / kWarps rows), each lane keeps at most
// kMaxChunks chunks in registers, so the row is read once, all of a lane's
// loads are in flight together and the residual is written once. The sum of
// squares needs a shared-memory step only when a row spans several warps.
constexpr int kNormThreads = 256;
constexpr int kMaxChunks = kNormMaxChunks;

template <typename T, int kWarps>
__global__ void __launch_bounds__(kNormThreads) rms_norm_rows_kernel(RowView x, RowView residual,
                                                                     const float* weight, float eps, float offset,
                                                                     RowView out, bool add_residual) {
  wait_for_prior_kernel();
  release_next_kernel();
  constexpr int kRowsPerBlock = kNormThreads / 32 / kWarps;
  __shared__ float partial[kNormThreads / 32];
  const int warp = threadIdx.x / 32;
  const int row_in_block = warp / kWarps;
  const int lane = (warp % kWarps) * 32 + threadIdx.x % 32;  // lane within the row's warps
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + row_in_block;
  const bool live = r < x.rows;
  const int chunks = static_cast<int>(x.cols / 8);
  float v[kMaxChunks][8];
  float ss = 0.0f;
  if (live) {
    const uint4* xr = reinterpret_cast<const uint4*>(row_ptr(x, r));
    uint4* res = add_residual ? reinterpret_cast<uint4*>(row_ptr(residual, r)) : nullptr;
    uint4 a[kMaxChunks], b[kMaxChunks];
#pragma unroll
    for (int q = 0; q < kMaxChunks; ++q) {
      const int c = lane + q * 32 * kWarps;
      if (c < chunks) {
        a[q] = xr[c];
        if (add_residual) b[q] = res[c];
      }
    }
#pragma unroll
    for (int q = 0; q < kMaxChunks; ++q) {
      const int c = lane + q * 32 * kWarps;
      if (c >= chunks) continue;
      const T* av = reinterpret_cast<const T*>(&a[q]);
      if (add_residual) {
        const T* bv = reinterpret_cast<const T*>(&b[q]);
        uint4 sum;
        T* sv = reinterpret_cast<T*>(&sum);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          sv[e] = from_f<T>(to_f(bv[e]) + to_f(av[e]));
          v[q][e] = to_f(sv[e]);
        }
        res[c] = sum;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[q][e] = to_f(av[e]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[q][e] * v[q][e];
    }
  }
  ss = warp_sum(ss);
  if (kWarps > 1) {
    if (threadIdx.x % 32 == 0) partial[warp] = ss;
    __syncthreads();
    ss = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ss += partial[row_in_block * kWarps + w];
  }
  if (!live) return;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(x.cols) + eps);
  uint4* o = reinterpret_cast<uint4*>(row_ptr(out, r));
#pragma unroll
  for (int q = 0; q < kMaxChunks; ++q) {
    const int c = lane + q * 32 * kWarps;
    if (c >= chunks) continue;
    const float4* wv = reinterpret_cast<const float4*>(weight) + 2 * c;
    const float4 w0 = wv[0], w1 = wv[1];
    const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    uint4 packed;
    T* pv = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int e = 0; e < 8; ++e) pv[e] = from_f<T>(v[q][e] * inv * (ws[e] + offset));
    o[c] = packed;
  }
}

// Element-wise kernels walk rows (grid y, strided) and columns (grid x and
// threads): the row address is computed once per row, never with a 64-bit
// division per element (which made these kernels compute-bound).
#define DI_FOR_EACH_ELEMENT(v)                                                                     \
  for (int64_t r = blockIdx.y; r < (v).rows; r += gridDim.y)                                      \
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < (v).cols;                 \
         c += int64_t{gridDim.x} * blockDim.x)

template <typename T>
__global__ void gated_kernel(RowView gate, RowView up, bool gelu, RowView out) {
  DI_FOR_EACH_ELEMENT(gate) {
    const float g = to_f(row_as<T>(gate, r)[c]), u = to_f(row_as<T>(up, r)[c]);
    row_as<T>(out, r)[c] = from_f<T>((gelu ? gelu_tanh(g) : silu(g)) * u);
  }
}

// 16-bit rows in 16-byte chunks: out = op(a, b) element-wise. A thread takes
// one chunk column and walks kRowUnroll rows per iteration, issuing all their
// loads before any store, so each thread keeps 2 x kRowUnroll x 16 bytes in
// flight (scalar 2-byte accesses left HBM mostly idle: 0.4 TB/s).
constexpr int kRowUnroll = 2;

struct GatedSilu {
  __device__ float operator()(float g, float u) const { return silu(g) * u; }
};
struct GatedGelu {
  __device__ float operator()(float g, float u) const { return gelu_tanh(g) * u; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename T, class Op>
__global__ void binary_vec_kernel(RowView a, RowView b, RowView out, Op op) {
  wait_for_prior_kernel();
  release_next_kernel();
  const int64_t chunks = a.cols / 8;
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= chunks) return;
  for (int64_t r0 = int64_t{blockIdx.y} * kRowUnroll; r0 < a.rows; r0 += int64_t{gridDim.y} * kRowUnroll) {
    uint4 va[kRowUnroll], vb[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      if (r0 + u < a.rows) {
        va[u] = reinterpret_cast<const uint4*>(row_ptr(a, r0 + u))[c];
        vb[u] = reinterpret_cast<const uint4*>(row_ptr(b, r0 + u))[c];
      }
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      if (r0 + u >= a.rows) break;
      const T* x = reinterpret_cast<const T*>(&va[u]);
      const T* y = reinterpret_cast<const T*>(&vb[u]);
      uint4 packed;
      T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = from_f<T>(op(to_f(x[e]), to_f(y[e])));
      reinterpret_cast<uint4*>(row_ptr(out, r0 + u))[c] = packed;
    }
  }
}

template <typename T>
__global__ void add_kernel(RowView a, RowView b, RowView out) {
  DI_FOR_EACH_ELEMENT(a) {
    row_as<T>(out, r)[c] = from_f<T>(to_f(row_as<T>(a, r)[c]) + to_f(row_as<T>(b, r)[c]));
  }
}

template <typename T>
__global__ void scale_kernel(RowView x, float factor, RowView out) {
  DI_FOR_EACH_ELEMENT(x) { row_as<T>(out, r)[c] = from_f<T>(to_f(row_as<T>(x, r)[c]) * factor); }
}

template <typename E>
__global__ void gather_kernel(RowView x, int64_t x_outer, int64_t sub, const int32_t* rows, RowView out,
                              uint32_t* err) {
  wait_for_prior_kernel();
  release_next_kernel();
  int64_t i = blockIdx.x / sub, s = blockIdx.x % sub;
  int32_t src = rows[i];
  E* o = row_as<E>(out, i * sub + s);
  if (src < 0 || src >= x_outer) {
    if (threadIdx.x == 0) atomicOr(err, kErrGatherRow);
    return;
  }
  const E* in = row_as<E>(x, src * sub + s);
  for (int64_t c = threadIdx.x; c < x.cols; c += blockDim.x) o[c] = in[c];
}

template <typename T>
__global__ void bias_kernel(RowView out, const float* bias) {
  DI_FOR_EACH_ELEMENT(out) {
    T* o = row_as<T>(out, r);
    o[c] = from_f<T>(to_f(o[c]) + bias[c]);
  }
}

// One warp per output element: lanes stride over k, then a warp reduction.
template <typename W>
__global__ void linear_f32x_kernel(RowView x, const char* w, int64_t w_stride, int64_t m, const float* bias,
                                   RowView out) {
  int64_t item = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (item >= x.rows * m) return;
  int lane = threadIdx.x % 32;
  int64_t i = item / m, j = item % m;
  const float* xr = row_as<float>(x, i);
  const W* wr = reinterpret_cast<const W*>(w + j * w_stride);
  float acc = 0.0f;
  for (int64_t l = lane; l < x.cols; l += 32) acc += xr[l] * to_f(wr[l]);
  acc = warp_sum(acc);
  if (lane == 0) row_as<float>(out, i)[j] = acc + (bias ? bias[j] : 0.0f);
}

template <typename TI, typename TO>
__global__ void convert_kernel(RowView x, TO* out) {
  int64_t total = x.rows * x.cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t r = i / x.cols, c = i % x.cols;
    out[i] = from_f<TO>(to_f(row_as<TI>(x, r)[c]));
  }
}

}  // namespace

void launch_embedding(ElemType table_type, const char* table, int64_t table_stride, int64_t first_id, int64_t rows,
                      int64_t vocab, const int32_t* ids, ElemType out_type, RowView out, uint32_t* err, Stream stream) {
  if (out.rows == 0) return;
  DI_DISPATCH_ELEM(table_type, TT, DI_DISPATCH_ELEM(out_type, TO,
      launch_chained(embedding_kernel<TT, TO>, static_cast<unsigned>(out.rows), 256, 0, as_stream(stream),
          table, table_stride, first_id, rows, vocab, ids, out, err)));
}

// Whether every row of the view starts on a 16-byte boundary.
static bool rows_aligned16(const RowView& v) {
  bool ok = reinterpret_cast<uintptr_t>(v.base) % 16 == 0;
  for (int d = 0; d < v.nouter; ++d) ok = ok && v.stride[d] % 16 == 0;
  return ok;
}

void launch_rms_norm(ElemType type, RowView x, RowView residual, const float* weight, float eps,
                     float weight_offset, RowView out, bool add_residual, Stream stream, bool batch_invariant) {
  if (x.rows == 0) return;
  // Chunked path: 16-bit rows of 8-element chunks up to 8 warps x 32 lanes x
  // kMaxChunks chunks (16,384 columns). Few rows (decode) take the widest
  // split, so one row's loads spread over more lanes.
  const int64_t chunks = x.cols / 8;
  const bool vec = type != ElemType::F32 && x.cols % 8 == 0 && chunks <= 8 * 32 * kMaxChunks &&
                   reinterpret_cast<uintptr_t>(weight) % 16 == 0 && rows_aligned16(x) && rows_aligned16(out) &&
                   (!add_residual || rows_aligned16(residual));
  if (vec) {
    int warps = 1;
    while (chunks > int64_t{32} * kMaxChunks * warps) warps *= 2;
    if (x.rows < 64 && !batch_invariant) warps = static_cast<int>(std::max<int64_t>(warps, std::min<int64_t>(8, chunks / 32)));
    while (warps & (warps - 1)) ++warps;  // a power of two
    const int64_t rows_per_block = 8 / warps;
    const unsigned blocks = static_cast<unsigned>((x.rows + rows_per_block - 1) / rows_per_block);
    auto go = [&](auto warps_tag) {
      constexpr int W = decltype(warps_tag)::value;
      if (type == ElemType::BF16) {
        launch_chained(rms_norm_rows_kernel<__nv_bfloat16, W>, blocks, kNormThreads, 0, as_stream(stream),
            x, residual, weight, eps, weight_offset, out, add_residual);
      } else {
        launch_chained(rms_norm_rows_kernel<__half, W>, blocks, kNormThreads, 0, as_stream(stream),
            x, residual, weight, eps, weight_offset, out, add_residual);
      }
    };
    switch (warps) {
      case 1: go(std::integral_constant<int, 1>{}); break;
      case 2: go(std::integral_constant<int, 2>{}); break;
      case 4: go(std::integral_constant<int, 4>{}); break;
      default: go(std::integral_constant<int, 8>{}); break;
    }
  } else if (x.cols <= 1024) {
    unsigned blocks = static_cast<unsigned>((x.rows + 7) / 8);
    DI_DISPATCH_ELEM(type, T, (launch_chained(rms_norm_kernel<T, true>, blocks, 256, 0, as_stream(stream),
                                  x, residual, weight, eps, weight_offset, out, add_residual)));
  } else {
    DI_DISPATCH_ELEM(type, T, (launch_chained(rms_norm_kernel<T, false>, static_cast<unsigned>(x.rows), 512, 0, as_stream(stream),
                                  x, residual, weight, eps, weight_offset, out, add_residual)));
  }
}

// Grid for DI_FOR_EACH_ELEMENT: about four elements per thread along a row,
// one block row per row (up to the grid limit; the kernels stride over the rest).
static dim3 element_grid(const RowView& v) {
  const int64_t x = std::min<int64_t>((v.cols + 1023) / 1024, 64);
  const int64_t y = std::min<int64_t>(v.rows, 65535);
  return dim3(static_cast<unsigned>(std::max<int64_t>(x, 1)), static_cast<unsigned>(std::max<int64_t>(y, 1)));
}

// Whether the 16-byte chunk kernel can take these views: a 16-bit type, rows
// of whole chunks, 16-byte aligned rows.
static bool chunkable(ElemType type, std::initializer_list<const RowView*> views) {
  if (type == ElemType::F32) return false;
  for (const RowView* v : views) {
    if (v->cols % 8 != 0 || !rows_aligned16(*v)) return false;
  }
  return true;
}

// Grid for binary_vec_kernel: 256 chunk columns per block, and enough block
// rows for ~16 blocks per SM (each walks rows with a stride), not one per row.
static dim3 chunk_grid(const RowView& v) {
  const int64_t x = (v.cols / 8 + 255) / 256;
  const int64_t row_groups = (v.rows + kRowUnroll - 1) / kRowUnroll;
  const int64_t y = std::min<int64_t>(row_groups, std::max<int64_t>(1, 132 * 16 / x));
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(std::min<int64_t>(y, 65535)));
}

template <class Op>
static void launch_binary_vec(ElemType type, RowView a, RowView b, RowView out, Op op, Stream stream) {
  if (type == ElemType::BF16) {
    launch_chained(binary_vec_kernel<__nv_bfloat16, Op>, chunk_grid(a), 256, 0, as_stream(stream), a, b, out, op);
  } else {
    launch_chained(binary_vec_kernel<__half, Op>, chunk_grid(a), 256, 0, as_stream(stream), a, b, out, op);
  }
}

void launch_gated(ElemType type, RowView gate, RowView up, bool gelu, RowView out, Stream stream) {
  if (gate.rows * gate.cols == 0) return;
  if (chunkable(type, {&gate, &up, &out})) {
    if (gelu) {
      launch_binary_vec(type, gate, up, out, GatedGelu{}, stream);
    } else {
      launch_binary_vec(type, gate, up, out, GatedSilu{}, stream);
    }
    return;
  }
  DI_DISPATCH_ELEM(type, T, (gated_kernel<T><<<element_grid(gate), 256, 0, as_stream(stream)>>>(gate, up, gelu, out)));
}

void launch_add(ElemType type, RowView a, RowView b, RowView out, Stream stream) {
  if (a.rows * a.cols == 0) return;
  if (chunkable(type, {&a, &b, &out})) {
    launch_binary_vec(type, a, b, out, Add{}, stream);
    return;
  }
  DI_DISPATCH_ELEM(type, T, (add_kernel<T><<<element_grid(a), 256, 0, as_stream(stream)>>>(a, b, out)));
}

void launch_scale(ElemType type, RowView x, float factor, RowView out, Stream stream) {
  if (x.rows * x.cols == 0) return;
  DI_DISPATCH_ELEM(type, T, (scale_kernel<T><<<element_grid(x), 256, 0, as_stream(stream)>>>(x, factor, out)));
}

void launch_zero_rows_at_position(int elem_bytes, RowView x, const int32_t* positions, int32_t position,
                                  Stream stream) {
  if (x.rows * x.cols == 0) return;
  zero_rows_at_position_kernel<<<static_cast<unsigned>(x.rows), 256, 0, as_stream(stream)>>>(x, elem_bytes, positions,
                                                                                            position);
}

void launch_token_probs(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride, const int32_t* tokens,
                        float* out, Stream stream) {
  if (rows == 0) return;
  token_probs_kernel<<<static_cast<unsigned>(rows), 512, 0, as_stream(stream)>>>(logits, vocab, row_stride, tokens,
                                                                                 out);
}

void launch_sanitize_ids(int32_t* ids, int64_t n, int64_t limit, Stream stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  sanitize_ids_kernel<<<blocks, 256, 0, as_stream(stream)>>>(ids, n, limit);
}

void launch_gather_rows(int elem_bytes, RowView x, int64_t x_outer, int64_t sub, const int32_t* rows, int64_t n,
                        RowView out, uint32_t* err, Stream stream) {
  if (n * sub == 0) return;
  unsigned blocks = static_cast<unsigned>(n * sub);
  // Rows of whole 16-byte chunks are copied a chunk per thread (up to 512
  // threads): element by element, one decode row (4,096 bf16) took 32
  // dependent round trips to L2, ~10 us.
  const int64_t row_bytes = x.cols * elem_bytes;
  if (row_bytes > 0 && row_bytes % 16 == 0 && rows_aligned16(x) && rows_aligned16(out)) {
    RowView xc = x, oc = out;
    xc.cols = oc.cols = row_bytes / 16;
    const unsigned threads = static_cast<unsigned>(std::min<int64_t>(512, (xc.cols + 31) / 32 * 32));
    launch_chained(gather_kernel<uint4>, blocks, threads, 0, as_stream(stream), xc, x_outer, sub, rows, oc, err);
    return;
  }
  if (elem_bytes == 2) {
    launch_chained(gather_kernel<uint16_t>, blocks, 128, 0, as_stream(stream), x, x_outer, sub, rows, out, err);
  } else {
    launch_chained(gather_kernel<uint32_t>, blocks, 128, 0, as_stream(stream), x, x_outer, sub, rows, out, err);
  }
}

void launch_add_bias(ElemType type, RowView out, const float* bias, Stream stream) {
  if (out.rows * out.cols == 0) return;
  DI_DISPATCH_ELEM(type, T, (bias_kernel<T><<<element_grid(out), 256, 0, as_stream(stream)>>>(out, bias)));
}

void launch_linear_f32x(RowView x, ElemType w_type, const char* w, int64_t w_stride, int64_t m, const float* bias,
                        RowView out, Stream stream) {
  int64_t items = x.rows * m;
  if (items == 0) return;
  unsigned blocks = static_cast<unsigned>((items + 7) / 8);
  DI_DISPATCH_ELEM(w_type, W, (linear_f32x_kernel<W><<<blocks, 256, 0, as_stream(stream)>>>(
                                  x, w, w_stride, m, bias, out)));
}

void launch_convert(ElemType from, RowView x, ElemType to, char* out, Stream stream) {
  if (x.rows * x.cols == 0) return;
  DI_DISPATCH_ELEM(from, TI, DI_DISPATCH_ELEM(to, TO,
      (convert_kernel<TI, TO><<<blocks_for(x.rows * x.cols, 256), 256, 0, as_stream(stream)>>>(
          x, reinterpret_cast<TO*>(out)))));
}

}  // namespace deepinfer::cuda
