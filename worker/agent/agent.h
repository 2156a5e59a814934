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
// Each turn: reap trainers; heartbeat when one is due (or at once when something
// changed) with every task's status, an exit only once the output before it has been
// delivered (so a failure's `error` event precedes the exit it explains), and get the
// desired tasks back; start new tasks, stop the ones no longer wanted (SIGTERM, then
// SIGKILL after the grace period). Trainer output goes out from the EventReporter's own
// thread, so a slow or failing ReportEvents never makes a heartbeat late. While the
// coordinator is unreachable trainers keep running and their output waits in a
// bounded buffer: the data plane never goes through the coordinator.
#ifndef DDP_WORKER_AGENT_AGENT_H_
#define DDP_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/net.h"
#include "common/jobspec/labels.h"
#include "worker/agent/backoff.h"
#include "worker/agent/coordinator_client.h"
#include "worker/agent/event_buffer.h"
#include "worker/agent/event_reporter.h"
#include "worker/agent/fence.h"
#include "worker/agent/gpu_inventory.h"
#include "worker/agent/output_pump.h"
#include "worker/agent/task_poller.h"
#include "worker/agent/stack_capture.h"
#include "worker/agent/trainer_task.h"

namespace ddp {

struct AgentOptions {
  std::string name;            // Unique in the cluster.
  std::string advertise_addr;  // Where this node's rank 0 can be reached.
  // --store-ports: the MASTER_PORTs this node offers for the jobs whose rank 0 it hosts
  // (free ports of the range, in turn). Empty (first 0): free ports the kernel gives
  // (bind to port 0), which come from its ephemeral range, where an outgoing
  // connection may take one before rank 0 binds it.
  PortRange store_ports;
  // The interface holding advertise_addr when it is not loopback: the ranks'
  // GLOO_SOCKET_IFNAME unless set (launch_plan.h). Empty: none.
  std::string gloo_socket_ifname;
  int slots = 1;
  std::vector<GpuDevice> gpus;  // The node's GPUs (GpuInventory); empty on a CPU node.
  // Asked for the offered GPUs' use (NVML) for each heartbeat; null: none sent.
  std::shared_ptr<GpuInventory> gpu_inventory;
  int cpus = 1;                // Cores for trainers; split evenly over slots.
  std::string trainer_path;
  std::string work_dir;
  absl::Duration stop_grace = absl::Seconds(10);
  std::vector<std::string> allowed_roots;        // Canonical --allow-root dirs.
  std::map<std::string, std::string> trainer_env;  // What trainers inherit (TrainerBaseEnv).
  ExecPolicy exec;          // --allow-exec: the programs command jobs may start.
  std::string python_path;  // The directory of ddp_report.py, for command jobs' PYTHONPATH.
  StackTools stacks;        // --py-spy, --eu-stack: what takes the ranks' stacks.
  // Our retries while the coordinator is unreachable back off from 100 ms up to this
  // (with jitter); part of kReconnectBound.
  absl::Duration max_backoff = absl::Seconds(1);
  absl::Duration tick = absl::Milliseconds(100);  // Reaping and output flushing.
  // Keep a WaitForTasks long poll open, so new tasks arrive at once rather than with
  // the next heartbeat (ddp-worker --long-poll; off only to compare, in bench/).
  bool long_poll = true;
  Labels labels;  // --label KEY=VALUE: sent with every registration.
  // --leave-on-exit: once its trainers are stopped at shutdown, the agent tells the
  // coordinator it is gone for good (WorkerService.Leave), which forgets it at once.
  // For nodes that do not come back under this name (a Slurm allocation, an
  // autoscaled VM); a systemd-managed node restarts and keeps its cordon instead.
  bool leave_on_exit = false;
  // Records the rank processes' groups for the next incarnation (rank_ledger.h);
  // owned by the caller (WorkerServer); null: not recorded.
  RankLedger* ledger = nullptr;
  // The health service's port at advertise_addr, which answers kWitnessService as
  // set_on_reachable says (fence.h); 0: other workers cannot ask this one.
  int witness_port = 0;
  // Quiet heartbeats (decision 161, fence.h): on a heartbeat stream, the coordinator
  // answers one beat in k (fence.h's QuietBeatsPerAck, from its timeouts) unless it has
  // news. Off (--quiet-heartbeats=false), or where the timeouts leave k = 1, or with a
  // client that has no stream, every beat waits for its answer as before.
  bool quiet_heartbeats = true;
  // Asks the witnesses (fence.h); null: CheckHealthAll over gRPC. Tests give a fake.
  std::function<std::vector<absl::StatusOr<bool>>(const std::vector<std::string>&,
                                                  absl::Duration)>
      ask_witnesses;
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
  // `reason` is what --leave-on-exit tells the coordinator ("received SIGTERM").
  void Stop(const std::string& reason = "");

  const std::string& incarnation() const { return incarnation_; }
  // Called (on the loop thread) with true once registered and heartbeating, and with
  // false whenever the coordinator cannot be reached or has forgotten this worker:
  // the worker's health service follows it.
  void set_on_reachable(std::function<void(bool)> fn) { on_reachable_ = std::move(fn); }

  // What the agent has done (its /metrics; tests). Thread-safe.
  struct Stats {
    int64_t trainers_running = 0;  // Trainer processes alive now.
    int64_t tasks_started = 0;     // Tasks (an attempt's ranks here) started.
    int64_t restarted_tasks = 0;   // Of those, of a job's restart (attempt > 1).
    int64_t trainers_started = 0;  // Trainer processes spawned.
    int64_t start_failures = 0;    // Tasks that could not start.
    int64_t events_dropped = 0;    // Output lines and events the outbox had to drop.
    int64_t heartbeat_failures = 0;
    int64_t malformed_event_lines = 0;  // From users' programs (never fatal).
    int64_t fences = 0;  // Times this worker, cut off, killed its ranks (fence.h).
    int64_t quiet_beats = 0;  // Heartbeats sent without waiting for an answer (fence.h).
  };
  Stats stats() const;

 private:
  using TaskKey = std::pair<std::string, int>;

  absl::Status RegisterOnce();
  // Events that left the buffer and reached the coordinator (or were dropped).
  int64_t Delivered() const;
  // Some task's exit waits for output not yet delivered.
  bool HoldsExits() const;
  // One heartbeat, bounded by `deadline` (default: the RPC deadline).
  absl::Status HeartbeatOnce(absl::Duration deadline = absl::ZeroDuration());
  void Reconcile(const v1::HeartbeatResponse& desired);
  // The heartbeat interval and timeout to use from now on (Register's, or a heartbeat
  // answer's, decision 162): quiet beats' k and the fencing plan follow them.
  void PlanBeats(absl::Duration interval, absl::Duration timeout);
  // An answer's heartbeat_interval_ms and heartbeat_timeout_ms, when set and new.
  void FollowInterval(const v1::HeartbeatResponse& resp);
  // Shutting down with ranks running: tells the coordinator (stopping_grace_ms) and
  // keeps heartbeating until they are stopped through the desired state (their jobs
  // moved after the notice's checkpoint) or --stop-grace is over. Returns the grace
  // left for stopping what still runs.
  absl::Duration AwaitMoves();
  void SetReachable(bool reachable);
  // Once per loss of the coordinator, `fence_.ask_after` after the last good
  // heartbeat was sent: asks the witnesses and fences the ranks if they say so.
  void MaybeFence(absl::Time now);
  // Heartbeats have failed since the last good one, and the witnesses are still to ask.
  bool FencePending() const;
  // Returns after `timeout`, or earlier on Wake() or Stop().
  void WaitForWork(absl::Duration timeout);
  void Wake();

  const AgentOptions options_;
  std::unique_ptr<CoordinatorClient> client_;
  Clock* const clock_;
  const std::string incarnation_;
  EventBuffer buffer_;
  std::unique_ptr<EventReporter> reporter_;
  std::unique_ptr<OutputPump> pump_;
  std::unique_ptr<TaskPoller> poller_;  // Null without long_poll.
  std::atomic<bool> news_{false};  // The poller saw our desired state change.
  // Quiet heartbeats: an answer no beat waited for (or the stream's end) is waiting in
  // the client; the next beat takes it.
  std::atomic<bool> answer_waiting_{false};
  std::map<TaskKey, std::unique_ptr<TrainerTask>> tasks_;
  // Finished tasks no longer wanted, kept until one heartbeat has reported them.
  std::map<TaskKey, bool> reported_finished_;
  bool held_exits_ = false;     // The last heartbeat held back some exit.
  std::atomic<bool> gpu_usage_warned_{false};  // NVML failed a sample once (logged).
  bool heartbeat_now_ = false;  // Something must be told at once (a task failed to start).
  absl::Notification stop_;
  std::string leaving_;  // Loop thread: HeartbeatRequest.leaving once shutting down.
  // Loop thread: shutting down after SIGTERM, its ranks stop within this (sent as
  // HeartbeatRequest.stopping_grace_ms; zero before).
  absl::Duration stopping_grace_;
  absl::Mutex stop_mu_;
  std::string stop_reason_ ABSL_GUARDED_BY(stop_mu_);
  std::string LeaveReason() ABSL_LOCKS_EXCLUDED(stop_mu_);
  absl::Mutex wake_mu_;
  bool woken_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::function<void(bool)> on_reachable_;
  std::optional<bool> reachable_;  // Last value given to on_reachable_.
  absl::Time unreachable_since_;     // When reachable_ last became false.

  FencePlan fence_;
  absl::Time last_ok_sent_;              // When the last heartbeat that went through was sent.
  // Quiet heartbeats (decision 161): k, 1 when every beat waits for its answer.
  int beats_per_ack_ = 1;
  uint64_t beat_seq_ = 0;                // The last beat's HeartbeatRequest.beat_seq.
  int store_port_cursor_ = 0;            // Where the next offer from --store-ports starts.
  std::map<uint64_t, absl::Time> beats_sent_;  // Beats not yet answered: when each was sent.
  std::string last_told_;  // What the last answered beat said (tasks, leaving, stopping).
  std::atomic<int64_t> quiet_beats_{0};
  std::vector<std::string> witnesses_;   // From the last heartbeat reply.
  bool fence_asked_ = false;             // Since the last good heartbeat.
  std::atomic<int64_t> fences_{0};

  bool registered_ = false;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  absl::Duration heartbeat_timeout_ = absl::Seconds(5);
  absl::Duration rpc_deadline_ = absl::Seconds(2);
  Backoff backoff_;
  int failures_ = 0;
  // Stats, written by the loop thread, read by a scrape's.
  std::atomic<int64_t> trainers_running_{0};
  std::atomic<int64_t> tasks_started_{0};
  std::atomic<int64_t> restarted_tasks_{0};
  std::atomic<int64_t> trainers_started_{0};
  std::atomic<int64_t> start_failures_{0};
  std::atomic<int64_t> heartbeat_failures_{0};
};

// How soon after the coordinator accepts connections again a registered agent's
// heartbeat is through, at most: the channel reconnects within kMaxConnectDelay, the
// agent retries within max(heartbeat interval, max_backoff), and the call takes at most
// the RPC deadline. 3.5 s with the defaults (2 s + 1 s + 500 ms). A restarted
// coordinator must give the workers it recovers at least this long to check in.
absl::Duration ReconnectBound(absl::Duration heartbeat_interval, absl::Duration max_backoff,
                              absl::Duration rpc_deadline);

// A fresh random incarnation id (16 hex digits).
std::string NewIncarnation();

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_AGENT_H_
