// The coordinator's composition root: builds the parts in dependency order
// (state store -> event hub -> coordinator, recovered from the store -> gRPC services
// with the standard health service -> housekeeping thread) and tears them down in
// reverse.
#ifndef DDP_COORDINATOR_SERVER_H_
#define DDP_COORDINATOR_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/event_hub.h"
#include "coordinator/grpc_service.h"
#include "coordinator/state_store.h"

namespace ddp {

struct CoordinatorServerOptions {
  std::string listen = "127.0.0.1:29400";
  std::string state_dir;
  CoordinatorOptions timing;
  RetentionOptions retention;
  absl::Duration tick = absl::Milliseconds(100);  // Housekeeping period.
};

// INVALID_ARGUMENT naming the flag: a missing --state-dir, a bad --listen, timeouts
// out of order, retention bounds < 1. main() exits 2 on these, as for any bad flag.
absl::Status ValidateServerOptions(const CoordinatorServerOptions& options);

class CoordinatorServer {
 public:
  // Errors: INVALID_ARGUMENT (options), UNAVAILABLE (state dir in use by another
  // coordinator or unusable, port in use), DATA_LOSS (a state database that is not
  // ours). The state dir stays locked until the server is destroyed.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options, Clock* clock = RealClock());
  ~CoordinatorServer();

  int port() const { return port_; }
  // Stops accepting calls, ends open streams, stops housekeeping. Idempotent.
  void Shutdown();
  void Wait();

 private:
  CoordinatorServer() = default;

  std::unique_ptr<StateStore> store_;
  std::unique_ptr<EventHub> hub_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread housekeeping_;
  std::once_flag shutdown_once_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_SERVER_H_
