// TcpStore: the rendezvous store behind init_method "tcp://host:port" — a
// gloo::rendezvous::Store the ranks use to swap their connection addresses
// before they connect to each other. Rank 0's store object also runs the
// server (TcpStoreServer, on a thread it owns); every rank, rank 0 included,
// is a client of it. Clients keep retrying the connection until the timeout,
// so the ranks may start in any order.
//
// Thread-safe (one request at a time per object). Errors — no server within
// the timeout, a key that does not appear in time, a lost connection — throw
// CommError naming the server and the keys.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/dist_config.h"

namespace deepinfer {

class TcpStoreServer;
class TcpStoreClient;

struct TcpStoreOptions {
  std::string host;  // the server's host (a name or an address)
  uint16_t port = 0;  // 0 with serve: any free port, see TcpStore::port()
  // Run the server here (rank 0). It listens on `host` when that is a
  // loopback address, else on every interface.
  bool serve = false;
  // How long a client keeps trying to connect, and how long get() and wait()
  // wait for their keys unless told otherwise.
  std::chrono::milliseconds timeout = DistConfig::kDefaultTimeout;
};

class TcpStore final : public gloo::rendezvous::Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  uint16_t port() const { return port_; }

  void set(const std::string& key, const std::vector<char>& value) override;
  // Waits until the key exists (or the timeout passes).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  TcpStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  uint16_t port_ = 0;
  std::mutex mutex_;
  std::unique_ptr<TcpStoreClient> client_;
};

}  // namespace deepinfer
