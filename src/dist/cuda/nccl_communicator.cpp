#include "dist/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <vector>

#include "core/logging.h"
#include "dist/collective_checks.h"
#include "dist/gloo_communicator.h"

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

// How often a pending non-blocking NCCL call is polled: it finishes in
// microseconds when the ranks are healthy, so poll tightly at first.
constexpr std::chrono::microseconds kFirstPoll{20};
constexpr std::chrono::milliseconds kMaxPoll{10};

ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default: ::deepinfer::fail("nccl {}: no NCCL type for dtype {}", op, dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  ::deepinfer::fail("nccl: unknown reduce op {}", static_cast<int>(op));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(fmt::format("nccl: {}: {}", what, cudaGetErrorString(e)));
}

}  // namespace

NcclCommunicator::NcclCommunicator(CUstream_st* stream, int device, GlooCommunicator& bootstrap, std::string group,
                                   std::chrono::milliseconds timeout)
    : stream_(stream),
      device_(device),
      group_(std::move(group)),
      rank_(bootstrap.rank()),
      size_(bootstrap.size()),
      timeout_(timeout) {
  DI_CHECK(timeout_.count() > 0, "nccl group '{}': the timeout must be positive", group_);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  const Clock::time_point start = Clock::now();

  std::vector<uint8_t> id_bytes;
  ncclUniqueId id{};
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail("ncclGetUniqueId", ncclGetErrorString(r));
    id_bytes.assign(reinterpret_cast<const uint8_t*>(&id), reinterpret_cast<const uint8_t*>(&id) + sizeof(id));
  }
  // A rank that fails here has not created anything; the others' broadcast
  // throws CommError when it goes.
  bootstrap.broadcast_bytes(id_bytes, 0);
  if (id_bytes.size() != sizeof(id)) {
    fail("bootstrap", fmt::format("rank 0 sent a unique id of {} bytes, not {}", id_bytes.size(), sizeof(id)));
  }
  std::memcpy(&id, id_bytes.data(), sizeof(id));

  check_cuda(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(int)), "cudaMalloc (barrier word)");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = group_.c_str();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  comm_ = comm;
  try {
    complete(r, "ncclCommInitRankConfig");  // aborts the communicator when it throws
  } catch (...) {
    cudaFree(barrier_word_);
    throw;
  }
  log_info("dist: rank {} of {} joined NCCL group '{}' on cuda:{} in {} ms", rank_, size_, group_, device_,
           std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // Finalize flushes the enqueued work, bounded like every other call; a
    // failure aborts the communicator (and sets comm_ to null).
    try {
      complete(ncclCommFinalize(comm_), "ncclCommFinalize");
    } catch (const CommError& e) {
      log_warn("{}", e.what());
    }
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  // Freed last: cudaFree waits for the device, which must not still run a
  // collective that reads the word.
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
}

void NcclCommunicator::fail(const char* op, const std::string& cause) {
  broken_ = fmt::format("{}: {}", op, cause);
  if (comm_ != nullptr) {
    // Abort releases the ranks' resources and unblocks pending work; the
    // communicator is only good for destruction after this.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  throw CommError(fmt::format("nccl {} failed on rank {} of group '{}' ({} ranks): {}", op, rank_, group_, size_,
                              cause));
}

void NcclCommunicator::complete(int result_int, const char* op) {
  auto result = static_cast<ncclResult_t>(result_int);
  const Clock::time_point deadline = Clock::now() + timeout_;
  std::chrono::microseconds poll = kFirstPoll;
  while (result == ncclInProgress && comm_ != nullptr) {
    if (Clock::now() >= deadline) {
      fail(op, fmt::format("not complete after {} ms (a rank did not join?)", timeout_.count()));
    }
    std::this_thread::sleep_for(poll);
    poll = std::min<std::chrono::microseconds>(poll * 2, kMaxPoll);
    ncclCommGetAsyncError(comm_, &result);
  }
  if (result != ncclSuccess) {
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
    fail(op, fmt::format("{}{}{}", ncclGetErrorString(result), last && *last ? ": " : "", last ? last : ""));
  }
}

void NcclCommunicator::check_usable(const char* op) const {
  if (!broken_.empty()) {
    throw CommError(fmt::format("nccl {} on rank {} of group '{}': the communicator broke earlier ({})", op, rank_,
                                group_, broken_));
  }
}

void NcclCommunicator::check_async_error() {
  check_usable("check_async_error");
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) fail("ncclCommGetAsyncError", ncclGetErrorString(r));
  if (state != ncclSuccess && state != ncclInProgress) complete(state, "an earlier collective");
}

void NcclCommunicator::all_reduce(Tensor t, ReduceOp op) {
  check_usable("all_reduce");
  check_collective_tensor(t, Device::cuda(device_), "nccl", "all_reduce", "the tensor");
  check_reducible(t.dtype(), "nccl", "all_reduce");
  if (t.numel() == 0) return;
  complete(ncclAllReduce(t.data(), t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype(), "all_reduce"),
                         nccl_op(op), comm_, stream_),
           "all_reduce");
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor out) {
  check_usable("all_gather");
  check_collective_tensor(in, Device::cuda(device_), "nccl", "all_gather", "the input");
  check_collective_tensor(out, Device::cuda(device_), "nccl", "all_gather", "the output");
  check_all_gather(in, out, size_, "nccl");
  if (in.numel() == 0) return;
  complete(ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()), nccl_type(in.dtype(), "all_gather"),
                         comm_, stream_),
           "all_gather");
}

void NcclCommunicator::reduce_scatter(const Tensor& in, Tensor out) {
  check_usable("reduce_scatter");
  check_collective_tensor(in, Device::cuda(device_), "nccl", "reduce_scatter", "the input");
  check_collective_tensor(out, Device::cuda(device_), "nccl", "reduce_scatter", "the output");
  check_reduce_scatter(in, out, size_, "nccl");
  if (out.numel() == 0) return;
  complete(ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(out.numel()),
                             nccl_type(in.dtype(), "reduce_scatter"), ncclSum, comm_, stream_),
           "reduce_scatter");
}

void NcclCommunicator::all_to_all(const Tensor& in, std::span<const int64_t> send_rows, Tensor out,
                                  std::span<const int64_t> recv_rows) {
  check_usable("all_to_all");
  check_collective_tensor(in, Device::cuda(device_), "nccl", "all_to_all", "the input");
  check_collective_tensor(out, Device::cuda(device_), "nccl", "all_to_all", "the output");
  const AllToAllLayout layout = check_all_to_all(in, send_rows, out, recv_rows, rank_, size_, "nccl");
  const auto* src = static_cast<const uint8_t*>(in.data());
  auto* dst = static_cast<uint8_t*>(out.data());
  // This rank's own rows are a device copy on the same stream; the rest go
  // as byte messages (ncclUint8), one send and one receive per peer, in one
  // group so NCCL runs them together.
  if (layout.send_bytes[rank_] > 0) {
    check_cuda(cudaMemcpyAsync(dst + layout.recv_offsets[rank_], src + layout.send_offsets[rank_],
                               static_cast<size_t>(layout.send_bytes[rank_]), cudaMemcpyDeviceToDevice, stream_),
               "all_to_all: cudaMemcpyAsync of this rank's rows");
  }
  complete(ncclGroupStart(), "all_to_all (ncclGroupStart)");
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    if (layout.send_bytes[peer] > 0) {
      complete(ncclSend(src + layout.send_offsets[peer], static_cast<size_t>(layout.send_bytes[peer]), ncclUint8,
                        peer, comm_, stream_),
               "all_to_all (ncclSend)");
    }
    if (layout.recv_bytes[peer] > 0) {
      complete(ncclRecv(dst + layout.recv_offsets[peer], static_cast<size_t>(layout.recv_bytes[peer]), ncclUint8,
                        peer, comm_, stream_),
               "all_to_all (ncclRecv)");
    }
  }
  complete(ncclGroupEnd(), "all_to_all");
}

void NcclCommunicator::broadcast(Tensor t, int root) {
  check_usable("broadcast");
  check_collective_tensor(t, Device::cuda(device_), "nccl", "broadcast", "the tensor");
  DI_CHECK(root >= 0 && root < size_, "nccl broadcast: root {} is not a rank of {}", root, size_);
  if (t.numel() == 0) return;
  complete(ncclBroadcast(t.data(), t.data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype(), "broadcast"),
                         root, comm_, stream_),
           "broadcast");
}

void NcclCommunicator::barrier() {
  check_usable("barrier");
  complete(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_), "barrier");
  check_cuda(cudaStreamSynchronize(stream_), "barrier: cudaStreamSynchronize");
}

}  // namespace deepinfer
