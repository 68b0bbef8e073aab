// NcclCommunicator: the Communicator over GPU memory (CUDA builds only).
// Collectives are enqueued on the backend's stream and return at once, so
// they order with the model's kernels and are captured in CUDA graphs; their
// results are ready when the stream gets there.
//
// Made from a bootstrap GlooCommunicator of the same ranks: rank 0 creates
// NCCL's unique id and broadcasts it over the bootstrap group. The NCCL
// communicator is non-blocking (ncclConfig_t::blocking = 0), so its
// creation, and every call, can be bounded by the timeout: a rank that never
// joins makes the others abort the communicator and throw CommError instead
// of hanging inside NCCL.
//
// A peer that dies after the collectives were enqueued is another matter:
// the kernels wait on the device. check_async_error() reports what NCCL has
// noticed (a remote error, a lost connection); a caller waiting on the stream
// should poll it and its own deadline.
#pragma once

#include <chrono>
#include <string>

#include "dist/communicator.h"

struct CUstream_st;
struct ncclComm;

namespace deepinfer {

class GlooCommunicator;

class NcclCommunicator final : public Communicator {
 public:
  // Every rank of `bootstrap` calls this together. `device` is the CUDA device
  // that owns `stream`; `group` names the communicator in messages.
  NcclCommunicator(CUstream_st* stream, int device, GlooCommunicator& bootstrap, std::string group,
                   std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  // Device tensors on `device`; Sum, Max, Min on f32, f16, bf16, i32, i64.
  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const Tensor& in, Tensor out) override;
  void reduce_scatter(const Tensor& in, Tensor out) override;
  void all_to_all(const Tensor& in, std::span<const int64_t> send_rows, Tensor out,
                  std::span<const int64_t> recv_rows) override;
  void broadcast(Tensor t, int root) override;
  // Waits on the host until every rank's stream has reached it.
  void barrier() override;

  // Throws CommError if NCCL has seen an asynchronous error; never blocks.
  void check_async_error();
  void check_health() override { check_async_error(); }
  // ncclCommAbort: kernels waiting on a dead peer return.
  [[noreturn]] void abort(const std::string& reason) override { fail("watchdog", reason); }

 private:
  // Throws CommError (and marks the communicator broken) unless `result` is
  // success; for ncclInProgress, polls until done or the timeout.
  void complete(int result, const char* op);
  [[noreturn]] void fail(const char* op, const std::string& cause);
  void check_usable(const char* op) const;

  CUstream_st* stream_;
  int device_;
  std::string group_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  ncclComm* comm_ = nullptr;
  int* barrier_word_ = nullptr;  // device memory a barrier all-reduces
  std::string broken_;
};

}  // namespace deepinfer
