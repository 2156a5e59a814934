// Asks grpc.health.v1.Health/Check, as Kubernetes' probes do, through gRPC's generic
// stub (Debian ships no client stub for the health service). Plaintext: health ports
// are (common/rpc/health_server.h).
#ifndef DDP_COMMON_RPC_HEALTH_CLIENT_H_
#define DDP_COMMON_RPC_HEALTH_CLIENT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

// `service`'s status at `target` (HOST:PORT): true for SERVING, false for
// NOT_SERVING; UNAVAILABLE when it does not answer within `deadline` (or answers
// something else: NOT_FOUND for an unknown service, say).
absl::StatusOr<bool> CheckHealth(const std::string& target, const std::string& service,
                                 absl::Duration deadline);

// The same of every target at once: answers in `targets`' order, all within `deadline`.
std::vector<absl::StatusOr<bool>> CheckHealthAll(const std::vector<std::string>& targets,
                                                 const std::string& service,
                                                 absl::Duration deadline);

}  // namespace ddp

#endif  // DDP_COMMON_RPC_HEALTH_CLIENT_H_
