// GlooCommunicator's collectives, ranks as threads: every collective, dtype
// and reduce op against values computed here, for groups of 1 to 4 ranks
// over each kind of store.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "backend/backend.h"
#include "core/error.h"
#include "dist/device_communicator.h"
#include "dist_test_util.h"

namespace deepinfer {
namespace {

using namespace dist_test;

constexpr DType kNumberTypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Rank r's element i: small values (exact in bf16, and so are sums over four
// ranks), negative and positive, with a fraction for the float types.
double value(DType t, int rank, int64_t i) {
  const double v = static_cast<double>((i * 7 + rank * 13) % 41) - 20.0;
  return is_float(t) ? v + 0.25 : v;
}

double reduce_expected(DType t, ReduceOp op, int size, int64_t i) {
  double acc = value(t, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = value(t, r, i);
    acc = op == ReduceOp::Sum ? acc + v : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Max ? "max" : "min"; }

void check_all_reduce(GlooCommunicator& comm) {
  constexpr int64_t n = 37;
  for (DType t : kNumberTypes) {
    for (ReduceOp op : kOps) {
      HostBuffer b(t, n);
      for (int64_t i = 0; i < n; ++i) b.set(i, value(t, comm.rank(), i));
      comm.all_reduce(b.tensor(), op);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(b.get(i), reduce_expected(t, op, comm.size(), i))
            << dtype_name(t) << " " << op_name(op) << " element " << i << " on rank " << comm.rank();
      }
    }
  }
}

void check_all_gather(GlooCommunicator& comm) {
  constexpr int64_t n = 5;
  for (DType t : {DType::F32, DType::BF16, DType::I64, DType::U8}) {
    HostBuffer in(t, n), out(t, n * comm.size());
    for (int64_t i = 0; i < n; ++i) in.set(i, comm.rank() * 10 + i);
    comm.all_gather(in.tensor(), out.tensor({comm.size(), n}));
    for (int r = 0; r < comm.size(); ++r) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out.get(r * n + i), r * 10 + i) << dtype_name(t) << " rank " << r << " element " << i;
      }
    }
  }
}

void check_reduce_scatter(GlooCommunicator& comm) {
  constexpr int64_t chunk = 6;
  const int64_t n = chunk * comm.size();
  for (DType t : kNumberTypes) {
    HostBuffer in(t, n), out(t, chunk);
    for (int64_t i = 0; i < n; ++i) in.set(i, value(t, comm.rank(), i));
    comm.reduce_scatter(in.tensor(), out.tensor());
    for (int64_t i = 0; i < chunk; ++i) {
      ASSERT_EQ(out.get(i), reduce_expected(t, ReduceOp::Sum, comm.size(), comm.rank() * chunk + i))
          << dtype_name(t) << " element " << i << " on rank " << comm.rank();
    }
  }
}

void check_broadcast(GlooCommunicator& comm) {
  for (int root = 0; root < comm.size(); ++root) {
    for (DType t : {DType::F16, DType::I32, DType::U8}) {
      HostBuffer b(t, 9);
      for (int64_t i = 0; i < 9; ++i) b.set(i, comm.rank() == root ? 100 + root * 10 + i : 0);
      comm.broadcast(b.tensor({3, 3}), root);
      for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(b.get(i), 100 + root * 10 + i) << "root " << root << " i " << i;
    }
  }
}

// Rows from rank s to rank d: uneven, zero for some pairs.
int64_t rows_between(int s, int d) { return (s + 2 * d) % 3; }

void check_all_to_all(GlooCommunicator& comm) {
  constexpr int64_t cols = 3;
  const int me = comm.rank(), size = comm.size();
  std::vector<int64_t> send(size), recv(size);
  for (int r = 0; r < size; ++r) {
    send[r] = rows_between(me, r);
    recv[r] = rows_between(r, me);
  }
  const int64_t send_total = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  HostBuffer in(DType::I32, send_total * cols), out(DType::I32, recv_total * cols);
  // Each element says where it comes from: source, destination, row, column.
  int64_t row = 0;
  for (int d = 0; d < size; ++d) {
    for (int64_t k = 0; k < send[d]; ++k, ++row) {
      for (int64_t c = 0; c < cols; ++c) in.set(row * cols + c, me * 1000 + d * 100 + k * 10 + c);
    }
  }
  comm.all_to_all(in.tensor({send_total, cols}), send, out.tensor({recv_total, cols}), recv);
  row = 0;
  for (int s = 0; s < size; ++s) {
    for (int64_t k = 0; k < recv[s]; ++k, ++row) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(out.get(row * cols + c), s * 1000 + me * 100 + k * 10 + c)
            << "rank " << me << " row " << row << " from rank " << s;
      }
    }
  }
}

void check_broadcast_bytes(GlooCommunicator& comm) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{70001}}) {
    const int root = static_cast<int>(n % static_cast<size_t>(comm.size()));
    std::vector<uint8_t> bytes;
    if (comm.rank() == root) {
      bytes.resize(n);
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
    } else {
      bytes.assign(5, 0xEE);  // whatever a receiver held is replaced
    }
    comm.broadcast_bytes(bytes, root);
    ASSERT_EQ(bytes.size(), n) << "root " << root;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(bytes[i], static_cast<uint8_t>(i * 31 + 7)) << "byte " << i;
  }
}

// Every rank's bytes of its own length (rank 0's empty), and all empty.
void check_all_gather_bytes(GlooCommunicator& comm) {
  auto bytes_of = [](int rank, int round) {
    std::vector<uint8_t> b(static_cast<size_t>(rank * (round == 0 ? 0 : 997)));
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13 + static_cast<size_t>(rank));
    return b;
  };
  for (int round : {0, 1}) {
    const auto all = comm.all_gather_bytes(bytes_of(comm.rank(), round));
    ASSERT_EQ(all.size(), static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], bytes_of(r, round)) << "rank " << r;
  }
}

void check_min_max(GlooCommunicator& comm) {
  const int64_t mine = (comm.rank() * 7919) % 5 - 2 + (int64_t{1} << 40);
  int64_t lo = mine, hi = mine;
  for (int r = 0; r < comm.size(); ++r) {
    lo = std::min(lo, (r * 7919) % 5 - 2 + (int64_t{1} << 40));
    hi = std::max(hi, (r * 7919) % 5 - 2 + (int64_t{1} << 40));
  }
  EXPECT_EQ(comm.all_reduce_min(mine), lo);
  EXPECT_EQ(comm.all_reduce_max(mine), hi);
}

class GlooCollectives : public ::testing::TestWithParam<std::tuple<int, StoreKind>> {};

TEST_P(GlooCollectives, EveryCollectiveMatchesExpectedValues) {
  const auto [size, kind] = GetParam();
  run_ranks(size, kind, [&](GlooCommunicator& comm) {
    EXPECT_EQ(comm.size(), size);
    EXPECT_EQ(comm.name(), "gloo");
    check_all_reduce(comm);
    check_all_gather(comm);
    check_reduce_scatter(comm);
    check_broadcast(comm);
    check_all_to_all(comm);
    check_broadcast_bytes(comm);
    check_all_gather_bytes(comm);
    check_min_max(comm);
    comm.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(SizesAndStores, GlooCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(StoreKind::Hash, StoreKind::File, StoreKind::Tcp)),
                         [](const auto& info) {
                           return store_kind_name(std::get<1>(info.param)) + "_" +
                                  std::to_string(std::get<0>(info.param)) + "_ranks";
                         });

// Larger than gloo's 1 MiB segments, so the ring runs in several pieces.
TEST(GlooCollectives, LargeAllReduceSpansSegments) {
  constexpr int64_t n = 700'001;
  run_ranks(3, StoreKind::Hash, [&](GlooCommunicator& comm) {
    HostBuffer b(DType::F32, n);
    for (int64_t i = 0; i < n; ++i) b.set(i, static_cast<double>((i % 1024) * (comm.rank() + 1)));
    comm.all_reduce(b.tensor());
    for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(b.get(i), static_cast<double>((i % 1024) * 6)) << i;
    ASSERT_EQ(b.get(n - 1), static_cast<double>(((n - 1) % 1024) * 6));
  });
}

// f16 sums are rounded to f16 after each step, as NCCL's are: 2049 + 1 is not
// representable, and the result is what f16 arithmetic gives.
TEST(GlooCollectives, HalfSumsRoundLikeHalfArithmetic) {
  run_ranks(2, StoreKind::Hash, [&](GlooCommunicator& comm) {
    HostBuffer b(DType::F16, 2);
    b.set(0, comm.rank() == 0 ? 2048.0 : 1.0);
    b.set(1, comm.rank() == 0 ? 0.5 : 0.25);
    comm.all_reduce(b.tensor());
    EXPECT_EQ(b.get(0), 2048.0);  // 2049 rounds to even
    EXPECT_EQ(b.get(1), 0.75);
  });
}

// A rank with nothing to send or receive still takes part; the others exchange.
TEST(GlooCollectives, AllToAllWithAnIdleRank) {
  run_ranks(3, StoreKind::Tcp, [&](GlooCommunicator& comm) {
    const int me = comm.rank();
    // Ranks 1 and 2 swap two rows of 4 bytes each; rank 0 is idle.
    std::vector<int64_t> send(3, 0), recv(3, 0);
    if (me != 0) {
      send[3 - me] = 2;
      recv[3 - me] = 2;
    }
    const int64_t rows = me == 0 ? 0 : 2;
    HostBuffer in(DType::U8, rows * 4), out(DType::U8, rows * 4);
    for (int64_t i = 0; i < rows * 4; ++i) in.set(i, me * 50 + i);
    comm.all_to_all(in.tensor({rows, 4}), send, out.tensor({rows, 4}), recv);
    for (int64_t i = 0; i < rows * 4; ++i) ASSERT_EQ(out.get(i), (3 - me) * 50 + i);
  });
}

TEST(GlooCollectives, BadArgumentsAreErrorsAndLeaveTheCommunicatorUsable) {
  run_ranks(2, StoreKind::Hash, [&](GlooCommunicator& comm) {
    HostBuffer f(DType::F32, 4), u(DType::U8, 4), q(DType::Q8_0, 32);
    EXPECT_THROW(comm.all_reduce(u.tensor()), Error);  // bytes are not numbers
    EXPECT_THROW(comm.broadcast(f.tensor(), 2), Error);
    EXPECT_THROW(comm.all_gather(f.tensor(), f.tensor()), Error);  // output too small
    EXPECT_THROW(comm.reduce_scatter(f.tensor(), f.tensor()), Error);
    Tensor on_gpu(f.tensor().data(), DType::F32, {4}, Device::cuda(0));
    EXPECT_THROW(comm.all_reduce(on_gpu), Error);
    const std::vector<int64_t> wrong_total{1, 1}, right{2, 2}, too_few{4};
    EXPECT_THROW(comm.all_to_all(f.tensor({4, 1}), wrong_total, f.tensor({4, 1}), right), Error);
    EXPECT_THROW(comm.all_to_all(f.tensor({4, 1}), too_few, f.tensor({4, 1}), too_few), Error);
    const std::vector<int64_t> huge{int64_t{1} << 62, int64_t{1} << 62};
    EXPECT_THROW(comm.all_to_all(f.tensor({4, 1}), huge, f.tensor({4, 1}), huge), Error);
    // Still in step with the peer afterwards.
    f.set(0, comm.rank() + 1.0);
    comm.all_reduce(f.tensor({4}));
    EXPECT_EQ(f.get(0), 3.0);
  });
}

TEST(GlooCollectives, SizeOneNeedsNoStore) {
  GlooCommunicator comm(nullptr, "solo", 0, 1, 1s);
  HostBuffer in(DType::F32, 3), out(DType::F32, 3);
  for (int i = 0; i < 3; ++i) in.set(i, i + 0.5);
  comm.all_gather(in.tensor(), out.tensor());
  EXPECT_EQ(out.get(2), 2.5);
  comm.all_reduce(in.tensor(), ReduceOp::Max);
  EXPECT_EQ(in.get(1), 1.5);
  std::vector<uint8_t> bytes{1, 2, 3};
  comm.broadcast_bytes(bytes, 0);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(comm.all_reduce_min(-7), -7);
  comm.barrier();

  DistConfig one;
  GlooCommunicator from_config(one, "control");
  EXPECT_EQ(from_config.size(), 1);
  EXPECT_EQ(from_config.store(), nullptr);
}

TEST(GlooCollectives, TwoGroupsShareOneStore) {
  TestStores stores(StoreKind::Tcp, 2, 10s);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooCommunicator control(stores.for_rank(r), "control", r, 2, 10s, kLoopback);
        GlooCommunicator tp(control.store(), "tp", r, 2, 10s, kLoopback);
        int64_t a = control.all_reduce_max(r * 10);
        int64_t b = tp.all_reduce_min(r * 10 + 5);
        EXPECT_EQ(a, 10);
        EXPECT_EQ(b, 5);
        tp.barrier();
        control.barrier();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(GlooCollectives, DeviceCommunicatorOnTheCpuIsANewGlooGroup) {
  std::unique_ptr<Backend> cpu = create_backend(DeviceType::CPU);
  run_ranks(2, StoreKind::Tcp, [&](GlooCommunicator& bootstrap) {
    DistConfig config;
    config.rank = bootstrap.rank();
    config.world_size = 2;
    config.timeout = 10s;
    config.init_method = "tcp://127.0.0.1:1";  // only its host matters here: the route is loopback
    std::unique_ptr<Communicator> comm = make_device_communicator(*cpu, config, bootstrap, "tp");
    EXPECT_EQ(comm->name(), "gloo");
    EXPECT_EQ(comm->size(), 2);
    HostBuffer b(DType::I64, 1);
    b.set(0, bootstrap.rank() + 40);
    comm->all_reduce(b.tensor());
    EXPECT_EQ(b.get(0), 81);
    comm->barrier();
  });
}

}  // namespace
}  // namespace deepinfer
