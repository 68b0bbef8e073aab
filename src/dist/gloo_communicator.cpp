#include "dist/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <type_traits>

#include "core/half.h"
#include "core/logging.h"
#include "dist/collective_checks.h"
#include "dist/tcp_store.h"

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

// Each group's keys live under their own prefix; gloo's get() is also given
// the group's timeout here (gloo's own stores wait a fixed 30 s in get()).
class GroupStore final : public gloo::rendezvous::Store {
 public:
  GroupStore(gloo::rendezvous::Store& base, std::string prefix, std::chrono::milliseconds timeout)
      : base_(base), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override { base_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override {
    base_.wait({prefix_ + key}, timeout_);
    return base_.get(prefix_ + key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const std::string& k : keys) prefixed.push_back(prefix_ + k);
    base_.wait(prefixed, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  gloo::rendezvous::Store& base_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// --- reductions: out[i] = a[i] op b[i] (gloo's reduce function signature) ---

struct SumOp {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // Wraps on overflow, as NCCL and PyTorch do, instead of undefined behaviour.
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct MinOp {
  template <typename T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

template <typename T, typename Op>
void reduce_native(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op{}(x[i], y[i]);
}

// f16 and bf16 have no arithmetic of their own: combine in f32, round back.
template <float (*ToF32)(uint16_t), uint16_t (*FromF32)(float), typename Op>
void reduce_half(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FromF32(Op{}(ToF32(x[i]), ToF32(y[i])));
}

template <typename Op>
gloo::AllreduceOptions::Func reduce_function_for(DType dtype) {
  switch (dtype) {
    case DType::F32: return &reduce_native<float, Op>;
    case DType::I32: return &reduce_native<int32_t, Op>;
    case DType::I64: return &reduce_native<int64_t, Op>;
    case DType::F16: return &reduce_half<f16_to_f32, f32_to_f16, Op>;
    case DType::BF16: return &reduce_half<bf16_to_f32, f32_to_bf16, Op>;
    default: fail("gloo: no reduction for dtype {}", dtype_name(dtype));
  }
}

gloo::AllreduceOptions::Func reduce_function(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return reduce_function_for<SumOp>(dtype);
    case ReduceOp::Max: return reduce_function_for<MaxOp>(dtype);
    case ReduceOp::Min: return reduce_function_for<MinOp>(dtype);
  }
  fail("gloo: unknown reduce op {}", static_cast<int>(op));
}

// Calls f with a value of the unsigned type of `bytes` bytes, so gloo splits
// buffers on element boundaries.
template <typename F>
void with_element_type(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
  }
  fail("gloo: no element type of {} bytes", bytes);
}

// A valid address for zero-byte buffers (an empty tensor may have none).
uint8_t* nonnull(void* p) {
  static uint8_t dummy = 0;
  return p != nullptr ? static_cast<uint8_t*>(p) : &dummy;
}

// This host's address on the route to host:port: the source address the
// kernel picks for a UDP socket "connected" there (no packet is sent).
std::string local_address_towards(const std::string& host, uint16_t port) {
  namespace asio = boost::asio;
  asio::io_context io;
  boost::system::error_code ec;
  asio::ip::udp::resolver resolver(io);
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) return "";
  asio::ip::udp::socket socket(io);
  socket.connect(results.begin()->endpoint(), ec);
  if (ec) return "";
  const auto local = socket.local_endpoint(ec);
  return ec ? "" : local.address().to_string();
}

}  // namespace

GlooTransport gloo_transport_for(const DistConfig& config) {
  GlooTransport t;
  if (!config.ifname.empty()) {
    t.ifname = config.ifname;
  } else if (config.world_size > 1 && !config.init_method.empty()) {
    const InitMethod m = parse_init_method(config.init_method);
    if (m.kind == InitMethod::Kind::Tcp) {
      t.hostname = local_address_towards(m.host, m.port);
      if (t.hostname.empty()) log_warn("dist: no route to {}; the ranks connect by this host's name", m.host);
    }
  }
  return t;
}

std::shared_ptr<gloo::rendezvous::Store> open_rendezvous_store(const DistConfig& config) {
  if (config.world_size == 1) return nullptr;
  DI_CHECK(!config.init_method.empty(), "dist: {} ranks and no init method (rendezvous)", config.world_size);
  const InitMethod m = parse_init_method(config.init_method);
  if (m.kind == InitMethod::Kind::File) {
    std::error_code ec;
    std::filesystem::create_directories(m.path, ec);
    DI_CHECK(!ec, "dist: cannot create the rendezvous directory {}: {}", m.path, ec.message());
    try {
      return std::make_shared<gloo::rendezvous::FileStore>(m.path);
    } catch (const std::exception& e) {
      fail("dist: cannot use the rendezvous directory {}: {}", m.path, e.what());
    }
  }
  TcpStoreOptions options;
  options.host = m.host;
  options.port = m.port;
  options.serve = config.rank == 0;
  options.timeout = config.timeout;
  return std::make_shared<TcpStore>(options);
}

GlooCommunicator::GlooCommunicator(const DistConfig& config, std::string group)
    : GlooCommunicator(open_rendezvous_store(config), std::move(group), config.rank, config.world_size,
                       config.timeout, gloo_transport_for(config)) {}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, std::string group, int rank,
                                   int size, std::chrono::milliseconds timeout, const GlooTransport& transport)
    : store_(std::move(store)), group_(std::move(group)), rank_(rank), size_(size), timeout_(timeout) {
  DI_CHECK(!group_.empty(), "gloo: a group needs a name");
  DI_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "gloo group '{}': rank {} of {} ranks", group_, rank_, size_);
  DI_CHECK(timeout_.count() > 0, "gloo group '{}': the timeout must be positive", group_);
  if (size_ == 1) return;
  DI_CHECK(store_ != nullptr, "gloo group '{}' of {} ranks: no rendezvous store", group_, size_);
  const Clock::time_point start = Clock::now();
  try {
    gloo::transport::tcp::attr attr;
    attr.iface = transport.ifname;
    attr.hostname = transport.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout_);
    GroupStore group_store(*store_, "deepinfer/" + group_ + "/", timeout_);
    context->connectFullMesh(group_store, device);
    context_ = std::move(context);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("gloo: rank {} could not join group '{}' of {} ranks: {}", rank_, group_, size_,
                                e.what()));
  }
  log_info("dist: rank {} of {} joined group '{}' in {} ms", rank_, size_, group_,
           std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

GlooCommunicator::~GlooCommunicator() = default;

template <typename Body>
void GlooCommunicator::run(const char* op, Body&& body) {
  if (!broken_.empty()) {
    throw CommError(fmt::format("gloo {} on rank {} of group '{}': the communicator broke earlier ({})", op,
                                rank_, group_, broken_));
  }
  try {
    body();
  } catch (const std::exception& e) {
    // gloo::IoException (a peer closed its connection, or a timeout),
    // gloo::EnforceNotMet (a peer sent something that does not match),
    // std::system_error from the sockets.
    broken_ = fmt::format("{}: {}", op, e.what());
    throw CommError(fmt::format("gloo {} failed on rank {} of group '{}' ({} ranks): {}", op, rank_, group_, size_,
                                e.what()));
  }
}

void GlooCommunicator::all_reduce_host(void* data, DType dtype, int64_t numel, ReduceOp op, const char* op_name) {
  if (size_ == 1 || numel == 0) return;
  const gloo::AllreduceOptions::Func fn = reduce_function(dtype, op);
  const size_t bytes = static_cast<size_t>(numel) * element_bytes(dtype);
  if (bytes * static_cast<size_t>(size_) <= kGatherReduceMaxBytes) {
    // One all-gather and the reduction here, in rank order, so every rank
    // combines the same values in the same order and gets the same bits.
    // Gloo's ring takes 2 (size - 1) dependent exchanges, each a wake-up of
    // the receiving thread; for the few KiB a decode step reduces, latency is
    // all that counts (2 ranks, 576 floats: ~150 us against 500-700 us).
    gather_scratch_.resize(bytes * static_cast<size_t>(size_));
    run(op_name, [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(data), bytes);
      opts.setOutput(gather_scratch_.data(), gather_scratch_.size());
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
    const size_t n = static_cast<size_t>(numel);
    fn(data, gather_scratch_.data(), gather_scratch_.data() + bytes, n);
    for (int r = 2; r < size_; ++r) fn(data, data, gather_scratch_.data() + static_cast<size_t>(r) * bytes, n);
    return;
  }
  run(op_name, [&] {
    gloo::AllreduceOptions opts(context_);
    with_element_type(element_bytes(dtype), [&](auto element) {
      using T = decltype(element);
      opts.setOutput(static_cast<T*>(data), static_cast<size_t>(numel));
    });
    opts.setReduceFunction(fn);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
}

void GlooCommunicator::broadcast_host(void* data, size_t bytes, int root, const char* op_name) {
  if (size_ == 1 || bytes == 0) return;
  run(op_name, [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::all_reduce(Tensor t, ReduceOp op) {
  check_collective_tensor(t, Device::cpu(), "gloo", "all_reduce", "the tensor");
  check_reducible(t.dtype(), "gloo", "all_reduce");
  all_reduce_host(t.data(), t.dtype(), t.numel(), op, "all_reduce");
}

void GlooCommunicator::all_gather(const Tensor& in, Tensor out) {
  check_collective_tensor(in, Device::cpu(), "gloo", "all_gather", "the input");
  check_collective_tensor(out, Device::cpu(), "gloo", "all_gather", "the output");
  check_all_gather(in, out, size_, "gloo");
  if (in.numel() == 0) return;
  if (size_ == 1) {
    std::memmove(out.data(), in.data(), in.nbytes());
    return;
  }
  run("all_gather", [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data()), in.nbytes());
    opts.setOutput(static_cast<uint8_t*>(out.data()), out.nbytes());
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  });
}

// Gloo has a reduce-scatter only as a class over its own reduction functions
// (no f16/bf16), so this all-reduces a copy of the input and keeps this
// rank's chunk: size() times the traffic of a true reduce-scatter, which is
// fine for host tensors, whose big collectives run on NCCL.
void GlooCommunicator::reduce_scatter(const Tensor& in, Tensor out) {
  check_collective_tensor(in, Device::cpu(), "gloo", "reduce_scatter", "the input");
  check_collective_tensor(out, Device::cpu(), "gloo", "reduce_scatter", "the output");
  check_reduce_scatter(in, out, size_, "gloo");
  if (out.numel() == 0) return;
  std::vector<uint8_t> sum(in.nbytes());
  std::memcpy(sum.data(), in.data(), in.nbytes());
  all_reduce_host(sum.data(), in.dtype(), in.numel(), ReduceOp::Sum, "reduce_scatter");
  std::memcpy(out.data(), sum.data() + static_cast<size_t>(rank_) * out.nbytes(), out.nbytes());
}

void GlooCommunicator::all_to_all(const Tensor& in, std::span<const int64_t> send_rows, Tensor out,
                                  std::span<const int64_t> recv_rows) {
  check_collective_tensor(in, Device::cpu(), "gloo", "all_to_all", "the input");
  check_collective_tensor(out, Device::cpu(), "gloo", "all_to_all", "the output");
  const AllToAllLayout layout = check_all_to_all(in, send_rows, out, recv_rows, rank_, size_, "gloo");
  if (size_ == 1) {
    if (in.nbytes() > 0) std::memmove(out.data(), in.data(), in.nbytes());
    return;
  }
  // Every rank takes part even with nothing to send or receive: the others
  // expect its (empty) messages.
  run("all_to_all", [&] {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(nonnull(in.data()), layout.send_bytes);
    opts.setOutput(nonnull(out.data()), layout.recv_bytes);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::alltoallv(opts);
  });
}

void GlooCommunicator::broadcast(Tensor t, int root) {
  check_collective_tensor(t, Device::cpu(), "gloo", "broadcast", "the tensor");
  DI_CHECK(root >= 0 && root < size_, "gloo broadcast: root {} is not a rank of {}", root, size_);
  broadcast_host(t.data(), t.nbytes(), root, "broadcast");
}

void GlooCommunicator::barrier() {
  if (size_ == 1) return;
  run("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

void GlooCommunicator::broadcast_bytes(std::vector<uint8_t>& bytes, int root) {
  DI_CHECK(root >= 0 && root < size_, "gloo broadcast_bytes: root {} is not a rank of {}", root, size_);
  int64_t n = rank_ == root ? static_cast<int64_t>(bytes.size()) : 0;
  broadcast_host(&n, sizeof(n), root, "broadcast_bytes (size)");
  if (rank_ != root) {
    DI_CHECK(n >= 0, "gloo broadcast_bytes: root {} sent the size {}", root, n);
    bytes.resize(static_cast<size_t>(n));
  }
  broadcast_host(bytes.data(), bytes.size(), root, "broadcast_bytes");
}

std::vector<std::vector<uint8_t>> GlooCommunicator::all_gather_bytes(const std::vector<uint8_t>& mine) {
  // The sizes first; then every rank's bytes padded to the largest.
  auto n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(size_), 0);
  all_gather(Tensor(&n, DType::I64, {1}), Tensor(sizes.data(), DType::I64, {size_}));
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(size_));
  if (widest <= 0) return all;
  std::vector<uint8_t> padded(mine);
  padded.resize(static_cast<size_t>(widest));
  std::vector<uint8_t> joined(static_cast<size_t>(widest) * static_cast<size_t>(size_));
  all_gather(Tensor(padded.data(), DType::U8, {widest}), Tensor(joined.data(), DType::U8, {widest * size_}));
  for (int r = 0; r < size_; ++r) {
    const int64_t got = sizes[static_cast<size_t>(r)];
    DI_CHECK(got >= 0 && got <= widest, "gloo all_gather_bytes: rank {} sent the size {}", r, got);
    const auto first = joined.begin() + static_cast<ptrdiff_t>(r * widest);
    all[static_cast<size_t>(r)].assign(first, first + static_cast<ptrdiff_t>(got));
  }
  return all;
}

int64_t GlooCommunicator::all_reduce_min(int64_t value) {
  all_reduce_host(&value, DType::I64, 1, ReduceOp::Min, "all_reduce_min");
  return value;
}

int64_t GlooCommunicator::all_reduce_max(int64_t value) {
  all_reduce_host(&value, DType::I64, 1, ReduceOp::Max, "all_reduce_max");
  return value;
}

}  // namespace deepinfer
