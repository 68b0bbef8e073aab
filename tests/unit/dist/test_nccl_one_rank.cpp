// The NCCL communicator on one GPU (the machines lent so far have one): a
// one-rank group through make_device_communicator, every collective on device
// memory, enqueued on the backend's stream and captured in a CUDA graph as the
// tensor-parallel decode graphs capture them. Skipped without a CUDA device
// or in builds without NCCL.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "dist/device_communicator.h"
#include "dist/gloo_communicator.h"

namespace deepinfer {
namespace {

#ifdef DEEPINFER_HAS_NCCL

std::unique_ptr<Backend> cuda_backend() {
  try {
    return create_backend(DeviceType::CUDA);
  } catch (const Error&) {
    return nullptr;
  }
}

struct DeviceInts {
  Buffer buffer;
  Tensor t;
};

DeviceInts device_ints(Backend& backend, const std::vector<int32_t>& values) {
  DeviceInts d{Buffer(backend, values.size() * sizeof(int32_t)), {}};
  d.t = d.buffer.view(DType::I32, {static_cast<int64_t>(values.size())});
  backend.copy(d.t, Tensor(const_cast<int32_t*>(values.data()), DType::I32, {static_cast<int64_t>(values.size())}));
  return d;
}

std::vector<int32_t> host_ints(Backend& backend, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  backend.copy(Tensor(v.data(), DType::I32, {t.numel()}), t);
  backend.synchronize();
  return v;
}

TEST(NcclOneRank, EveryCollectiveAndAGraphReplay) {
  std::unique_ptr<Backend> backend = cuda_backend();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  GlooCommunicator bootstrap(nullptr, "bootstrap", 0, 1, std::chrono::seconds(30));
  DistConfig config;
  config.timeout = std::chrono::seconds(30);
  std::unique_ptr<Communicator> comm = make_device_communicator(*backend, config, bootstrap, "tp");
  ASSERT_EQ(comm->name(), "nccl");
  ASSERT_EQ(comm->size(), 1);

  const std::vector<int32_t> values = {3, -1, 7, 42, 0, 9};
  DeviceInts a = device_ints(*backend, values);
  DeviceInts out = device_ints(*backend, std::vector<int32_t>(values.size(), -5));
  comm->all_reduce(a.t);
  EXPECT_EQ(host_ints(*backend, a.t), values);
  comm->all_reduce(a.t, ReduceOp::Max);
  comm->all_gather(a.t, out.t);
  EXPECT_EQ(host_ints(*backend, out.t), values);
  DeviceInts scattered = device_ints(*backend, std::vector<int32_t>(values.size(), 0));
  comm->reduce_scatter(a.t, scattered.t);
  EXPECT_EQ(host_ints(*backend, scattered.t), values);
  const std::vector<int64_t> rows = {static_cast<int64_t>(values.size())};
  DeviceInts moved = device_ints(*backend, std::vector<int32_t>(values.size(), 0));
  comm->all_to_all(a.t, rows, moved.t, rows);
  EXPECT_EQ(host_ints(*backend, moved.t), values);
  comm->broadcast(a.t, 0);
  comm->barrier();
  EXPECT_EQ(host_ints(*backend, a.t), values);

  // A graph: capture an all-reduce and a broadcast, replay them twice.
  if (!backend->supports_graphs()) return;
  DeviceInts g = device_ints(*backend, values);
  backend->begin_capture();
  comm->all_reduce(g.t);
  comm->broadcast(g.t, 0);
  std::unique_ptr<OpGraph> graph = backend->end_capture();
  graph->replay();
  graph->replay();
  EXPECT_EQ(host_ints(*backend, g.t), values);
}

#else

TEST(NcclOneRank, NotBuilt) { GTEST_SKIP() << "this build has no NCCL (CPU-only)"; }

#endif

}  // namespace
}  // namespace deepinfer
