// The worker agent's view of the coordinator: an interface (a fake in tests) and its
// gRPC implementation. Calls block for at most `deadline`.
#ifndef DDP_WORKER_AGENT_COORDINATOR_CLIENT_H_
#define DDP_WORKER_AGENT_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                        absl::Duration deadline) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                          absl::Duration deadline) = 0;
  virtual absl::Status ReportEvents(const v1::ReportEventsRequest& request,
                                    absl::Duration deadline) = 0;
};

// `target` is HOST:PORT. The channel reconnects by itself; calls fail fast with
// UNAVAILABLE while the coordinator is down.
std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const std::string& target);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_COORDINATOR_CLIENT_H_
