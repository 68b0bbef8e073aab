// Backend discovery through etcd (docs/router.md, "Discovery"): engines
// register themselves, the router lists them, instead of a static --backend
// list.
//
//   serve  --etcd http://E:2379 --advertise-url http://me:8001
//          puts /deepinfer/backends/<url> = {"url", "role", "model"} under a
//          lease of a few seconds and keeps the lease alive from a thread;
//          a clean exit revokes it, a crash lets it expire.
//   router --etcd http://E:2379
//          lists the prefix every health interval: new engines join the
//          pool, those whose key is gone leave it.
//
// Only etcd's v3 JSON gateway (HTTP) is used: no gRPC or client library.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "router/http_client.h"

namespace deepinfer::router {

inline constexpr const char* kEtcdBackendPrefix = "/deepinfer/backends/";

class EtcdClient {
 public:
  EtcdClient(Url endpoint, std::chrono::milliseconds timeout) : endpoint_(std::move(endpoint)), timeout_(timeout) {}

  // A lease of ttl_s seconds; nothing when etcd does not answer.
  std::optional<int64_t> grant_lease(int64_t ttl_s);
  // Renews the lease; false when etcd does not answer or the lease is gone.
  bool keep_alive(int64_t lease);
  bool revoke(int64_t lease);
  bool put(const std::string& key, const std::string& value, int64_t lease);
  // Every key under `prefix` with its value; nothing when etcd does not answer.
  std::optional<std::vector<std::pair<std::string, std::string>>> list(const std::string& prefix);

 private:
  // POSTs a JSON body to the gateway; the answer's body when it is a 200.
  std::optional<std::string> call(const std::string& path, const std::string& body);
  Url endpoint_;
  std::chrono::milliseconds timeout_;
};

// serve's registration: register() once, then a thread keeps the lease alive
// and registers again when it was lost (etcd restarted, a long pause).
class EtcdRegistration {
 public:
  // value: the JSON etcd holds for this backend.
  EtcdRegistration(Url endpoint, std::string backend_url, std::string value, int64_t ttl_s = 10);
  // Revokes the lease: the router sees the backend leave at its next listing.
  ~EtcdRegistration();
  EtcdRegistration(const EtcdRegistration&) = delete;
  EtcdRegistration& operator=(const EtcdRegistration&) = delete;

 private:
  bool register_now();
  void loop();

  EtcdClient client_;
  std::string key_, value_;
  int64_t ttl_s_;
  int64_t lease_ = 0;  // 0: not registered
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// The router's side: the backend URLs etcd lists now (values that are not a
// backend record are skipped, logged once). Nothing when etcd does not answer.
std::optional<std::vector<std::string>> list_etcd_backends(EtcdClient& client);

}  // namespace deepinfer::router
