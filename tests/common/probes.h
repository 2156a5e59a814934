// What tests use to look at the daemons' side doors as Prometheus and Kubernetes do:
// a plain HTTP GET (the /metrics endpoints, Prometheus' API) and a grpc.health.v1
// Check (Debian ships no health client stub, so it goes through the generic stub).
#ifndef DDP_TESTS_COMMON_PROBES_H_
#define DDP_TESTS_COMMON_PROBES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp::testing {

// GET http://127.0.0.1:`port``target` (HTTP/1.0); the body of a 200 answer, else an
// error with the status line.
absl::StatusOr<std::string> HttpGet(int port, const std::string& target,
                                    absl::Duration timeout = absl::Seconds(10));

// grpc.health.v1.Health/Check of `service` on 127.0.0.1:`port`: true for SERVING,
// false for NOT_SERVING, an error when it does not answer.
absl::StatusOr<bool> HealthCheck(int port, const std::string& service = "");

// Asks until `service` answers `serving` (or `timeout` passes).
absl::Status WaitForHealth(int port, const std::string& service, bool serving,
                           absl::Duration timeout = absl::Seconds(30));

}  // namespace ddp::testing

#endif  // DDP_TESTS_COMMON_PROBES_H_
