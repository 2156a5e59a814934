// Serves the dashboard (dashboard.h) over HTTP or HTTPS with Boost.Beast on
// Boost.Asio (Debian's libboost-dev, header-only), Asio's SSL streams on the system's
// OpenSSL 3 (decision 153 says why not civetweb, which cannot do TLS with OpenSSL 3).
//
// HTTPS: given a certificate and key (the coordinator's --tls-cert and --tls-key, the
// ones gRPC serves), every connection is TLS 1.2 or newer; no client certificate is
// asked for (browsers carry none: tokens admit them). The files are checked every
// `tls_refresh` and, when either changed, read again into a new context that serves
// the connections accepted from then on (as gRPC re-reads its own); a replacement
// that does not load is logged and the old one kept.
//
// Slow or idle clients cannot starve it: Beast parses HTTP asynchronously on an
// io_context run by two threads, so a connection that waits costs a socket and a
// buffer, never a thread. Each connection gets
//   - `header_timeout` for the TLS handshake and its first request, header and body
//     (a client dripping a byte every two seconds is closed when it runs out);
//   - `idle_timeout` to start its next keep-alive request, then `header_timeout` to
//     finish it;
//   - `write_timeout` to take each answer;
//   - header and body size limits (431 and 413 past them);
// and at most `max_connections` are open at once: past it, a new connection is
// closed as soon as it is accepted, before anything is read from it.
//
// Lifecycle: Start() binds and serves; the destructor stops the threads (a request
// being handled completes first) and closes every connection, so destroy it before
// what the handler reads.
#ifndef DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_
#define DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/http/dashboard.h"

namespace ddp {

struct DashboardServerOptions {
  std::string listen;  // HOST:PORT (an IP address or a name; port 0: any free port).
  // PEM certificate chain and key: HTTPS with them. Both empty: plain HTTP.
  std::string cert_file;
  std::string key_file;
  absl::Duration tls_refresh = absl::Seconds(10);  // How often the files are checked.

  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(15);
  absl::Duration write_timeout = absl::Seconds(30);
  int max_connections = 256;
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 4 * 1024;  // A login form's token is far less.
};

class DashboardServer {
 public:
  // INVALID_ARGUMENT (a malformed address; a certificate or key that does not load,
  // naming --tls-cert/--tls-key), UNAVAILABLE (cannot bind), naming --http-listen.
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(
      const DashboardServerOptions& options, std::unique_ptr<DashboardHandler> handler);
  ~DashboardServer();

  int port() const;
  bool https() const;
  // Connections open now (for tests and logs).
  int connections() const;

  class Impl;

 private:
  explicit DashboardServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_
