// TcpStoreServer: the key-value server behind TcpStore (src/dist/tcp_store.h),
// run by rank 0 on a thread of its own. Boost.Asio, one thread, every socket
// asynchronous: a client that sends a malformed or oversized frame, stalls
// half-way through one, or disappears loses its own connection (with a
// logged error) and never blocks or crashes the others. A Get or Wait whose
// keys are missing is answered when a Set brings the last of them; the
// client, not the server, decides how long to wait.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace deepinfer {

class TcpStoreServer {
 public:
  // Total bytes of keys and values held; a Set past it gets an error reply.
  static constexpr size_t kMaxStoredBytes = size_t{1} << 30;

  // Listens on bind_address ("0.0.0.0", "::", "127.0.0.1", ...) and port (0:
  // any free port, see port()). Throws deepinfer::Error when it cannot listen.
  TcpStoreServer(const std::string& bind_address, uint16_t port);
  ~TcpStoreServer();  // closes every connection and joins the thread
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }

  struct State;  // the server thread's state, in the .cpp

 private:
  std::unique_ptr<State> state_;
  uint16_t port_ = 0;
};

}  // namespace deepinfer
