// UcxKvClient: a decode engine's side of the cross-node KV handoff
// (`serve --role decode --kv-transport ucx`). It keeps one UCX endpoint per
// prefill engine it has fetched from, sends fetch requests
// (kv/transport/kv_wire.h) and lands each reply's payloads straight in the
// destination host slots (a rendezvous receive into their addresses).
// A fetch that gets no answer in time, or whose peer is lost, completes with
// nothing — the engine then recomputes the prompt; a destination is written
// only before done() is called.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kv/transport/remote_kv_fetcher.h"
#include "kv/transport/ucx_worker.h"

namespace deepinfer {

class UcxKvClient final : public RemoteKvFetcher {
 public:
  // timeout: how long a fetch may wait for its answer.
  explicit UcxKvClient(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Completes every pending fetch (with nothing) and closes the endpoints.
  ~UcxKvClient() override;

  void fetch(const KvSourceAddress& source, KvFetchRequest request, std::vector<std::span<std::byte>> dests,
             std::function<void(size_t)> done) override;
  RemoteKvFetchStats stats() const override;

 private:
  struct Fetch {
    ucp_ep_h ep = nullptr;
    std::string peer;
    std::vector<std::span<std::byte>> dests;
    size_t block_bytes = 0;
    size_t expected = 0;     // blocks the answer carries (known from the first reply)
    bool answered = false;   // a first reply has come
    size_t received = 0;
    std::vector<bool> covered;  // blocks some reply has carried
    bool failed = false;
    std::vector<void*> receiving;  // rendezvous receives in flight
    std::chrono::steady_clock::time_point start, deadline;
    std::function<void(size_t)> done;
  };
  struct Receive;
  struct SendOp;

  ucp_ep_h endpoint(const KvSourceAddress& source, const std::string& peer);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_reply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  static void on_received(void* request, ucs_status_t status, size_t length, void* user_data);
  static void on_request_sent(void* request, ucs_status_t status, void* user_data);
  void start(const KvSourceAddress& source, uint64_t id, KvFetchRequest request, Fetch fetch);
  void fail(uint64_t id, const char* why);
  void maybe_finish(uint64_t id);
  void drop_endpoint(ucp_ep_h ep);
  void expire();

  std::chrono::milliseconds timeout_;
  std::unique_ptr<UcxWorker> worker_;
  // Worker thread only.
  std::map<std::string, ucp_ep_h> endpoints_;  // "host:port" -> endpoint
  std::unordered_map<uint64_t, Fetch> fetches_;
  uint64_t next_id_ = 1;
  int64_t in_flight_ = 0;  // sends and endpoint closes not yet complete
  mutable std::mutex stats_mutex_;
  RemoteKvFetchStats stats_;
};

}  // namespace deepinfer
