#include "kv/transport/ucx_kv_client.h"

#include <netdb.h>

#include <cstring>

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer {

struct UcxKvClient::Receive {
  UcxKvClient* client;
  uint64_t id;
  uint32_t first, count;
  std::vector<ucp_dt_iov_t> iov;
};

struct UcxKvClient::SendOp {
  UcxKvClient* client;
  uint64_t id;
  std::vector<std::byte> bytes;
};

UcxKvClient::UcxKvClient(std::chrono::milliseconds timeout)
    : timeout_(timeout), worker_(std::make_unique<UcxWorker>("kv transport client")) {
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                  UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kKvFetchReplyMessage;
  hp.cb = &UcxKvClient::on_reply;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  check_ucx(ucp_worker_set_am_recv_handler(worker_->worker(), &hp), "registering the reply handler");
  worker_->set_tick([this] { expire(); });
  worker_->set_on_stop(
      [this] {
        std::vector<uint64_t> ids;
        for (const auto& [id, f] : fetches_) ids.push_back(id);
        for (const uint64_t id : ids) fail(id, "the engine is stopping");
        const auto open = endpoints_;
        for (const auto& [peer, ep] : open) drop_endpoint(ep);
      },
      [this] { return fetches_.empty() && in_flight_ == 0; });
  worker_->start();
}

UcxKvClient::~UcxKvClient() {
  worker_->stop();
  // Whatever did not finish in time finishes empty (its receives die with the worker).
  for (auto& [id, f] : fetches_) f.done(0);
  fetches_.clear();
}

RemoteKvFetchStats UcxKvClient::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void UcxKvClient::fetch(const KvSourceAddress& source, KvFetchRequest request, std::vector<std::span<std::byte>> dests,
                        std::function<void(size_t)> done) {
  DI_CHECK(dests.size() == request.blocks.size(), "kv fetch: {} destinations for {} blocks", dests.size(),
           request.blocks.size());
  for (const auto& d : dests) DI_CHECK(d.size() == request.block_bytes, "kv fetch: a destination of {} bytes", d.size());
  Fetch f;
  f.dests = std::move(dests);
  f.block_bytes = request.block_bytes;
  f.done = std::move(done);
  worker_->post([this, source, request = std::move(request), f = std::move(f)]() mutable {
    const uint64_t id = next_id_++;
    start(source, id, std::move(request), std::move(f));
  });
}

void UcxKvClient::start(const KvSourceAddress& source, uint64_t id, KvFetchRequest request, Fetch f) {
  f.peer = fmt::format("{}:{}", source.host, source.port);
  f.start = std::chrono::steady_clock::now();
  f.deadline = f.start + timeout_;
  try {
    f.ep = endpoint(source, f.peer);
  } catch (const Error& e) {
    log_warn("kv transport: {}", e.what());
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.fetches;
      ++stats_.failed;
    }
    f.done(0);
    return;
  }
  ucp_ep_h ep = f.ep;
  fetches_.emplace(id, std::move(f));
  request.fetch_id = id;
  auto* op = new SendOp{this, id, encode_fetch_request(request)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &UcxKvClient::on_request_sent;
  p.user_data = op;
  p.flags = UCP_AM_SEND_FLAG_REPLY;  // the answer comes back on this endpoint
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, kKvFetchRequestMessage, nullptr, 0, op->bytes.data(), op->bytes.size(), &p);
  if (r == nullptr) {
    delete op;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete op;
    fail(id, ucs_status_string(UCS_PTR_STATUS(r)));
  } else {
    ++in_flight_;
  }
}

void UcxKvClient::on_request_sent(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendOp> op(static_cast<SendOp*>(user_data));
  UcxKvClient* self = op->client;
  --self->in_flight_;
  ucp_request_free(request);
  if (status != UCS_OK) self->fail(op->id, ucs_status_string(status));
}

ucp_ep_h UcxKvClient::endpoint(const KvSourceAddress& source, const std::string& peer) {
  if (auto it = endpoints_.find(peer); it != endpoints_.end()) return it->second;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(source.port);
  const int rc = getaddrinfo(source.host.c_str(), service.c_str(), &hints, &found);
  DI_CHECK(rc == 0 && found != nullptr, "cannot resolve the prefill engine {}: {}", peer, gai_strerror(rc));
  sockaddr_storage address{};
  const socklen_t length = std::min<socklen_t>(found->ai_addrlen, sizeof address);
  std::memcpy(&address, found->ai_addr, length);
  freeaddrinfo(found);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
  ep.sockaddr.addrlen = length;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxKvClient::on_endpoint_error;
  ep.err_handler.arg = this;
  ucp_ep_h h = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_->worker(), &ep, &h);
  DI_CHECK(s == UCS_OK, "cannot connect to the prefill engine {}: {}", peer, ucs_status_string(s));
  endpoints_.emplace(peer, h);
  std::lock_guard lock(stats_mutex_);
  stats_.connections = static_cast<int64_t>(endpoints_.size());
  return h;
}

void UcxKvClient::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxKvClient*>(arg);
  log_warn("kv transport: lost a prefill engine ({})", ucs_status_string(status));
  self->worker_->post([self, ep] { self->drop_endpoint(ep); });
}

void UcxKvClient::drop_endpoint(ucp_ep_h ep) {
  bool known = false;
  for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
    if (it->second == ep) {
      endpoints_.erase(it);
      known = true;
      break;
    }
  }
  if (!known) return;
  {
    std::lock_guard lock(stats_mutex_);
    stats_.connections = static_cast<int64_t>(endpoints_.size());
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, f] : fetches_) {
    if (f.ep == ep) ids.push_back(id);
  }
  for (const uint64_t id : ids) fail(id, "the prefill engine was lost");
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.user_data = this;
  p.cb.send = [](void* request, ucs_status_t, void* user) {
    --static_cast<UcxKvClient*>(user)->in_flight_;
    ucp_request_free(request);
  };
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) ++in_flight_;
}

ucs_status_t UcxKvClient::on_reply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxKvClient*>(arg);
  // Replies to a fetch that has ended (timed out, failed) are dropped; so is
  // anything malformed, which also ends its fetch.
  if (header_length != sizeof(KvFetchReplyHeader)) return UCS_OK;
  KvFetchReplyHeader raw;
  std::memcpy(&raw, header, sizeof raw);
  auto it = self->fetches_.find(raw.fetch_id);
  if (it == self->fetches_.end() || it->second.failed) return UCS_OK;
  Fetch& f = it->second;
  const uint64_t id = raw.fetch_id;
  KvFetchReplyHeader h;
  try {
    h = decode_fetch_reply_header({static_cast<const std::byte*>(header), header_length}, f.dests.size());
  } catch (const Error& e) {
    self->fail(id, e.what());
    return UCS_OK;
  }
  if (h.status != static_cast<uint32_t>(KvFetchStatus::Ok)) {
    self->fail(id, h.status == static_cast<uint32_t>(KvFetchStatus::Refused)
                       ? "refused (another model or KV layout, or a malformed request)"
                       : "the prefill engine is not ready");
    return UCS_OK;
  }
  if (!f.answered) {
    f.answered = true;
    f.expected = h.found;
    f.covered.assign(h.found, false);
  }
  if (h.found != f.expected || length != size_t{h.count} * f.block_bytes) {
    self->fail(id, "an inconsistent reply");
    return UCS_OK;
  }
  for (uint32_t i = h.first; i < h.first + h.count; ++i) {
    if (f.covered[i]) {
      self->fail(id, "a block sent twice");
      return UCS_OK;
    }
    f.covered[i] = true;
  }
  if (h.count == 0) {
    self->maybe_finish(id);
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    const auto* src = static_cast<const std::byte*>(data);
    for (uint32_t i = 0; i < h.count; ++i) {
      std::memcpy(f.dests[h.first + i].data(), src + size_t{i} * f.block_bytes, f.block_bytes);
    }
    f.received += h.count;
    self->maybe_finish(id);
    return UCS_OK;
  }
  // Rendezvous: the payloads land straight in the destination slots.
  auto* rcv = new Receive{self, id, h.first, h.count, {}};
  for (uint32_t i = 0; i < h.count; ++i) rcv->iov.push_back({f.dests[h.first + i].data(), f.block_bytes});
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  p.cb.recv_am = &UcxKvClient::on_received;
  p.user_data = rcv;
  p.datatype = ucp_dt_make_iov();
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->worker_->worker(), data, rcv->iov.data(), rcv->iov.size(), &p);
  if (r == nullptr) {
    f.received += h.count;
    delete rcv;
    self->maybe_finish(id);
  } else if (UCS_PTR_IS_ERR(r)) {
    delete rcv;
    self->fail(id, ucs_status_string(UCS_PTR_STATUS(r)));
  } else {
    f.receiving.push_back(r);
  }
  return UCS_OK;
}

void UcxKvClient::on_received(void* request, ucs_status_t status, size_t, void* user_data) {
  std::unique_ptr<Receive> rcv(static_cast<Receive*>(user_data));
  UcxKvClient* self = rcv->client;
  auto it = self->fetches_.find(rcv->id);
  ucp_request_free(request);
  if (it == self->fetches_.end()) return;
  std::erase(it->second.receiving, request);
  if (status != UCS_OK) {
    self->fail(rcv->id, ucs_status_string(status));
    return;
  }
  it->second.received += rcv->count;
  self->maybe_finish(rcv->id);
}

void UcxKvClient::fail(uint64_t id, const char* why) {
  auto it = fetches_.find(id);
  if (it == fetches_.end()) return;
  Fetch& f = it->second;
  if (!f.failed) {
    f.failed = true;
    log_warn("kv transport: a fetch from {} failed: {}; the prompt is recomputed", f.peer, why);
    // Receives in flight write into the destinations: they must end before done().
    for (void* r : f.receiving) ucp_request_cancel(worker_->worker(), r);
  }
  maybe_finish(id);
}

void UcxKvClient::maybe_finish(uint64_t id) {
  auto it = fetches_.find(id);
  if (it == fetches_.end()) return;
  Fetch& f = it->second;
  if (!f.receiving.empty()) return;
  if (!f.failed && !(f.answered && f.received == f.expected)) return;
  const size_t n = f.failed ? 0 : f.expected;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.start).count();
  {
    std::lock_guard lock(stats_mutex_);
    ++stats_.fetches;
    if (f.failed) ++stats_.failed;
    stats_.blocks += static_cast<int64_t>(n);
    stats_.bytes += static_cast<int64_t>(n * f.block_bytes);
    if (n > 0) stats_.seconds += secs;
  }
  std::function<void(size_t)> done = std::move(f.done);
  fetches_.erase(it);
  done(n);
}

void UcxKvClient::expire() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint64_t> late;
  for (const auto& [id, f] : fetches_) {
    if (!f.failed && now >= f.deadline) late.push_back(id);
  }
  for (const uint64_t id : late) fail(id, "no answer in time");
}

}  // namespace deepinfer
