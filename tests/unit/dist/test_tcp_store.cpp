// TcpStore: its frames, the server with well-behaved clients, and the
// server facing malformed, oversized, stalled and impatient clients.
#include "dist/tcp_store.h"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <future>
#include <thread>

#include "core/error.h"
#include "dist/communicator.h"
#include "dist/tcp_store_server.h"
#include "dist/tcp_store_wire.h"

namespace deepinfer {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::vector<char> bytes(std::string_view s) { return {s.begin(), s.end()}; }

std::vector<uint8_t> body_of(const std::vector<uint8_t>& frame) {
  return {frame.begin() + kStoreFrameHeaderBytes, frame.end()};
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> frame_of(const std::vector<uint8_t>& body) {
  std::vector<uint8_t> f;
  f.reserve(kStoreFrameHeaderBytes + body.size());
  put_u32(f, static_cast<uint32_t>(body.size()));
  for (uint8_t b : body) f.push_back(b);
  return f;
}

// --- frames -----------------------------------------------------------------

TEST(TcpStoreWire, RequestsRoundTrip) {
  const std::vector<StoreRequest> requests = {
      {StoreOp::Set, {"deepinfer/tp/rank_0"}, bytes("host-a")},
      {StoreOp::Set, {"empty"}, {}},
      {StoreOp::Get, {"k"}, {}},
      {StoreOp::Wait, {"a", "bb", "ccc"}, {}},
      {StoreOp::Wait, {}, {}},
  };
  for (const StoreRequest& r : requests) {
    const std::vector<uint8_t> frame = encode_store_request(r);
    const std::span<const uint8_t> header(frame.data(), kStoreFrameHeaderBytes);
    EXPECT_EQ(decode_store_frame_length(header.first<kStoreFrameHeaderBytes>(), kStoreMaxRequestBytes),
              frame.size() - kStoreFrameHeaderBytes);
    const StoreRequest back = decode_store_request(body_of(frame));
    EXPECT_EQ(back.op, r.op);
    EXPECT_EQ(back.keys, r.keys);
    EXPECT_EQ(back.value, r.value);
  }
  const std::vector<uint8_t> reply = encode_store_reply(StoreStatus::Error, bytes("full"));
  const StoreReply back = decode_store_reply(body_of(reply));
  EXPECT_EQ(back.status, StoreStatus::Error);
  EXPECT_EQ(back.payload, bytes("full"));
}

TEST(TcpStoreWire, MalformedFramesAreErrors) {
  const std::array<uint8_t, 4> zero{0, 0, 0, 0}, huge{0xff, 0xff, 0xff, 0xff};
  EXPECT_THROW(decode_store_frame_length(zero, kStoreMaxRequestBytes), Error);
  EXPECT_THROW(decode_store_frame_length(huge, kStoreMaxRequestBytes), Error);

  auto request_error = [](std::vector<uint8_t> body) {
    try {
      decode_store_request(body);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(request_error({}).find("the op"), std::string::npos);
  EXPECT_NE(request_error({99}).find("unknown op 99"), std::string::npos);
  std::vector<uint8_t> get{2};
  put_u32(get, 0);
  EXPECT_NE(request_error(get).find("key length 0"), std::string::npos);
  get = {2};
  put_u32(get, kStoreMaxKeyBytes + 1);
  EXPECT_NE(request_error(get).find("key length 4097"), std::string::npos);
  get = {2};
  put_u32(get, 10);
  get.push_back('k');  // 1 of 10 key bytes
  EXPECT_NE(request_error(get).find("a key needs 10 bytes, 1 left"), std::string::npos);
  get = {2};
  put_u32(get, 1);
  get.push_back('k');
  get.push_back('!');  // one byte too many
  EXPECT_NE(request_error(get).find("left over"), std::string::npos);
  std::vector<uint8_t> set{1};
  put_u32(set, 1);
  set.push_back('k');
  put_u32(set, 0xffffffffu);
  EXPECT_NE(request_error(set).find("value length"), std::string::npos);
  std::vector<uint8_t> wait{3};
  put_u32(wait, 1u << 30);
  EXPECT_NE(request_error(wait).find("keys"), std::string::npos);
  wait = {3};
  put_u32(wait, 1000);  // within the limit, but not in 5 bytes
  EXPECT_NE(request_error(wait).find("cannot fit"), std::string::npos);

  EXPECT_THROW(decode_store_reply(std::vector<uint8_t>{}), Error);
  EXPECT_THROW(decode_store_reply(std::vector<uint8_t>{7}), Error);
  EXPECT_THROW(encode_store_request({StoreOp::Get, {""}, {}}), Error);
  EXPECT_THROW(encode_store_request({StoreOp::Get, {std::string(kStoreMaxKeyBytes + 1, 'k')}, {}}), Error);
}

// --- server and clients -----------------------------------------------------

TcpStoreOptions server_options(std::chrono::milliseconds timeout = 5s) { return {"127.0.0.1", 0, true, timeout}; }
TcpStoreOptions client_options(uint16_t port, std::chrono::milliseconds timeout = 5s) {
  return {"127.0.0.1", port, false, timeout};
}

TEST(TcpStore, SetGetWaitAcrossClients) {
  TcpStore server(server_options());
  ASSERT_NE(server.port(), 0);
  TcpStore client(client_options(server.port()));
  server.set("a", bytes("alpha"));
  EXPECT_EQ(client.get("a"), bytes("alpha"));
  client.set("a", bytes("again"));  // overwrites
  EXPECT_EQ(server.get("a"), bytes("again"));
  client.set("empty", {});
  EXPECT_TRUE(server.get("empty").empty());
  client.wait({"a", "empty"});
  std::vector<char> big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 13);
  client.set("big", big);
  EXPECT_EQ(server.get("big"), big);
}

TEST(TcpStore, GetWaitsForALaterSet) {
  TcpStore server(server_options());
  TcpStore waiter(client_options(server.port()));
  TcpStore setter(client_options(server.port()));
  auto value = std::async(std::launch::async, [&] { return waiter.get("late"); });
  auto all = std::async(std::launch::async, [&] {
    TcpStore w(client_options(server.port()));
    w.wait({"late", "later"});
    return true;
  });
  std::this_thread::sleep_for(100ms);
  setter.set("late", bytes("here"));
  EXPECT_EQ(value.get(), bytes("here"));
  setter.set("later", bytes("too"));
  EXPECT_TRUE(all.get());
}

TEST(TcpStore, MissingKeyTimesOutWithCommError) {
  TcpStore server(server_options(300ms));
  const Clock::time_point start = Clock::now();
  try {
    server.get("never");
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_THROW(server.wait({"never"}, 100ms), CommError);
  // The client reconnects after a timeout.
  server.set("k", bytes("v"));
  EXPECT_EQ(server.get("k"), bytes("v"));
}

uint16_t free_port() {
  asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

TEST(TcpStore, ClientsWaitForALateServer) {
  const uint16_t port = free_port();
  auto value = std::async(std::launch::async, [&] {
    TcpStore client(client_options(port));
    return client.get("k");
  });
  std::this_thread::sleep_for(300ms);
  TcpStore server({"127.0.0.1", port, true, 5s});
  server.set("k", bytes("v"));
  EXPECT_EQ(value.get(), bytes("v"));
}

TEST(TcpStore, NoServerIsCommErrorAfterTheTimeout) {
  TcpStore client(client_options(free_port(), 300ms));
  try {
    client.set("k", {});
    FAIL() << "set without a server returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("no server at 127.0.0.1:"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerGoneIsCommError) {
  auto server = std::make_unique<TcpStore>(server_options());
  TcpStore client(client_options(server->port(), 1s));
  client.set("k", bytes("v"));
  auto pending = std::async(std::launch::async, [&] { return client.get("never"); });
  std::this_thread::sleep_for(100ms);
  server.reset();
  EXPECT_THROW(pending.get(), CommError);
}

// A raw connection to the server, for frames no client would send.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }
  void send(const std::vector<uint8_t>& data) { asio::write(socket_, asio::buffer(data)); }
  // True when the server closed the connection (within a second).
  bool closed_by_server() {
    socket_.non_blocking(true);
    const Clock::time_point deadline = Clock::now() + 2s;
    std::array<uint8_t, 64> buf{};
    while (Clock::now() < deadline) {
      boost::system::error_code ec;
      socket_.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      if (ec) return ec == asio::error::eof || ec == asio::error::connection_reset;
    }
    return false;
  }

 private:
  asio::io_context io_;
  tcp::socket socket_;
};

TEST(TcpStoreServer, HostileClientsLoseOnlyTheirOwnConnection) {
  TcpStore server(server_options());
  TcpStore good(client_options(server.port()));
  good.set("k", bytes("v"));

  // A length past the limit.
  RawConnection too_long(server.port());
  too_long.send({0xff, 0xff, 0xff, 0xff});
  EXPECT_TRUE(too_long.closed_by_server());

  // An unknown op.
  RawConnection bad_op(server.port());
  bad_op.send(frame_of({42, 1, 2, 3}));
  EXPECT_TRUE(bad_op.closed_by_server());

  // A key length that runs past the frame.
  RawConnection bad_key(server.port());
  std::vector<uint8_t> body{static_cast<uint8_t>(StoreOp::Get)};
  put_u32(body, 1000);
  bad_key.send(frame_of(body));
  EXPECT_TRUE(bad_key.closed_by_server());

  // A second request while the first still waits for its key.
  RawConnection impatient(server.port());
  impatient.send(encode_store_request({StoreOp::Get, {"missing"}, {}}));
  impatient.send(encode_store_request({StoreOp::Get, {"k"}, {}}));
  EXPECT_TRUE(impatient.closed_by_server());

  // A frame that promises 64 MiB and stalls after a few bytes, and a client
  // that leaves while it waits: neither holds the others up.
  RawConnection stalled(server.port());
  std::vector<uint8_t> promise{0, 0, 0, 4};  // 64 MiB
  promise.push_back(static_cast<uint8_t>(StoreOp::Set));
  stalled.send(promise);
  {
    RawConnection leaves(server.port());
    leaves.send(encode_store_request({StoreOp::Get, {"missing"}, {}}));
  }

  EXPECT_EQ(good.get("k"), bytes("v"));
  good.set("missing", bytes("now"));
  TcpStore another(client_options(server.port()));
  EXPECT_EQ(another.get("missing"), bytes("now"));
}

TEST(TcpStoreServer, ListenFailureIsAnError) {
  TcpStoreServer first("127.0.0.1", 0);
  EXPECT_THROW(TcpStoreServer("127.0.0.1", first.port()), Error);
  EXPECT_THROW(TcpStoreServer("not-an-address", 0), Error);
}

}  // namespace
}  // namespace deepinfer
