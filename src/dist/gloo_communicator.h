// GlooCommunicator: the Communicator over host memory, built on Gloo's TCP
// transport. It carries the collectives of CPU ranks and the control plane of
// every group (step plans, votes, NCCL's bootstrap id), and is what the tests
// run. Each rank holds a full mesh of TCP connections to the others, so a rank
// that dies shows up at its peers as a closed connection: their pending or
// next collective throws CommError at once instead of waiting for the timeout.
//
// A group is a name in a rendezvous store; one process may hold several
// groups ("control", "tp", ...) over one store (see store()). Group names must
// be unique within a store for its lifetime.
//
// Use one communicator from one thread at a time (like an NCCL communicator):
// the collectives of a group are matched by their order.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/dist_config.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace deepinfer {

// Where this rank's Gloo connections listen: a network interface, or else an
// address or name of this host; both empty = this host's name.
struct GlooTransport {
  std::string ifname;
  std::string hostname;
};

// config.ifname if set, else this host's address on the route to the tcp://
// rendezvous host (loopback for a local one), else empty.
GlooTransport gloo_transport_for(const DistConfig& config);

// The store behind config.init_method: a TcpStore (served here on rank 0) or
// a gloo FileStore (the directory is created if missing). nullptr for one rank.
std::shared_ptr<gloo::rendezvous::Store> open_rendezvous_store(const DistConfig& config);

class GlooCommunicator final : public Communicator {
 public:
  // Joins `group` with every rank of the job through config's rendezvous,
  // opening the store; further groups share it through store().
  GlooCommunicator(const DistConfig& config, std::string group);
  // Joins `group` as `rank` of `size` ranks through an existing store
  // (nullptr is fine for one rank). `timeout` bounds the rendezvous and each
  // collective's wait for its peers.
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, std::string group, int rank, int size,
                   std::chrono::milliseconds timeout, const GlooTransport& transport = {});
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "gloo"; }
  const std::string& group() const { return group_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::shared_ptr<gloo::rendezvous::Store>& store() const { return store_; }

  // Host tensors only. Reductions: Sum, Max, Min on f32, f16, bf16, i32, i64
  // (f16 and bf16 are combined in f32 and rounded back after each step).
  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const Tensor& in, Tensor out) override;
  void reduce_scatter(const Tensor& in, Tensor out) override;
  void all_to_all(const Tensor& in, std::span<const int64_t> send_rows, Tensor out,
                  std::span<const int64_t> recv_rows) override;
  void broadcast(Tensor t, int root) override;
  void barrier() override;

  // The control plane's helpers. bytes = root's bytes, whatever their size
  // (the size travels first, so the other ranks need not know it).
  void broadcast_bytes(std::vector<uint8_t>& bytes, int root);
  // Every rank's bytes, whatever their sizes, in rank order on every rank.
  std::vector<std::vector<uint8_t>> all_gather_bytes(const std::vector<uint8_t>& mine);
  // The smallest / largest of every rank's value.
  int64_t all_reduce_min(int64_t value);
  int64_t all_reduce_max(int64_t value);

 private:
  // Runs one gloo operation; turns whatever it throws into CommError (naming
  // op, rank, group and cause) and marks the communicator broken.
  template <typename Body>
  void run(const char* op, Body&& body);
  void all_reduce_host(void* data, DType dtype, int64_t numel, ReduceOp op, const char* op_name);
  void broadcast_host(void* data, size_t bytes, int root, const char* op_name);

  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string group_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;  // null for one rank
  // All-reduces of at most this many bytes (over all ranks) run as an
  // all-gather into gather_scratch_ and a local reduction.
  static constexpr size_t kGatherReduceMaxBytes = size_t{256} << 10;
  std::vector<uint8_t> gather_scratch_;
  uint32_t next_tag_ = 0;  // gloo matches messages by tag: the same sequence on every rank
  std::string broken_;     // why the communicator is broken; empty while it works
};

}  // namespace deepinfer
