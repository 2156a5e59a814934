#include "coordinator/http/dashboard_server.h"

#include <openssl/ssl.h>
#include <sys/stat.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net.h"

namespace ddp {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

std::chrono::nanoseconds Chrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// What tells a file was replaced (renamed over: another inode) or rewritten.
struct FileStamp {
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  off_t size = 0;
  bool operator==(const FileStamp& o) const {
    return inode == o.inode && mtime_ns == o.mtime_ns && size == o.size;
  }
};

FileStamp Stamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {};
  return {st.st_ino, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec, st.st_size};
}

// A server context with the certificate chain and key, TLS 1.2 or newer.
absl::StatusOr<std::shared_ptr<ssl::context>> LoadTls(const std::string& cert,
                                                      const std::string& key) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                       ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                   ec);
  if (ctx->use_certificate_chain_file(cert, ec); ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert ", cert, ": the dashboard cannot load this certificate chain (", ec.message(),
        ")"));
  }
  if (ctx->use_private_key_file(key, ssl::context::pem, ec); ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key ", key, ": the dashboard cannot load this private key (", ec.message(), ")"));
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", key, " is not the key of --tls-cert ", cert));
  }
  return ctx;
}

// Percent-decoding of a path ('+' stays itself there, unlike in a query).
std::string DecodePath(beast::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<std::string> Header(const http::request<http::string_body>& req, http::field f) {
  auto it = req.find(f);
  if (it == req.end()) return std::nullopt;
  return std::string(it->value());
}

bool IsHttpError(const beast::error_code& ec) {
  return &ec.category() == &http::make_error_code(http::error::bad_target).category();
}

}  // namespace

class DashboardServer::Impl {
 public:
  Impl(const DashboardServerOptions& options, std::unique_ptr<DashboardHandler> handler)
      : options_(options), handler_(std::move(handler)) {}

  ~Impl() {
    ioc_.stop();  // A handler running now completes; the rest are dropped.
    for (std::thread& t : threads_) t.join();
  }

  absl::Status Listen() {
    auto parsed = ParseHostPort(options_.listen);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-listen: ", parsed.status().message()));
    }
    if (!options_.cert_file.empty()) {
      auto ctx = LoadTls(options_.cert_file, options_.key_file);
      if (!ctx.ok()) return ctx.status();
      tls_ = *std::move(ctx);
      cert_stamp_ = Stamp(options_.cert_file);
      key_stamp_ = Stamp(options_.key_file);
    }
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto endpoints = resolver.resolve(parsed->host, std::to_string(parsed->port),
                                      tcp::resolver::passive, ec);
    if (ec || endpoints.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-listen ", options_.listen, ": cannot resolve ", parsed->host, " (",
          ec ? ec.message() : "no address", ")"));
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    auto unavailable = [&](const char* what) {
      return absl::UnavailableError(absl::StrCat("cannot serve the dashboard on --http-listen ",
                                                 options_.listen, " (", what, ": ",
                                                 ec.message(), "): is the port taken?"));
    };
    if (acceptor_.open(endpoint.protocol(), ec); ec) return unavailable("socket");
    // Not SO_REUSEPORT: a second coordinator must fail to bind, not share the port.
    if (acceptor_.set_option(net::socket_base::reuse_address(true), ec); ec) {
      return unavailable("SO_REUSEADDR");
    }
    if (acceptor_.bind(endpoint, ec); ec) return unavailable("bind");
    if (acceptor_.listen(net::socket_base::max_listen_connections, ec); ec) {
      return unavailable("listen");
    }
    port_ = acceptor_.local_endpoint(ec).port();
    Accept();
    if (tls_) ScheduleRefresh();
    // Two threads: one handler may wait on the coordinator's locks while the other
    // keeps accepting and reading; waiting clients take no thread at all.
    for (int i = 0; i < 2; ++i) {
      threads_.emplace_back([this] {
        for (;;) {
          try {
            ioc_.run();
            return;
          } catch (const std::exception& e) {
            DDP_LOG(ERROR) << "dashboard: " << e.what();
          }
        }
      });
    }
    return absl::OkStatus();
  }

  std::shared_ptr<ssl::context> tls() const {
    std::lock_guard<std::mutex> lock(tls_mu_);
    return tls_;
  }

  const DashboardServerOptions options_;
  const std::unique_ptr<DashboardHandler> handler_;
  std::atomic<int> connections_{0};
  int port_ = 0;

 private:
  void Accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec,
                                                          tcp::socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors, say: try again shortly rather than spin.
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](beast::error_code ec) {
          if (!ec) Accept();
        });
        return;
      }
      if (connections_.load() >= options_.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);  // Full: closed before anything is read or allocated.
      } else {
        // Answers and TLS flights go out whole: no waiting on Nagle for a delayed ACK.
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        StartSession(std::move(socket));
      }
      Accept();
    });
  }

  void StartSession(tcp::socket socket);

  void ScheduleRefresh() {
    refresh_.expires_after(Chrono(options_.tls_refresh));
    refresh_.async_wait([this](beast::error_code ec) {
      if (ec) return;
      ReloadIfChanged();
      ScheduleRefresh();
    });
  }

  // As gRPC re-reads its certificate: new connections get the new files.
  void ReloadIfChanged() {
    const FileStamp cert = Stamp(options_.cert_file), key = Stamp(options_.key_file);
    if (cert == cert_stamp_ && key == key_stamp_) return;
    cert_stamp_ = cert;  // Also on failure: one warning per change, not one per check.
    key_stamp_ = key;
    auto ctx = LoadTls(options_.cert_file, options_.key_file);
    if (!ctx.ok()) {
      DDP_LOG(WARNING) << "dashboard: keeping the certificate it serves: "
                       << ctx.status().message();
      return;
    }
    std::lock_guard<std::mutex> lock(tls_mu_);
    tls_ = *std::move(ctx);
    DDP_LOG(INFO) << "dashboard: serving the certificate re-read from " << options_.cert_file;
  }

  mutable std::mutex tls_mu_;
  std::shared_ptr<ssl::context> tls_;  // Null: plain HTTP.
  FileStamp cert_stamp_, key_stamp_;   // Touched by the refresh timer's handler only.
  // Last: destroyed first, with the connections its pending handlers hold, while
  // the handler and the counter above still exist.
  net::io_context ioc_{2};
  tcp::acceptor acceptor_{ioc_};
  net::steady_timer retry_{ioc_};
  net::steady_timer refresh_{ioc_};
  std::vector<std::thread> threads_;
};

namespace {

// One connection: requests read by Beast's parser within their deadlines, answered
// by the handler, kept alive while the client asks to.
template <bool kTls>
class Session : public std::enable_shared_from_this<Session<kTls>> {
 public:
  using Stream = std::conditional_t<kTls, beast::ssl_stream<beast::tcp_stream>, beast::tcp_stream>;

  Session(DashboardServer::Impl* server, tcp::socket socket, std::shared_ptr<ssl::context> tls)
      : server_(server), tls_(std::move(tls)), stream_(MakeStream(std::move(socket), tls_.get())) {
    ++server_->connections_;
  }
  ~Session() { --server_->connections_; }

  void Start() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      // One deadline for the handshake and the whole first request.
      self->Lowest().expires_after(Chrono(self->options().header_timeout));
      if constexpr (kTls) {
        self->stream_.async_handshake(ssl::stream_base::server,
                                      [self](beast::error_code ec) {
                                        if (!ec) self->Read(/*first=*/true);
                                      });
      } else {
        self->Read(/*first=*/true);
      }
    });
  }

 private:
  static Stream MakeStream(tcp::socket socket, ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *tls);
    } else {
      return Stream(std::move(socket));
    }
  }
  const DashboardServerOptions& options() const { return server_->options_; }
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Read(bool first) {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options().max_header_bytes));
    parser_->body_limit(options().max_body_bytes);
    auto self = this->shared_from_this();
    auto done = [self](beast::error_code ec, size_t) { self->OnRead(ec); };
    if (first) {
      http::async_read(stream_, buffer_, *parser_, done);
      return;
    }
    // Keep-alive: idle_timeout for the next request's first bytes, then header_timeout
    // for the rest. (Beast's parser takes a header only whole, so http::async_read_some
    // would wait for all of it: the first bytes are read from the stream directly.)
    auto rest = [self, done] {
      self->Lowest().expires_after(Chrono(self->options().header_timeout));
      http::async_read(self->stream_, self->buffer_, *self->parser_, done);
    };
    if (buffer_.size() > 0) return rest();  // Already here (a pipelined request).
    Lowest().expires_after(Chrono(options().idle_timeout));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self, rest](beast::error_code ec, size_t n) {
                              if (ec) return;  // Gone, or idle past the timeout.
                              self->buffer_.commit(n);
                              rest();
                            });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return Refuse(413, "Payload Too Large",
                    "the request body is larger than the dashboard takes");
    }
    if (ec == http::error::header_limit) {
      return Refuse(431, "Request Header Fields Too Large",
                    "the request header is larger than the dashboard takes");
    }
    if (ec && IsHttpError(ec) && ec != http::error::end_of_stream &&
        ec != http::error::partial_message) {
      return Refuse(400, "Bad Request", "not an HTTP request the dashboard understands");
    }
    // The client left, timed out (Beast closed the socket) or broke the connection.
    if (ec) return;
    const http::request<http::string_body>& req = parser_->get();
    HttpRequest request;
    request.method = std::string(req.method_string());
    const beast::string_view target = req.target();
    if (target.empty() || target[0] != '/') {
      return Refuse(400, "Bad Request", "the request target must be a path (/...)");
    }
    const size_t q = target.find('?');
    request.path = DecodePath(target.substr(0, q));
    if (q != beast::string_view::npos) request.query = std::string(target.substr(q + 1));
    request.authorization = Header(req, http::field::authorization);
    request.cookie = Header(req, http::field::cookie).value_or("");
    request.content_type = Header(req, http::field::content_type).value_or("");
    request.origin = Header(req, http::field::origin);
    request.referer = Header(req, http::field::referer);
    request.host = Header(req, http::field::host).value_or("");
    request.body = req.body();
    request.secure = kTls;
    HttpResponse answer = server_->handler_->Handle(request);

    response_.emplace(static_cast<http::status>(answer.status), req.version());
    response_->reason(HttpReason(answer.status));
    if (!answer.content_type.empty()) {
      response_->set(http::field::content_type, answer.content_type);
    }
    for (const auto& [name, value] : answer.headers) response_->insert(name, value);
    response_->keep_alive(req.keep_alive());
    if (request.method == "HEAD") {
      response_->content_length(answer.body.size());
    } else {
      response_->body() = std::move(answer.body);
      response_->prepare_payload();
    }
    Write(response_->keep_alive());
  }

  // Answers a request that cannot be read, then closes: what follows it is unknown.
  void Refuse(int status, const char* reason, const char* message) {
    response_.emplace(static_cast<http::status>(status), 11);
    response_->reason(reason);
    response_->set(http::field::content_type, "text/plain; charset=utf-8");
    response_->set("X-Content-Type-Options", "nosniff");
    response_->keep_alive(false);
    response_->body() = absl::StrCat(message, "\n");
    response_->prepare_payload();
    Write(false);
  }

  void Write(bool keep_alive) {
    Lowest().expires_after(Chrono(options().write_timeout));
    http::async_write(stream_, *response_,
                      [self = this->shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                        if (ec) return;
                        if (keep_alive) return self->Read(/*first=*/false);
                        self->Close();
                      });
  }

  void Close() {
    if constexpr (kTls) {
      // close_notify, briefly: a client that never answers it does not hold us.
      Lowest().expires_after(std::chrono::seconds(2));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      // Half-close, then read what the client still sends until it closes too:
      // closing with unread bytes (a refused body) would reset the connection and
      // could destroy the answer before the client reads it.
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      Lowest().expires_after(std::chrono::seconds(2));
      Drain();
    }
  }

  void Drain() {
    buffer_.consume(buffer_.size());
    Lowest().async_read_some(buffer_.prepare(4096), [self = this->shared_from_this()](
                                                        beast::error_code ec, size_t n) {
      if (ec) return;
      self->buffer_.commit(n);
      self->Drain();
    });
  }

  DashboardServer::Impl* const server_;
  const std::shared_ptr<ssl::context> tls_;  // Kept for the stream, even once replaced.
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
};

}  // namespace

void DashboardServer::Impl::StartSession(tcp::socket socket) {
  if (std::shared_ptr<ssl::context> ctx = tls()) {
    std::make_shared<Session<true>>(this, std::move(socket), std::move(ctx))->Start();
  } else {
    std::make_shared<Session<false>>(this, std::move(socket), nullptr)->Start();
  }
}

absl::StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(
    const DashboardServerOptions& options, std::unique_ptr<DashboardHandler> handler) {
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "the dashboard's HTTPS needs both a certificate and a key (--tls-cert, --tls-key)");
  }
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
  return std::unique_ptr<DashboardServer>(new DashboardServer(std::move(impl)));
}

DashboardServer::DashboardServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DashboardServer::~DashboardServer() = default;

int DashboardServer::port() const { return impl_->port_; }
bool DashboardServer::https() const { return impl_->tls() != nullptr; }
int DashboardServer::connections() const { return impl_->connections_.load(); }

}  // namespace ddp
