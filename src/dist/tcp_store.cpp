#include "dist/tcp_store.h"

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/logging.h"
#include "dist/communicator.h"
#include "dist/tcp_store_server.h"
#include "dist/tcp_store_wire.h"

namespace deepinfer {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

// Connection attempts back off from 10 ms to 1 s: rank 0 may start seconds
// after the others, and a thousand ranks should not hammer it meanwhile.
constexpr std::chrono::milliseconds kFirstRetryDelay{10};
constexpr std::chrono::milliseconds kMaxRetryDelay{1000};

std::string host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string describe_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 4;
  std::string s;
  for (size_t i = 0; i < std::min(keys.size(), kShown); ++i) s += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  if (keys.size() > kShown) s += fmt::format(" and {} more", keys.size() - kShown);
  return s;
}

// Where the server listens: the host itself when it is a loopback address
// (a one-node job stays off the network), else every interface of its family.
std::string bind_address_for(const std::string& host) {
  asio::io_context io;
  tcp::resolver resolver(io);
  error_code ec;
  const auto results = resolver.resolve(host, "", ec);
  DI_CHECK(!ec && !results.empty(), "tcp store: cannot resolve '{}': {}", host, ec.message());
  for (const auto& r : results) {
    if (r.endpoint().address().is_loopback()) return r.endpoint().address().to_string();
  }
  return results.begin()->endpoint().address().is_v6() ? "::" : "0.0.0.0";
}

}  // namespace

// One connection to the server, driven on the calling thread: each
// operation runs the client's own io_context until it completes or its
// deadline passes (then the socket is closed and the next call reconnects).
class TcpStoreClient {
 public:
  TcpStoreClient(std::string host, uint16_t port) : host_(std::move(host)), port_(port) {}

  std::vector<char> call(const StoreRequest& request, Clock::time_point deadline, const std::string& what) {
    const std::vector<uint8_t> frame = encode_store_request(request);
    if (!socket_.is_open()) connect(deadline);
    check(run(deadline, [&](auto done) { asio::async_write(socket_, asio::buffer(frame), done); }), what);
    std::array<uint8_t, kStoreFrameHeaderBytes> header{};
    check(run(deadline, [&](auto done) { asio::async_read(socket_, asio::buffer(header), done); }), what);
    size_t body_size = 0;
    try {
      body_size = decode_store_frame_length(header, kStoreMaxReplyBytes);
    } catch (const Error& e) {
      drop();
      throw CommError(fmt::format("tcp store at {}: {}: {}", where(), what, e.what()));
    }
    std::vector<uint8_t> body(body_size);
    check(run(deadline, [&](auto done) { asio::async_read(socket_, asio::buffer(body), done); }), what);
    StoreReply reply;
    try {
      reply = decode_store_reply(body);
    } catch (const Error& e) {
      drop();
      throw CommError(fmt::format("tcp store at {}: {}: {}", where(), what, e.what()));
    }
    if (reply.status == StoreStatus::Error) {
      throw CommError(fmt::format("tcp store at {}: {}: {}", where(), what,
                                  std::string(reply.payload.begin(), reply.payload.end())));
    }
    return std::move(reply.payload);
  }

 private:
  // Starts one asynchronous operation (start(handler)) and runs it to its end
  // or the deadline; returns its error, asio::error::timed_out past the deadline.
  template <typename Start>
  error_code run(Clock::time_point deadline, Start&& start) {
    std::optional<error_code> result;
    io_.restart();
    start([&result](const error_code& ec, auto&&...) { result = ec; });
    while (!result && io_.run_one_until(deadline) > 0) {
    }
    if (result) return *result;
    drop();  // cancels the operation: its handler runs with operation_aborted
    io_.restart();
    io_.run();
    return asio::error::timed_out;
  }

  void check(const error_code& ec, const std::string& what) {
    if (!ec) return;
    drop();
    if (ec == asio::error::timed_out) throw CommError(fmt::format("tcp store at {}: timed out {}", where(), what));
    throw CommError(fmt::format("tcp store at {}: {}: {}", where(), what,
                                ec == asio::error::eof ? "the server closed the connection" : ec.message()));
  }

  void connect(Clock::time_point deadline) {
    std::chrono::milliseconds delay = kFirstRetryDelay;
    std::string last_error;
    for (int attempt = 1;; ++attempt) {
      error_code ec;
      tcp::resolver resolver(io_);
      const auto endpoints = resolver.resolve(host_, std::to_string(port_), ec);
      if (!ec) {
        ec = run(deadline, [&](auto done) {
          asio::async_connect(socket_, endpoints, [done](const error_code& e, const tcp::endpoint&) { done(e); });
        });
      }
      if (!ec) {
        socket_.set_option(tcp::no_delay(true), ec);
        log_debug("tcp store: connected to {} after {} attempt(s)", where(), attempt);
        return;
      }
      drop();
      last_error = ec == asio::error::timed_out ? "no answer" : ec.message();
      const Clock::time_point now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(delay, deadline - now));
      delay = std::min(delay * 2, kMaxRetryDelay);
    }
    throw CommError(fmt::format("tcp store: no server at {} before the timeout (is rank 0 running? last error: {})",
                                where(), last_error));
  }

  void drop() {
    error_code ignored;
    socket_.close(ignored);
  }

  std::string where() const { return host_port(host_, port_); }

  std::string host_;
  uint16_t port_;
  asio::io_context io_;
  tcp::socket socket_{io_};
};

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)), port_(options_.port) {
  DI_CHECK(!options_.host.empty(), "tcp store: no host");
  DI_CHECK(options_.timeout.count() > 0, "tcp store: the timeout must be positive");
  if (options_.serve) {
    server_ = std::make_unique<TcpStoreServer>(bind_address_for(options_.host), options_.port);
    port_ = server_->port();
  } else {
    DI_CHECK(port_ != 0, "tcp store: a client needs the server's port");
  }
  client_ = std::make_unique<TcpStoreClient>(options_.host, port_);
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  std::lock_guard lock(mutex_);
  client_->call({StoreOp::Set, {key}, value}, Clock::now() + options_.timeout, fmt::format("setting '{}'", key));
}

std::vector<char> TcpStore::get(const std::string& key) {
  std::lock_guard lock(mutex_);
  return client_->call({StoreOp::Get, {key}, {}}, Clock::now() + options_.timeout,
                       fmt::format("waiting {} ms for key '{}'", options_.timeout.count(), key));
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  std::lock_guard lock(mutex_);
  // gloo passes kNoTimeout (zero) for "no limit": the store's own timeout then.
  const std::chrono::milliseconds limit = timeout.count() > 0 ? timeout : options_.timeout;
  client_->call({StoreOp::Wait, keys, {}}, Clock::now() + limit,
                fmt::format("waiting {} ms for keys {}", limit.count(), describe_keys(keys)));
}

}  // namespace deepinfer
