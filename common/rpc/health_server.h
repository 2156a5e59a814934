// A plaintext gRPC server with only the standard health service (grpc.health.v1), on
// its own port, so that probes (Kubernetes, load balancers) need neither the
// daemon's TLS client certificates nor its tokens. Every other method answers
// UNIMPLEMENTED.
//
// Lifecycle: Start() binds and serves; Set() changes a service's status at any time
// (thread-safe); Shutdown() (or the destructor) stops it.
#ifndef DDP_COMMON_RPC_HEALTH_SERVER_H_
#define DDP_COMMON_RPC_HEALTH_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ddp {

class HealthServer {
 public:
  // Serves `listen` (HOST:PORT, port 0: any free port) with every service NOT_SERVING
  // until Set. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& listen);
  ~HealthServer();

  int port() const { return port_; }
  // `service` "" is what probes ask by default.
  void Set(const std::string& service, bool serving);
  void Shutdown();

 private:
  HealthServer() = default;

  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace ddp

#endif  // DDP_COMMON_RPC_HEALTH_SERVER_H_
