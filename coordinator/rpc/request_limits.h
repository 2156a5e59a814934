// Bounds on what one request may carry, checked by the gRPC adapters before the
// service logic sees it. Each refusal is RESOURCE_EXHAUSTED (a size) or
// INVALID_ARGUMENT (a malformed name) naming the limit. The transport enforces the
// first bound itself: a message over kMaxRequestBytes never reaches a handler.
#ifndef DDP_COORDINATOR_RPC_REQUEST_LIMITS_H_
#define DDP_COORDINATOR_RPC_REQUEST_LIMITS_H_

#include <string>

#include "absl/status/status.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

// gRPC's max receive message size on the coordinator. The agent keeps its event
// batches to 2 MiB, a job file is at most kMaxSpecBytes.
inline constexpr int kMaxRequestBytes = 8 << 20;
// Events in one ReportEvents batch (the agent sends at most 2,000).
inline constexpr int kMaxEventsPerBatch = 10000;
// Workdir and source-name strings of a submission.
inline constexpr size_t kMaxPathBytes = 4096;

absl::Status CheckSubmitRequest(const v1::SubmitJobRequest& request);
absl::Status CheckReportEventsRequest(const v1::ReportEventsRequest& request);
// Worker names: 1-253 letters, digits, '.', '-' or '_' (host names fit), so a name
// is safe to print and log anywhere.
absl::Status CheckWorkerName(const std::string& name);

}  // namespace ddp

#endif  // DDP_COORDINATOR_RPC_REQUEST_LIMITS_H_
