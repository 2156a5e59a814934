// Serves the dashboard (dashboard.h) over HTTP with civetweb, the embedded server
// prometheus-cpp's /metrics endpoints already use (Debian's libcivetweb).
//
// Plain HTTP only: Debian 12's civetweb 1.15 loads OpenSSL at run time through the
// 1.1 API and calls SSL_get_peer_certificate, which OpenSSL 3 no longer exports, so
// its first HTTPS request crashes the process (a null function pointer, tried). The
// coordinator therefore serves the dashboard on loopback addresses only, unless
// --insecure (server.cc, ValidateServerOptions; docs/decisions/operations.md).
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
  std::string listen;  // HOST:PORT (IPv4 or a name; port 0: any free port).
};

class DashboardServer {
 public:
  // INVALID_ARGUMENT (a malformed address), UNAVAILABLE (cannot bind), each naming
  // --http-listen.
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(
      const DashboardServerOptions& options, std::unique_ptr<DashboardHandler> handler);
  ~DashboardServer();

  int port() const { return port_; }

 private:
  DashboardServer() = default;
  static int HandleRequest(mg_connection* conn, void* self);

  std::unique_ptr<DashboardHandler> handler_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_HTTP_DASHBOARD_SERVER_H_
