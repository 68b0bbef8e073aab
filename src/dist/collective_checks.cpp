#include "dist/collective_checks.h"

#include "core/error.h"

namespace deepinfer {
namespace {

bool is_carried(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::I32 || t == DType::I64 ||
         t == DType::U8;
}

int64_t elements_per_row(const Tensor& t) {
  int64_t n = 1;
  for (int d = 1; d < t.ndim(); ++d) n *= t.size(d);
  return n;
}

}  // namespace

size_t element_bytes(DType dtype) { return static_cast<size_t>(dtype_info(dtype).block_bytes); }

void check_collective_tensor(const Tensor& t, Device device, const char* backend, const char* op,
                             const char* what) {
  DI_CHECK(t.defined(), "{} {}: {} is undefined", backend, op, what);
  DI_CHECK(t.device() == device, "{} {}: {} is {}, on the wrong device for this communicator", backend, op, what,
           t.describe());
  DI_CHECK(t.is_contiguous(), "{} {}: {} {} is not contiguous", backend, op, what, t.describe());
  DI_CHECK(is_carried(t.dtype()), "{} {}: {} has dtype {} (f32, f16, bf16, i32, i64, u8 are supported)", backend,
           op, what, dtype_name(t.dtype()));
}

void check_reducible(DType dtype, const char* backend, const char* op) {
  DI_CHECK(dtype != DType::U8, "{} {}: u8 tensors carry bytes, not numbers to reduce", backend, op);
}

void check_all_gather(const Tensor& in, const Tensor& out, int size, const char* backend) {
  DI_CHECK(in.dtype() == out.dtype(), "{} all_gather: input {} and output {} differ in dtype", backend,
           in.describe(), out.describe());
  DI_CHECK(out.numel() == in.numel() * size, "{} all_gather: output {} must hold {} x {} elements (input {})",
           backend, out.describe(), size, in.numel(), in.describe());
}

void check_reduce_scatter(const Tensor& in, const Tensor& out, int size, const char* backend) {
  check_reducible(in.dtype(), backend, "reduce_scatter");
  DI_CHECK(in.dtype() == out.dtype(), "{} reduce_scatter: input {} and output {} differ in dtype", backend,
           in.describe(), out.describe());
  DI_CHECK(in.numel() == out.numel() * size, "{} reduce_scatter: input {} must hold {} x {} elements (output {})",
           backend, in.describe(), size, out.numel(), out.describe());
}

AllToAllLayout check_all_to_all(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                                std::span<const int64_t> recv_rows, int rank, int size, const char* backend) {
  DI_CHECK(in.dtype() == out.dtype(), "{} all_to_all: input {} and output {} differ in dtype", backend,
           in.describe(), out.describe());
  const int64_t row = elements_per_row(in);
  DI_CHECK(row == elements_per_row(out), "{} all_to_all: input {} and output {} differ in row size", backend,
           in.describe(), out.describe());
  DI_CHECK(send_rows.size() == static_cast<size_t>(size) && recv_rows.size() == static_cast<size_t>(size),
           "{} all_to_all: {} send and {} receive counts for {} ranks", backend, send_rows.size(), recv_rows.size(),
           size);
  const int64_t row_bytes = row * static_cast<int64_t>(element_bytes(in.dtype()));
  AllToAllLayout layout;
  int64_t send_total = 0, recv_total = 0;
  for (int r = 0; r < size; ++r) {
    DI_CHECK(send_rows[r] >= 0 && recv_rows[r] >= 0, "{} all_to_all: negative row count for rank {}", backend, r);
    // Checked before adding, so forged counts cannot overflow the sums.
    DI_CHECK(send_rows[r] <= in.size(0) - send_total && recv_rows[r] <= out.size(0) - recv_total,
             "{} all_to_all: the row counts up to rank {} exceed the input {} or the output {}", backend, r,
             in.describe(), out.describe());
    layout.send_offsets.push_back(send_total * row_bytes);
    layout.recv_offsets.push_back(recv_total * row_bytes);
    layout.send_bytes.push_back(send_rows[r] * row_bytes);
    layout.recv_bytes.push_back(recv_rows[r] * row_bytes);
    send_total += send_rows[r];
    recv_total += recv_rows[r];
  }
  DI_CHECK(send_total == in.size(0), "{} all_to_all: the send counts add up to {} rows, the input {} has {}",
           backend, send_total, in.describe(), in.size(0));
  DI_CHECK(recv_total == out.size(0), "{} all_to_all: the receive counts add up to {} rows, the output {} has {}",
           backend, recv_total, out.describe(), out.size(0));
  DI_CHECK(send_rows[rank] == recv_rows[rank], "{} all_to_all: rank {} sends itself {} rows but expects {}",
           backend, rank, send_rows[rank], recv_rows[rank]);
  return layout;
}

}  // namespace deepinfer
