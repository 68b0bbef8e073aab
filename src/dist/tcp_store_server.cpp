#include "dist/tcp_store_server.h"

#include <array>
#include <boost/asio.hpp>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "dist/tcp_store_wire.h"

namespace deepinfer {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

// A frame body arrives in pieces of at most this size, so a connection holds
// only the memory its peer has actually sent, not what its header claims.
constexpr size_t kReadChunkBytes = 1 << 20;
// After accept() fails (e.g. out of file descriptors), wait before trying
// again instead of spinning.
constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

class Session;

}  // namespace

struct TcpStoreServer::State {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::thread thread;
  // Touched only on the server thread.
  std::unordered_map<std::string, std::vector<char>> data;
  size_t stored_bytes = 0;
  std::unordered_set<std::shared_ptr<Session>> sessions;

  void accept();
  void handle(const std::shared_ptr<Session>& s, StoreRequest request);
  bool has_keys(const StoreRequest& r) const;
  void answer(Session& s, const StoreRequest& r);
  void answer_waiters();
  void close_all();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TcpStoreServer::State& server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {
    error_code ec;
    const tcp::endpoint peer = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("an unknown peer") : fmt::format("{}:{}", peer.address().to_string(), peer.port());
  }

  void start() { read_header(); }

  // A Get or Wait whose keys are missing; answered by State::answer_waiters.
  std::optional<StoreRequest> waiting;

  void send(std::vector<uint8_t> frame) {
    if (closed_) return;
    out_.push_back(std::move(frame));
    if (out_.size() == 1) write_next();
  }

  // Ends the connection; `why` is empty for an orderly close by the peer.
  void close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    if (why.empty()) {
      log_debug("tcp store: {} disconnected", peer_);
    } else {
      log_error("tcp store: closing the connection from {}: {}", peer_, why);
    }
    error_code ignored;
    socket_.close(ignored);
    server_.sessions.erase(shared_from_this());
  }

  void close_quietly() {
    closed_ = true;
    error_code ignored;
    socket_.close(ignored);
  }

 private:
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](const error_code& ec, size_t) { self->on_header(ec); });
  }

  void on_header(const error_code& ec) {
    if (closed_) return;
    if (ec) return close(ec == asio::error::eof ? "" : ec.message());
    try {
      body_size_ = decode_store_frame_length(header_, kStoreMaxRequestBytes);
    } catch (const Error& e) {
      return close(e.what());
    }
    body_.clear();
    read_body();
  }

  void read_body() {
    const size_t have = body_.size();
    const size_t chunk = std::min(kReadChunkBytes, body_size_ - have);
    body_.resize(have + chunk);
    asio::async_read(socket_, asio::buffer(body_.data() + have, chunk),
                     [self = shared_from_this()](const error_code& ec, size_t) { self->on_body(ec); });
  }

  void on_body(const error_code& ec) {
    if (closed_) return;
    if (ec) return close(ec == asio::error::eof ? "the peer left in the middle of a frame" : ec.message());
    if (body_.size() < body_size_) return read_body();
    StoreRequest request;
    try {
      request = decode_store_request(body_);
    } catch (const Error& e) {
      return close(e.what());
    }
    body_ = {};
    // A client sends its next request only after the reply to the last one.
    if (waiting) return close("a new request while the last one still waits for its keys");
    server_.handle(shared_from_this(), std::move(request));
    if (!closed_) read_header();
  }

  void write_next() {
    asio::async_write(socket_, asio::buffer(out_.front()),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (self->closed_) return;
                        if (ec) return self->close(ec.message());
                        self->out_.pop_front();
                        if (!self->out_.empty()) self->write_next();
                      });
  }

  TcpStoreServer::State& server_;
  tcp::socket socket_;
  std::string peer_;
  std::array<uint8_t, kStoreFrameHeaderBytes> header_{};
  size_t body_size_ = 0;
  std::vector<uint8_t> body_;
  std::deque<std::vector<uint8_t>> out_;
  bool closed_ = false;
};

std::vector<uint8_t> error_reply(const std::string& message) {
  return encode_store_reply(StoreStatus::Error, std::span<const char>(message.data(), message.size()));
}

}  // namespace

void TcpStoreServer::State::accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      log_error("tcp store: accept failed: {}; retrying in {} ms", ec.message(), kAcceptRetryDelay.count());
      accept_retry.expires_after(kAcceptRetryDelay);
      accept_retry.async_wait([this](const error_code& wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto session = std::make_shared<Session>(*this, std::move(socket));
    sessions.insert(session);
    session->start();
    accept();
  });
}

bool TcpStoreServer::State::has_keys(const StoreRequest& r) const {
  for (const std::string& k : r.keys) {
    if (!data.contains(k)) return false;
  }
  return true;
}

// Replies to a Get or Wait whose keys all exist.
void TcpStoreServer::State::answer(Session& s, const StoreRequest& r) {
  if (r.op == StoreOp::Get) {
    s.send(encode_store_reply(StoreStatus::Ok, data.at(r.keys[0])));
  } else {
    s.send(encode_store_reply(StoreStatus::Ok, {}));
  }
}

void TcpStoreServer::State::handle(const std::shared_ptr<Session>& s, StoreRequest request) {
  if (request.op != StoreOp::Set) {
    if (has_keys(request)) {
      answer(*s, request);
    } else {
      s->waiting = std::move(request);
    }
    return;
  }
  const std::string& key = request.keys[0];
  auto it = data.find(key);
  const size_t old_bytes = it == data.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + request.value.size();
  if (stored_bytes - old_bytes + new_bytes > kMaxStoredBytes) {
    s->send(error_reply(fmt::format("the store is full ({} bytes); '{}' was not set", stored_bytes, key)));
    return;
  }
  stored_bytes = stored_bytes - old_bytes + new_bytes;
  data[key] = std::move(request.value);
  s->send(encode_store_reply(StoreStatus::Ok, {}));
  answer_waiters();
}

void TcpStoreServer::State::answer_waiters() {
  for (const std::shared_ptr<Session>& s : sessions) {
    if (s->waiting && has_keys(*s->waiting)) {
      answer(*s, *s->waiting);
      s->waiting.reset();
    }
  }
}

void TcpStoreServer::State::close_all() {
  error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (const std::shared_ptr<Session>& s : sessions) s->close_quietly();
  sessions.clear();
}

TcpStoreServer::TcpStoreServer(const std::string& bind_address, uint16_t port) : state_(std::make_unique<State>()) {
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(bind_address, ec);
  DI_CHECK(!ec, "tcp store: '{}' is not an address to listen on: {}", bind_address, ec.message());
  const tcp::endpoint endpoint(address, port);
  tcp::acceptor& a = state_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) port_ = a.local_endpoint(ec).port();
  DI_CHECK(!ec, "tcp store: cannot listen on {}:{}: {}", bind_address, port, ec.message());
  state_->accept();
  state_->thread = std::thread([s = state_.get()] { s->io.run(); });
  log_debug("tcp store: serving on {}:{}", bind_address, port_);
}

TcpStoreServer::~TcpStoreServer() {
  asio::post(state_->io, [s = state_.get()] { s->close_all(); });
  state_->thread.join();
}

}  // namespace deepinfer
