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
// (RegisterResponse), for an agent whose coordinator answers one beat in
// `beats_per_ack` (quiet heartbeats, below; 1: every beat, as unary calls).
FencePlan PlanFencing(absl::Duration interval, absl::Duration timeout, absl::Duration rpc_deadline,
                      int beats_per_ack = 1);

// Quiet heartbeats (decision 161). On a heartbeat stream the coordinator answers a beat
// only when the answer says something new, or when the beat asks for an answer
// (answer_now). The agent asks on one beat in `beats_per_ack` (by time: once its last
// answered beat was sent (k - 1/2) intervals ago), and waits for that answer within
// the RPC deadline as it waits for every answer without quiet beats. "Heard" means
// what it meant before: the send time of the last beat the coordinator answered
// (HeartbeatResponse.acked_seq names it). An open stream that brings no answer counts
// for nothing: the beat that asks fails at its deadline and the agent is unreachable
// from then on, as when a unary call times out.
//
// Why fencing stays safe: the coordinator's verdict comes `timeout` after it received
// our last beat, which is no earlier than the last answered beat was sent, and the
// agent decides `ask_after + ask_deadline` after that send time at the latest, which
// PlanFencing keeps below the timeout whatever `beats_per_ack` is (beats it heard but
// did not answer only put its verdict later). What quiet beats cost is detection:
// an outage is noticed up to `beats_per_ack` intervals (plus the deadline) after the
// last answered beat instead of one, by us and by our witnesses alike, so for every
// witness to have noticed an outage that began after our last answered beat,
// `ask_after` must be 2 * (k * interval + deadline). QuietBeatsPerAck picks the largest
// k (at most kMaxBeatsPerAck) that keeps that within the timeout (a plan that is not
// tight), and 1 (every beat answered) where even k = 2 would not fit.
inline constexpr int kMaxBeatsPerAck = 8;
int QuietBeatsPerAck(absl::Duration interval, absl::Duration timeout, absl::Duration rpc_deadline);

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
