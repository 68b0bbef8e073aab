#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/cpu_sampling.h"
#include "backend/cpu/rows.h"
#include "backend/cpu/vec_kernels.h"
#include "backend/cpu/weight_kernels.h"
#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::cpu {

namespace {
constexpr size_t kAlignment = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

ScratchBuffer::~ScratchBuffer() { std::free(data_); }

ScratchBuffer::ScratchBuffer(ScratchBuffer&& other) noexcept
    : data_(other.data_), capacity_(other.capacity_) {
  other.data_ = nullptr;
  other.capacity_ = 0;
}

void ScratchBuffer::grow(size_t bytes) {
  // Grow geometrically so a slowly increasing shape does not reallocate every call.
  size_t capacity = round_up(std::max(bytes, capacity_ + capacity_ / 2), kAlignment);
  void* data = std::aligned_alloc(kAlignment, capacity);
  DI_CHECK(data != nullptr, "CPU backend: out of memory allocating {} bytes of scratch", capacity);
  std::free(data_);
  data_ = data;
  capacity_ = capacity;
}

CpuBackend::CpuBackend(const BackendOptions& options)
    : batch_invariant_(options.batch_invariant),
      use_amx_(active_isa() == CpuIsa::Amx),
      vec_(&vec_kernels(active_isa())),
      pool_(options.num_threads) {
  // Parallelism comes from our own pool; BLAS runs single-threaded inside it.
  openblas_set_num_threads(1);
  log_info("cpu: {} kernels (this CPU supports {}), {} threads", isa_name(active_isa()), isa_name(hardware_isa()),
           pool_.num_threads());
  thread_scratch_.resize(static_cast<size_t>(pool_.num_threads()));
}

CpuBackend::~CpuBackend() = default;

void* CpuBackend::allocate(size_t bytes) {
  return std::aligned_alloc(kAlignment, round_up(std::max<size_t>(bytes, 1), kAlignment));
}

void CpuBackend::deallocate(void* ptr) { std::free(ptr); }

void CpuBackend::copy(Tensor dst, const Tensor& src) {
  DI_CHECK(dst.device().type == DeviceType::CPU && src.device().type == DeviceType::CPU,
           "CPU backend cannot copy {} to {}", src.describe(), dst.describe());
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  Rows d(dst), s(src);
  size_t bytes = row_bytes(src.dtype(), src.size(-1));
  for (int64_t r = 0; r < s.rows(); ++r) std::memmove(d.row<char>(r), s.row<char>(r), bytes);
}

void CpuBackend::embedding(const Tensor& table, const Tensor& ids, int64_t first_id, int64_t vocab, Tensor out) {
  const QuantKernels& kernels = weight_kernels(table.dtype());
  const int32_t* id = ids.data_as<int32_t>();
  const int64_t n = ids.size(0), rows = table.size(0), hidden = table.size(1);
  for (int64_t i = 0; i < n; ++i) {
    DI_CHECK(id[i] >= 0 && id[i] < vocab, "embedding: token id {} out of range [0, {})", id[i], vocab);
  }
  const char* base = static_cast<const char*>(table.data());
  int64_t stride = table.stride_bytes(0);
  Rows o(out);
  pool_.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = id[i] - first_id;
      if (r >= 0 && r < rows) {
        kernels.dequantize_row(base + r * stride, o.row(i), hidden);
      } else {
        std::memset(o.row(i), 0, row_bytes(out.dtype(), hidden));
      }
    }
  }, 8);
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor out) {
  const int32_t* index = rows.data_as<int32_t>();
  int64_t n = rows.size(0), limit = x.size(0);
  for (int64_t i = 0; i < n; ++i) {
    DI_CHECK(index[i] >= 0 && index[i] < limit, "gather_rows: row {} out of range [0, {})", index[i],
             limit);
  }
  // A row of x may itself have several dimensions; copy each as a (strided) sub-tensor.
  for (int64_t i = 0; i < n; ++i) copy(out.row(i), x.row(index[i]));
}

void CpuBackend::sanitize_ids(Tensor ids, int64_t limit) {
  int32_t* id = ids.data_as<int32_t>();
  for (int64_t i = 0; i < ids.size(0); ++i) {
    if (id[i] < 0 || id[i] >= limit) id[i] = 0;
  }
}

void CpuBackend::sample(const Tensor& logits, const Tensor& params, Tensor tokens) {
  Rows l(logits);
  const int64_t vocab = l.cols();
  const auto* row_params = params.data_as<const SamplingRowParams>();
  int32_t* out = tokens.data_as<int32_t>();
  // Rows are independent; a pool thread's scratch holds one row's work, weights and candidates.
  pool_.parallel_for(l.rows(), [&](int64_t b, int64_t e, int t) {
    const auto v = static_cast<size_t>(vocab);
    char* scratch = thread_scratch_[static_cast<size_t>(t)].get<char>(3 * v * sizeof(float));
    const std::span<float> work(reinterpret_cast<float*>(scratch), v);
    const std::span<float> weights(reinterpret_cast<float*>(scratch) + v, v);
    const std::span<int32_t> candidates(reinterpret_cast<int32_t*>(scratch) + 2 * v, v);
    for (int64_t r = b; r < e; ++r) {
      out[r] = sample_row({l.row(r), v}, row_params[r], work, weights, candidates);
    }
  }, 1, 1);
}

}  // namespace deepinfer::cpu
