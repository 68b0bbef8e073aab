// The argument checks every Communicator implementation shares, so Gloo and
// NCCL reject the same calls with the same messages (deepinfer::Error; the
// communicator stays usable). `backend` ("gloo", "nccl") and `op` start each message.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

// Defined, on `device` (type and index), contiguous, and of a dtype the
// collectives carry: f32, f16, bf16, i32, i64, u8.
void check_collective_tensor(const Tensor& t, Device device, const char* backend, const char* op, const char* what);
// A dtype that reductions accept (u8 carries bytes, not numbers).
void check_reducible(DType dtype, const char* backend, const char* op);
// Same dtype; out holds size x in's elements.
void check_all_gather(const Tensor& in, const Tensor& out, int size, const char* backend);
// Same dtype; in holds size x out's elements.
void check_reduce_scatter(const Tensor& in, const Tensor& out, int size, const char* backend);

// An all_to_all's byte layout: what goes to and comes from each rank.
struct AllToAllLayout {
  std::vector<int64_t> send_bytes, send_offsets;
  std::vector<int64_t> recv_bytes, recv_offsets;
};

// Checks the row counts (size entries each, non-negative, adding up to the
// tensors' rows, as many rows to itself as from itself) and equal row sizes.
AllToAllLayout check_all_to_all(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                                std::span<const int64_t> recv_rows, int rank, int size, const char* backend);

size_t element_bytes(DType dtype);

}  // namespace deepinfer
