// Fencing: what a worker does with its ranks once its heartbeats stop getting through.
//
// Two faults look the same from the worker: the coordinator is away for everyone (a
// restart, a crash, its host down), where training must go on, and this worker alone
// is cut off from it, where the coordinator will declare it lost after its heartbeat
// timeout and restart its attempts elsewhere, so its ranks must be gone by then (two
// live processes must never hold one rank of a job, nor write its checkpoints).
//
// The worker tells them apart by asking other workers, its witnesses (the coordinator
// names up to four in every heartbeat reply): each one's health service answers
// "ddp.witness" SERVING while its own heartbeats get through. So, once no heartbeat
// of ours has gone through for `ask_after` since the last one that did was sent:
//
//   a witness answers SERVING        the coordinator is up and we are cut off: fence
//   none answers at all              we are cut off from everyone: fence
//   those that answer say NOT_SERVING the coordinator is away for all: keep training
//   no witnesses known               a one-worker cluster: keep training
//
// Fencing is SIGKILL to every rank of every task this worker runs, at once. The
// timing makes it precede the coordinator's verdict: the coordinator declares us lost
// `heartbeat timeout` after it received our last heartbeat, which was after we sent
// it; we decide at most `ask_after + ask_deadline` after sending it, which PlanFencing
// keeps below the timeout. And `ask_after` is long enough for every witness to have
// noticed an outage that began after our last good heartbeat: its next heartbeat is
// due within an interval and fails within the RPC deadline.
//
// docs/control-plane.md, "Partitions", has the table of who sees what.
#ifndef DDP_WORKER_AGENT_FENCE_H_
#define DDP_WORKER_AGENT_FENCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

// The health service name whose status says "my heartbeats get through".
inline constexpr char kWitnessService[] = "ddp.witness";

struct FencePlan {
  absl::Duration ask_after;     // Since the last good heartbeat was sent.
  absl::Duration ask_deadline;  // For all the witnesses' answers together.
  // The coordinator's timeouts leave less than `ask_after` would need for every
  // witness to notice an outage first: an outage may then fence some ranks.
  bool tight = false;
};

// From the coordinator's heartbeat interval, heartbeat timeout and RPC deadline
// (RegisterResponse).
FencePlan PlanFencing(absl::Duration interval, absl::Duration timeout, absl::Duration rpc_deadline);

struct FenceVerdict {
  bool fence = false;
  std::string why;  // For the log: what was seen, and what follows.
};

// `answers[i]` is witness `witnesses[i]`'s "ddp.witness" status: true SERVING, false
// NOT_SERVING, an error when it did not answer.
FenceVerdict DecideFence(const std::vector<std::string>& witnesses,
                         const std::vector<absl::StatusOr<bool>>& answers);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_FENCE_H_
