// ddp-worker's agent: registers this node's slots, heartbeats, and makes the node run
// exactly the trainers the coordinator wants.
//
// One loop thread does everything that changes state (so trainers are spawned from a
// thread that lives as long as the agent, as PR_SET_PDEATHSIG requires):
//
//   unregistered ──Register ok──▶ registered ──heartbeat NOT_FOUND──▶ unregistered
//        ▲  (jittered backoff)       │                                (same incarnation)
//        └───────────────────────────┘ heartbeat FAILED_PRECONDITION: another agent took
//                                      this name; Run() returns the error
//
// Each turn: reap trainers; report their output (up to four batches, the rest on the
// next turn, so heartbeats are never starved; each batch numbered, and re-sent
// unchanged after an error); heartbeat with every task's status, an exit only once
// the output before it has been delivered (so a failure's `error` event precedes the
// exit it explains), and get the desired tasks back; start new tasks, stop the ones
// no longer wanted (SIGTERM, then SIGKILL after the grace period). While the coordinator is unreachable trainers keep
// running and their output waits in a bounded buffer: the data plane never goes
// through the coordinator.
#ifndef DDP_WORKER_AGENT_AGENT_H_
#define DDP_WORKER_AGENT_AGENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/agent/coordinator_client.h"
#include "worker/agent/event_buffer.h"
#include "worker/agent/output_pump.h"
#include "worker/agent/trainer_task.h"

namespace ddp {

struct AgentOptions {
  std::string name;            // Unique in the cluster.
  std::string advertise_addr;  // Where this node's rank 0 can be reached.
  int slots = 1;
  int gpus = 0;
  int cpus = 1;                // Cores for trainers; split evenly over slots.
  std::string trainer_path;
  std::string work_dir;
  absl::Duration stop_grace = absl::Seconds(10);
  absl::Duration max_backoff = absl::Seconds(5);  // Reconnect backoff cap.
  absl::Duration tick = absl::Milliseconds(100);  // Reaping and output flushing.
};

class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<CoordinatorClient> client, Clock* clock);
  ~Agent();

  // Runs until Stop(); then stops every trainer (SIGTERM, SIGKILL after the grace
  // period) and reports their exits. Returns an error only for a fatal condition
  // (another agent registered under this name, or bad timeouts from the coordinator).
  absl::Status Run();
  // Thread-safe; Run() returns soon after.
  void Stop();

  const std::string& incarnation() const { return incarnation_; }
  // Called with true once registered, false when the coordinator forgot us.
  void set_on_registered(std::function<void(bool)> fn) { on_registered_ = std::move(fn); }

 private:
  using TaskKey = std::pair<std::string, int>;

  absl::Status RegisterOnce();
  // Sends up to a few batches of output (the unsent one first).
  absl::Status Flush();
  // Events that left the buffer and reached the coordinator (or were dropped).
  int64_t Delivered() const;
  // Some task's exit waits for output not yet delivered.
  bool HoldsExits() const;
  absl::Status HeartbeatOnce();
  void Reconcile(const v1::HeartbeatResponse& desired);
  absl::Duration Backoff();

  const AgentOptions options_;
  std::unique_ptr<CoordinatorClient> client_;
  Clock* const clock_;
  const std::string incarnation_;
  EventBuffer buffer_;
  std::unique_ptr<OutputPump> pump_;
  std::map<TaskKey, std::unique_ptr<TrainerTask>> tasks_;
  // Finished tasks no longer wanted, kept until one heartbeat has reported them.
  std::map<TaskKey, bool> reported_finished_;
  // The batch being sent: kept, unchanged, until the coordinator takes it.
  std::optional<v1::ReportEventsRequest> unsent_;
  int64_t next_batch_seq_ = 1;  // ReportEventsRequest.batch_seq of the next batch.
  bool held_exits_ = false;     // The last heartbeat held back some exit.
  absl::Notification stop_;
  std::function<void(bool)> on_registered_;

  bool registered_ = false;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  absl::Duration rpc_deadline_ = absl::Seconds(2);
  absl::Duration backoff_ = absl::Milliseconds(100);
  int failures_ = 0;
  absl::BitGen rng_;
};

// A fresh random incarnation id (16 hex digits).
std::string NewIncarnation();

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_AGENT_H_
