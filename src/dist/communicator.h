// Communicator: the collectives a group of ranks runs together — one process
// per rank (see docs/distributed.md for why processes, not threads). Two
// implementations: GlooCommunicator (host memory; CPU ranks, tests, and the
// control plane of every group) and NcclCommunicator (device memory, enqueued
// on the CUDA backend's stream, so collectives are captured in CUDA graphs).
//
// Every collective takes contiguous tensors of one dtype (f32, f16, bf16,
// i32, i64, u8; sums only on the number types) and must be called by every
// rank of the group in the same order with matching shapes. A peer that has
// gone or does not arrive within the group's timeout makes the call throw
// CommError on the ranks still waiting; a communicator that threw is broken
// and only good for destruction.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer {

enum class ReduceOp : uint8_t { Sum, Max, Min };

class CommError : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl"

  // t = op over every rank's t, in place.
  virtual void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) = 0;
  // out holds size() * in.numel() elements: rank r's `in` at r * in.numel().
  virtual void all_gather(const Tensor& in, Tensor out) = 0;
  // in holds size() * out.numel() elements; out = the sum over ranks of
  // their in's chunk number rank().
  virtual void reduce_scatter(const Tensor& in, Tensor out) = 0;
  // Rows of `in` (in.size(0) rows of in.numel() / in.size(0) elements) go
  // to the ranks in order: send_rows[r] rows to rank r. Into `out`, in rank
  // order, recv_rows[r] rows from rank r. Each span has size() entries;
  // every rank's send_rows[me] must equal my recv_rows[it].
  virtual void all_to_all(const Tensor& in, std::span<const int64_t> send_rows, Tensor out,
                          std::span<const int64_t> recv_rows) = 0;
  // t = root's t.
  virtual void broadcast(Tensor t, int root) = 0;
  virtual void barrier() = 0;

  // For a caller waiting on the device for collectives already enqueued
  // (dist/step_wait.h): throws CommError if the group has noticed an error
  // (a peer gone, a lost connection); never blocks. Host-memory groups report
  // errors from the calls themselves.
  virtual void check_health() {}
  // Gives up on the collectives in flight (they did not finish within the
  // timeout): they return, the communicator is broken, and CommError with
  // `reason` is thrown.
  [[noreturn]] virtual void abort(const std::string& reason) { throw CommError(reason); }
};

}  // namespace deepinfer
