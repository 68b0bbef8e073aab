#include "kv/transport/ucx_kv_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "kv/tiers/kv_slot_pool.h"
#include "kv/transport/kv_wire.h"

namespace deepinfer {
namespace {

// Blocks per reply at most: replies of a long prompt go out one after the
// other, each a separate message the receiver lands directly in its slots.
constexpr size_t kMaxBlocksPerReply = 64;

sockaddr_storage resolve_listen_address(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  DI_CHECK(rc == 0 && found != nullptr, "--kv-transport-address: cannot resolve '{}': {}", host, gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, std::min<size_t>(found->ai_addrlen, sizeof out));
  freeaddrinfo(found);
  return out;
}

}  // namespace

struct UcxKvServer::ReplyOp {
  UcxKvServer* server;
  KvFetchReplyHeader header;
  std::vector<ucp_dt_iov_t> iov;
  std::vector<int32_t> slots;
};

struct UcxKvServer::RequestRecv {
  UcxKvServer* server;
  ucp_ep_h reply_ep;
  std::vector<std::byte> bytes;
};

UcxKvServer::UcxKvServer(std::shared_ptr<KvSlotPool> pool, std::string fingerprint, const std::string& host,
                         uint16_t port)
    : pool_(std::move(pool)), fingerprint_(std::move(fingerprint)) {
  DI_CHECK(pool_ != nullptr && !pool_->payload_on_device(), "kv transport ucx: the export pool must be host memory");
  worker_ = std::make_unique<UcxWorker>("kv transport server");
  ucp_worker_h w = worker_->worker();
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                  UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kKvFetchRequestMessage;
  hp.cb = &UcxKvServer::on_fetch_request;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  check_ucx(ucp_worker_set_am_recv_handler(w, &hp), "registering the fetch handler");

  const sockaddr_storage address = resolve_listen_address(host, port);
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
  lp.sockaddr.addrlen = address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  lp.conn_handler.cb = &UcxKvServer::on_connection;
  lp.conn_handler.arg = this;
  const ucs_status_t s = ucp_listener_create(w, &lp, &listener_);
  DI_CHECK(s == UCS_OK, "kv transport ucx: cannot listen on {}:{}: {}", host, port, ucs_status_string(s));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  check_ucx(ucp_listener_query(listener_, &attr), "querying the listener");
  const auto* sa = reinterpret_cast<const sockaddr*>(&attr.sockaddr);
  port_ = ntohs(sa->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port
                                          : reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  worker_->set_on_stop(
      [this] {
        if (listener_ != nullptr) ucp_listener_destroy(listener_);
        listener_ = nullptr;
        const std::set<ucp_ep_h> open = endpoints_;
        for (ucp_ep_h ep : open) close_endpoint(ep);
      },
      [this] { return in_flight_ == 0; });
  worker_->start();
  log_info("kv transport: serving KV blocks over UCX on {}:{}", host, port_);
}

UcxKvServer::~UcxKvServer() { worker_->stop(); }

KvExportServerStats UcxKvServer::stats() const {
  return {requests_.load(), refused_.load(), blocks_sent_.load(), bytes_sent_.load(), connections_.load()};
}

void UcxKvServer::on_connection(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<UcxKvServer*>(arg);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxKvServer::on_endpoint_error;
  ep.err_handler.arg = self;
  ucp_ep_h h = nullptr;
  if (const ucs_status_t s = ucp_ep_create(self->worker_->worker(), &ep, &h); s != UCS_OK) {
    log_warn("kv transport: refusing a connection: {}", ucs_status_string(s));
    return;
  }
  self->endpoints_.insert(h);
  self->connections_ = static_cast<int64_t>(self->endpoints_.size());
}

void UcxKvServer::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxKvServer*>(arg);
  // A decode engine that went away: its sends fail (and unpin their slots).
  log_info("kv transport: a decode engine disconnected ({})", ucs_status_string(status));
  self->worker_->post([self, ep] {
    if (self->endpoints_.contains(ep)) self->close_endpoint(ep);
  });
}

void UcxKvServer::close_endpoint(ucp_ep_h ep) {
  endpoints_.erase(ep);
  connections_ = static_cast<int64_t>(endpoints_.size());
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.user_data = this;
  p.cb.send = [](void* request, ucs_status_t, void* user) {
    --static_cast<UcxKvServer*>(user)->in_flight_;
    ucp_request_free(request);
  };
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) ++in_flight_;
}

ucs_status_t UcxKvServer::on_fetch_request(void* arg, const void*, size_t, void* data, size_t length,
                                           const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxKvServer*>(arg);
  ucp_ep_h reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  if (reply_ep == nullptr) {
    ++self->refused_;
    return UCS_OK;  // nobody to answer (and nothing received: UCX drops it)
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    self->answer({static_cast<const std::byte*>(data), length}, reply_ep);
    return UCS_OK;
  }
  // A large request comes by rendezvous: receive it whole, then answer.
  if (length > kKvWireMaxRequestBytes) {
    ++self->refused_;
    KvFetchReplyHeader h;
    h.status = static_cast<uint32_t>(KvFetchStatus::Refused);
    self->send_reply(reply_ep, h, {});
    return UCS_OK;
  }
  auto* recv = new RequestRecv{self, reply_ep, std::vector<std::byte>(length)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxKvServer::on_request_received;
  p.user_data = recv;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->worker_->worker(), data, recv->bytes.data(), length, &p);
  if (r == nullptr) {
    on_request_received(nullptr, UCS_OK, length, recv);
  } else if (UCS_PTR_IS_ERR(r)) {
    on_request_received(nullptr, UCS_PTR_STATUS(r), 0, recv);
  } else {
    ++self->in_flight_;
  }
  return UCS_OK;
}

void UcxKvServer::on_request_received(void* request, ucs_status_t status, size_t, void* user_data) {
  std::unique_ptr<RequestRecv> recv(static_cast<RequestRecv*>(user_data));
  UcxKvServer* self = recv->server;
  if (request != nullptr) {
    --self->in_flight_;
    ucp_request_free(request);
  }
  if (status != UCS_OK) return;  // the peer is gone
  self->answer(recv->bytes, recv->reply_ep);
}

void UcxKvServer::answer(std::span<const std::byte> bytes, ucp_ep_h reply_ep) {
  ++requests_;
  KvFetchReplyHeader h;
  KvFetchRequest req;
  try {
    req = decode_fetch_request(bytes);
  } catch (const Error& e) {
    ++refused_;
    log_warn("kv transport: a malformed fetch request: {}", e.what());
    h.status = static_cast<uint32_t>(KvFetchStatus::Refused);
    send_reply(reply_ep, h, {});
    return;
  }
  h.fetch_id = req.fetch_id;
  if (req.fingerprint != fingerprint_ || req.block_bytes != pool_->block_bytes()) {
    ++refused_;
    if (req.block_bytes != pool_->block_bytes()) {
      log_warn("kv transport: refusing a fetch of {}-byte blocks (here {})", req.block_bytes, pool_->block_bytes());
    } else {
      log_warn("kv transport: refusing a fetch for another model or KV layout ('{}', here '{}')", req.fingerprint,
               fingerprint_);
    }
    h.status = static_cast<uint32_t>(KvFetchStatus::Refused);
    send_reply(reply_ep, h, {});
    return;
  }
  // The leading run of blocks this engine holds, pinned until sent.
  std::vector<int32_t> slots;
  for (const KvWireBlock& b : req.blocks) {
    const KvBlockIdentity id{b.key, b.parent_key, b.first, req.salt, b.tokens};
    const int32_t slot = pool_->find_and_pin(id);
    if (slot < 0) break;
    slots.push_back(slot);
  }
  h.found = static_cast<uint32_t>(slots.size());
  if (slots.empty()) {
    send_reply(reply_ep, h, {});
    return;
  }
  for (size_t first = 0; first < slots.size(); first += kMaxBlocksPerReply) {
    const size_t count = std::min(kMaxBlocksPerReply, slots.size() - first);
    h.first = static_cast<uint32_t>(first);
    h.count = static_cast<uint32_t>(count);
    send_reply(reply_ep, h, {slots.begin() + static_cast<ptrdiff_t>(first),
                             slots.begin() + static_cast<ptrdiff_t>(first + count)});
  }
}

void UcxKvServer::send_reply(ucp_ep_h ep, const KvFetchReplyHeader& header, std::vector<int32_t> slots) {
  auto* op = new ReplyOp{this, header, {}, std::move(slots)};
  for (const int32_t s : op->slots) {
    const std::span<std::byte> payload = pool_->payload(s);
    op->iov.push_back({payload.data(), payload.size()});
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxKvServer::on_reply_sent;
  p.user_data = op;
  if (!op->iov.empty()) {  // an empty answer has no data (and UCX wants no empty iov list)
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
  }
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, kKvFetchReplyMessage, &op->header, sizeof op->header,
                                       op->iov.empty() ? nullptr : op->iov.data(), op->iov.size(), &p);
  if (r == nullptr) {
    finish_reply(op);
  } else if (UCS_PTR_IS_ERR(r)) {
    log_warn("kv transport: sending a reply failed: {}", ucs_status_string(UCS_PTR_STATUS(r)));
    for (const int32_t s : op->slots) pool_->unpin(s);
    delete op;
  } else {
    ++in_flight_;
  }
}

void UcxKvServer::on_reply_sent(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<ReplyOp*>(user_data);
  UcxKvServer* self = op->server;
  --self->in_flight_;
  ucp_request_free(request);
  if (status != UCS_OK) {
    for (const int32_t s : op->slots) self->pool_->unpin(s);
    delete op;
    return;
  }
  self->finish_reply(op);
}

void UcxKvServer::finish_reply(ReplyOp* op) {
  for (const int32_t s : op->slots) pool_->unpin(s);
  blocks_sent_ += static_cast<int64_t>(op->slots.size());
  bytes_sent_ += static_cast<int64_t>(op->slots.size() * pool_->block_bytes());
  delete op;
}

}  // namespace deepinfer
