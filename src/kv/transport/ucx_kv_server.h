// UcxKvServer: a prefill engine's side of the cross-node KV handoff
// (`serve --role prefill --kv-transport ucx`). It listens with UCX
// (TCP, or RDMA where the fabric has it: UCX picks), answers fetch requests
// (kv/transport/kv_wire.h) from the engine's host tier — the finished
// requests' blocks, published there by the offload path — and sends the
// payloads straight from the pinned host slots, no staging copy. A slot is
// unpinned when the send that reads it completes, or fails.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <vector>
#include <string>

#include "kv/transport/kv_transport_stats.h"
#include "kv/transport/ucx_worker.h"

namespace deepinfer {

class KvSlotPool;
struct KvFetchReplyHeader;

class UcxKvServer {
 public:
  // Serves `pool` (host memory) to engines whose KV fingerprint matches.
  // Listens on host:port (port 0: any free port). Throws Error when it cannot.
  UcxKvServer(std::shared_ptr<KvSlotPool> pool, std::string fingerprint, const std::string& host, uint16_t port);
  ~UcxKvServer();
  UcxKvServer(const UcxKvServer&) = delete;
  UcxKvServer& operator=(const UcxKvServer&) = delete;

  uint16_t port() const { return port_; }
  KvExportServerStats stats() const;

 private:
  struct ReplyOp;
  struct RequestRecv;
  static void on_connection(ucp_conn_request_h request, void* arg);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_fetch_request(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                       const ucp_am_recv_param_t* param);
  static void on_request_received(void* request, ucs_status_t status, size_t length, void* user_data);
  static void on_reply_sent(void* request, ucs_status_t status, void* user_data);
  void answer(std::span<const std::byte> bytes, ucp_ep_h reply_ep);
  void send_reply(ucp_ep_h ep, const KvFetchReplyHeader& header, std::vector<int32_t> slots);
  void finish_reply(ReplyOp* op);
  void close_endpoint(ucp_ep_h ep);

  std::shared_ptr<KvSlotPool> pool_;
  std::string fingerprint_;
  uint16_t port_ = 0;
  std::unique_ptr<UcxWorker> worker_;
  // Worker thread only.
  ucp_listener_h listener_ = nullptr;
  std::set<ucp_ep_h> endpoints_;
  int64_t in_flight_ = 0;  // reply sends, request receives and endpoint closes not yet complete
  std::atomic<int64_t> requests_{0}, refused_{0}, blocks_sent_{0}, bytes_sent_{0}, connections_{0};
};

}  // namespace deepinfer
