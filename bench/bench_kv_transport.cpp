// Throughput of the cross-node KV transport (src/kv/transport): a
// UcxKvServer serving a host tier of `blocks` blocks of `block_kib` KiB and a
// UcxKvClient fetching all of them (one prompt's prefix) `reps` times, over
// whatever UCX picks between the two endpoints (set UCX_TLS to choose; on one
// host it may use shared memory). Reports the median fetch's GB/s beside two
// references on this host: a plain memcpy of the same bytes (the one-copy
// limit: a fetch moves each byte at least once) and the same bytes sent over
// a plain TCP connection through `host` (what the kernel's TCP path gives,
// the path UCX takes where there is no RDMA).
//   bench_kv_transport [block_kib=2048] [blocks=256] [reps=5] [host=127.0.0.1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/tiers/host_tier.h"
#include "kv/transport/ucx_kv_client.h"
#include "kv/transport/ucx_kv_server.h"

using namespace deepinfer;

namespace {

// Seconds to send `bytes` from one thread to another over a TCP connection through 127.0.0.1.
double tcp_seconds(const std::vector<std::byte>& src, std::vector<std::byte>& dst) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 1) != 0) return -1;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread sender([&] {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    for (size_t off = 0; off < src.size();) {
      const ssize_t n = ::send(s, src.data() + off, src.size() - off, 0);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(s);
  });
  const int c = ::accept(listener, nullptr, nullptr);
  for (size_t off = 0; off < dst.size();) {
    const ssize_t n = ::recv(c, dst.data() + off, dst.size() - off, 0);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  sender.join();
  ::close(c);
  ::close(listener);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t block_bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2048) << 10;
  const int32_t blocks = argc > 2 ? std::atoi(argv[2]) : 256;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const std::string host = argc > 4 ? argv[4] : "127.0.0.1";
  auto backend = create_backend(DeviceType::CPU);
  auto pool = std::make_shared<HostKvTier>(*backend, block_bytes, blocks);
  KvFetchRequest request;
  request.block_bytes = block_bytes;
  request.fingerprint = "bench";
  std::vector<int32_t> tokens(16);
  for (int32_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < 16; ++i) tokens[static_cast<size_t>(i)] = b * 16 + i;
    const KvBlockIdentity id{100u + static_cast<uint64_t>(b), b ? 99u + static_cast<uint64_t>(b) : 0u, b == 0, "",
                             tokens};
    const auto slot = pool->reserve(id, 0);
    if (!slot) return 1;
    std::memset(pool->payload(*slot).data(), b & 0xff, block_bytes);
    pool->publish(*slot);
    request.blocks.push_back({id.key, id.parent_key, id.first, tokens});
  }
  UcxKvServer server(pool, "bench", host, 0);
  UcxKvClient client;
  std::vector<std::byte> dest(block_bytes * static_cast<size_t>(blocks));
  std::vector<std::span<std::byte>> spans;
  for (int32_t b = 0; b < blocks; ++b) spans.emplace_back(dest.data() + block_bytes * static_cast<size_t>(b), block_bytes);
  const double gb = static_cast<double>(dest.size()) / 1e9;
  std::vector<double> fetch_s, copy_s, tcp_s;
  std::vector<std::byte> tcp_src(dest.size(), std::byte{1});
  for (int r = 0; r < reps + 1; ++r) {  // the first connects and warms up: not counted
    std::promise<size_t> got;
    const auto t0 = std::chrono::steady_clock::now();
    client.fetch({host, server.port()}, request, spans, [&](size_t n) { got.set_value(n); });
    const size_t n = got.get_future().get();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (n != static_cast<size_t>(blocks)) {
      std::fprintf(stderr, "fetch %d brought %zu of %d blocks\n", r, n, blocks);
      return 1;
    }
    if (r > 0) fetch_s.push_back(s);
    const auto c0 = std::chrono::steady_clock::now();
    for (int32_t b = 0; b < blocks; ++b) {
      std::memcpy(spans[static_cast<size_t>(b)].data(), pool->payload(b).data(), block_bytes);
    }
    if (r > 0) copy_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    const double t = tcp_seconds(tcp_src, dest);
    if (r > 0) tcp_s.push_back(t);
  }
  std::sort(fetch_s.begin(), fetch_s.end());
  std::sort(copy_s.begin(), copy_s.end());
  std::sort(tcp_s.begin(), tcp_s.end());
  const double f = fetch_s[fetch_s.size() / 2], c = copy_s[copy_s.size() / 2], t = tcp_s[tcp_s.size() / 2];
  std::printf("kv transport (UCX_TLS=%s): %d blocks x %zu KiB = %.3f GB per fetch\n",
              std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "default", blocks, block_bytes >> 10, gb);
  std::printf("fetch: median %.2f ms, %.2f GB/s; memcpy of the same bytes: %.2f ms, %.2f GB/s; fetch at %.0f%% of memcpy\n",
              f * 1e3, gb / f, c * 1e3, gb / c, 100.0 * c / f);
  std::printf("plain TCP through 127.0.0.1, same bytes: %.2f ms, %.2f GB/s; fetch at %.0f%% of plain TCP\n", t * 1e3,
              gb / t, 100.0 * t / f);
  return 0;
}
