// Serves the dashboard (dashboard.h) over HTTP or HTTPS with civetweb, the embedded
// server prometheus-cpp's /metrics endpoints already use (Debian's libcivetweb).
//
// HTTPS: with a certificate and key (the coordinator's --tls-cert/--tls-key) it serves
// TLS only, configured through OpenSSL directly (civetweb would want the key and the
// certificate in one file). The files are read at start; a rotated certificate
// reaches the dashboard at the coordinator's next start (gRPC re-reads its own).
//
// Lifecycle: Start() binds and serves on a few threads of civetweb's own; the
// destructor stops it, waiting for requests in progress, so destroy it before what
// the handler reads.
#ifndef DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_
#define DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/http/dashboard.h"

struct mg_context;
struct mg_connection;

namespace ddp {

struct DashboardServerOptions {
  std::string listen;     // HOST:PORT (IPv4 or a name; port 0: any free port).
  std::string cert_file;  // PEM; with key_file: HTTPS. Empty: plain HTTP.
  std::string key_file;
};

class DashboardServer {
 public:
  // INVALID_ARGUMENT (a malformed address), UNAVAILABLE (cannot bind, or TLS cannot
  // be set up with the files), each naming --http-listen.
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(
      const DashboardServerOptions& options, std::unique_ptr<DashboardHandler> handler);
  ~DashboardServer();

  int port() const { return port_; }
  bool tls() const { return tls_; }

 private:
  DashboardServer() = default;
  static int HandleRequest(mg_connection* conn, void* self);
  static int InitSsl(void* ssl_ctx, void* self);

  std::unique_ptr<DashboardHandler> handler_;
  DashboardServerOptions options_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  bool tls_ = false;
  std::string tls_error_;  // Set by InitSsl (during Start only) when the files fail.
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_
