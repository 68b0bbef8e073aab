#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>

#include <deque>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

class Session : public std::enable_shared_from_this<Session>, public ResponseChannel {
 public:
  Session(tcp::socket socket, const HttpServerOptions& options, const RequestHandler& handler,
          std::shared_ptr<std::atomic<size_t>> active)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), options_(options), handler_(handler),
        active_(std::move(active)) {}

  void start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  void send(int status, std::string content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override {
    post([self = shared_from_this(), status, ct = std::move(content_type), body = std::move(body),
          headers = std::move(headers)]() mutable {
      if (self->closed_ || !self->busy_ || self->started_) return;
      http::response<http::string_body> res{http::int_to_status(static_cast<unsigned>(status)), 11};
      res.set(http::field::server, "deepinfer");
      res.set(http::field::content_type, ct);
      for (auto& [k, v] : headers) res.set(k, v);
      res.keep_alive(self->keep_alive_);
      res.body() = std::move(body);
      res.prepare_payload();
      std::ostringstream os;
      os << res;
      self->started_ = true;
      self->end_pending_ = true;
      self->enqueue(os.str());
    });
  }

  void start_stream(int status, std::string content_type) override {
    post([self = shared_from_this(), status, ct = std::move(content_type)] {
      if (self->closed_ || !self->busy_ || self->started_) return;
      self->started_ = true;
      const auto st = http::int_to_status(static_cast<unsigned>(status));
      std::string head = "HTTP/1.1 " + std::to_string(status) + " " + std::string(http::obsolete_reason(st)) +
                         "\r\nServer: deepinfer\r\nContent-Type: " + ct +
                         "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: " +
                         (self->keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n";
      self->enqueue(std::move(head));
    });
  }

  void write(std::string data) override {
    if (data.empty()) return;
    post([self = shared_from_this(), data = std::move(data)] {
      if (self->closed_ || !self->busy_ || !self->started_ || self->end_pending_) return;
      char size[20];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      self->enqueue(size + data + "\r\n");
    });
  }

  void end() override {
    post([self = shared_from_this()] {
      if (self->closed_ || !self->busy_ || !self->started_ || self->end_pending_) return;
      self->end_pending_ = true;
      self->enqueue("0\r\n\r\n");
    });
  }

  void post(std::function<void()> fn) override { asio::post(socket_.get_executor(), std::move(fn)); }

  void on_disconnect(std::function<void()> fn) override {
    post([self = shared_from_this(), fn = std::move(fn)]() mutable {
      if (self->closed_) {
        fn();
      } else if (self->busy_) {
        self->on_disconnect_ = std::move(fn);
      }
    });
  }

 private:
  void arm_timer(double secs) {
    timer_.expires_after(seconds(secs));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->close();
    });
  }

  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(options_.body_limit);
    parser_->header_limit(options_.header_limit);
    arm_timer(first_ ? options_.read_timeout_s : options_.keep_alive_timeout_s);
    first_ = false;
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Clients such as curl ask before sending a large body; answering saves them a wait.
  void on_header(beast::error_code ec) {
    if (ec || closed_) {
      on_read(ec);
      return;
    }
    auto read_body = [self = shared_from_this()] {
      http::async_read(self->socket_, self->buffer_, *self->parser_,
                       [self](beast::error_code ec, size_t) { self->on_read(ec); });
    };
    const auto expect = parser_->get()[http::field::expect];
    if (beast::iequals(expect, "100-continue") && !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(socket_, asio::buffer(kContinue), [self = shared_from_this(), read_body](beast::error_code ec, size_t) {
        if (ec) {
          self->close();
        } else {
          read_body();
        }
      });
    } else {
      read_body();
    }
  }

  void on_read(beast::error_code ec) {
    timer_.cancel();
    if (closed_) return;
    if (ec) {
      if (ec == http::error::body_limit) {
        reply_and_close(413, "the request body exceeds " + std::to_string(options_.body_limit) + " bytes");
      } else if (ec == http::error::header_limit) {
        reply_and_close(431, "the request headers are too large");
      } else if (ec.category() == beast::error_code(http::error::end_of_stream).category() && ec != http::error::end_of_stream &&
                 ec != http::error::partial_message) {
        reply_and_close(400, "malformed HTTP request: " + ec.message());
      } else {
        close();
      }
      return;
    }
    HttpRequest req = parser_->release();
    keep_alive_ = req.keep_alive();
    begin_response();
    watch();
    try {
      handler_(std::move(req), shared_from_this());
    } catch (const std::exception& e) {
      log_error("request handler failed: {}", e.what());
      send(500, "application/json", R"({"error":{"message":"internal server error","type":"api_error","param":null,"code":500}})", {});
    }
  }

  void reply_and_close(int status, const std::string& message) {
    keep_alive_ = false;
    begin_response();
    std::string body = R"({"error":{"message":")" + message + R"(","type":"invalid_request_error","param":null,"code":)" +
                       std::to_string(status) + "}}";
    send(status, "application/json", std::move(body), {});
  }

  void begin_response() {
    busy_ = true;
    started_ = false;
    end_pending_ = false;
    active_->fetch_add(1);
  }

  // A read kept pending while a response is produced: it notices a client
  // that disconnects, and keeps bytes of a pipelined next request.
  void watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    socket_.async_read_some(asio::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_watch(ec, n);
    });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    if (closing_) {
      lingered_bytes_ += n + 1;
      if (ec) {
        close();
      } else {
        linger();
      }
      return;
    }
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      if (ec == asio::error::operation_aborted || !ec) {
        auto dst = buffer_.prepare(n);
        asio::buffer_copy(dst, asio::buffer(watch_buf_.data(), n));
        buffer_.commit(n);
        read_request();
        return;
      }
    }
    if (ec) {
      close();
      return;
    }
    auto dst = buffer_.prepare(n);
    asio::buffer_copy(dst, asio::buffer(watch_buf_.data(), n));
    buffer_.commit(n);
    // Bytes of a pipelined request (or stray bytes): they are kept and parsed
    // once the current response is done. Watching goes on so that a client
    // that closes now is still noticed, up to a bound on buffered bytes
    // (beyond it the client waits, as TCP flow control makes it).
    if (busy_) {
      if (buffer_.size() < kMaxBufferedWhileBusy) watch();
      return;
    }
    timer_.cancel();
    read_request();
  }

  void enqueue(std::string data) {
    out_.push_back(std::move(data));
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    asio::async_write(socket_, asio::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_write(ec);
    });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) {
      close();
      return;
    }
    out_.pop_front();
    if (!out_.empty()) {
      do_write();
    } else if (end_pending_ && busy_) {
      finish_response();
    }
  }

  void finish_response() {
    busy_ = false;
    end_pending_ = false;
    on_disconnect_ = nullptr;
    active_->fetch_sub(1);
    if (!keep_alive_) {
      beast::error_code ec;
      socket_.shutdown(tcp::socket::shutdown_send, ec);
      closing_ = true;
      linger();
      return;
    }
    if (!watching_) {
      read_request();
    } else if (buffer_.size() > 0) {
      // A pipelined request is already buffered: stop the watch read, whose
      // completion then starts parsing it.
      resume_after_watch_ = true;
      beast::error_code ec;
      socket_.cancel(ec);
    } else {
      arm_timer(options_.keep_alive_timeout_s);  // the pending watch read picks up the next request
    }
  }

  // Closing with unread bytes (a refused giant body) resets the connection and
  // can destroy the answer in flight; read and discard for a moment first.
  void linger() {
    if (watching_) {
      arm_timer(kLingerSeconds);  // the pending watch read ends at EOF
      return;
    }
    if (closed_) return;
    if (lingered_bytes_ == 0) arm_timer(kLingerSeconds);
    socket_.async_read_some(asio::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_bytes_ += n;
      if (ec || self->lingered_bytes_ > kLingerMaxBytes) {
        self->close();
      } else {
        self->linger();
      }
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (busy_) {
      busy_ = false;
      active_->fetch_sub(1);
      if (on_disconnect_) {
        auto fn = std::move(on_disconnect_);
        on_disconnect_ = nullptr;
        fn();
      }
    }
    timer_.cancel();
    beast::error_code ec;
    socket_.close(ec);
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  const HttpServerOptions& options_;
  const RequestHandler& handler_;
  std::shared_ptr<std::atomic<size_t>> active_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> watch_buf_{};
  std::deque<std::string> out_;
  std::function<void()> on_disconnect_;
  bool first_ = true;
  bool keep_alive_ = true;
  bool busy_ = false;
  bool started_ = false;
  bool end_pending_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool closing_ = false;
  size_t lingered_bytes_ = 0;
  static constexpr double kLingerSeconds = 2.0;
  static constexpr size_t kLingerMaxBytes = 64u << 20;
  static constexpr size_t kMaxBufferedWhileBusy = 64u << 10;
  bool closed_ = false;
};

}  // namespace

struct HttpServer::Impl {
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  asio::steady_timer retry{ioc};
  std::vector<std::thread> threads;
  RequestHandler handler;
  HttpServerOptions options;
  std::shared_ptr<std::atomic<size_t>> active;

  void accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors and the like: back off briefly instead of spinning.
        log_warn("accept failed: {}", ec.message());
        retry.expires_after(std::chrono::milliseconds(50));
        retry.async_wait([this](beast::error_code) { accept(); });
        return;
      }
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(socket), options, handler, active)->start();
      accept();
    });
  }
};

HttpServer::HttpServer(HttpServerOptions options, RequestHandler handler)
    : impl_(std::make_unique<Impl>()), options_(std::move(options)), active_(std::make_shared<std::atomic<size_t>>(0)) {
  impl_->handler = std::move(handler);
  impl_->options = options_;
  impl_->active = active_;
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  beast::error_code ec;
  const auto address = asio::ip::make_address(options_.host, ec);
  DI_CHECK(!ec, "invalid --host '{}': {}", options_.host, ec.message());
  tcp::endpoint endpoint(address, options_.port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  DI_CHECK(!ec, "cannot open a socket: {}", ec.message());
  acc.set_option(asio::socket_base::reuse_address(true), ec);
  acc.bind(endpoint, ec);
  DI_CHECK(!ec, "cannot bind {}:{}: {}", options_.host, options_.port, ec.message());
  acc.listen(asio::socket_base::max_listen_connections, ec);
  DI_CHECK(!ec, "cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  port_ = acc.local_endpoint().port();
  impl_->accept();
  for (int i = 0; i < std::max(options_.io_threads, 1); ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
}

void HttpServer::stop_accepting() {
  asio::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->retry.cancel();
  });
}

void HttpServer::stop() {
  if (!impl_) return;
  impl_->ioc.stop();
  for (auto& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
  impl_->threads.clear();
}

}  // namespace deepinfer::server
