// A job's record and every transition of its state diagram, in one place.
//
//   submit ─▶ PENDING ──(head of queue, >= min nodes free)──▶ RENDEZVOUS
//              ▲  │ ▲                                            │ last-call window for
//              │  ▼ │ (the cluster can hold it again)            │ more nodes (elastic)
//              │ PENDING, unschedulable: skipped by the queue    ▼ attempt formed: ranks
//              │                                        trainers start on its workers
//              │                                                 │ every rank's process up
//              │  retryable failure, restarts left               ▼
//              └─────────────────────────────────────────────  RUNNING ──▶ SUCCEEDED
//                                                                │        (all ranks exit 0)
//                             permanent failure or no restarts left ▼
//                                                              FAILED
//   PENDING / RENDEZVOUS / RUNNING ──(Cancel)──▶ CANCELLED
//   RENDEZVOUS / RUNNING ──(a worker drained: PreemptAttempt)──▶ PENDING, not counted
//
// An attempt fails when a rank exits nonzero (exit code 2, the trainer's permanent
// error, is never restarted), its worker misses heartbeats for the heartbeat timeout,
// its worker restarts (new incarnation), or its trainers are not all running within
// the coordinator's start timeout (a few heartbeats; rdzv.timeout_s after a
// coordinator restart, when the workers have that long to check in), or a rank
// stalls (the facade's stall watchdog, stall_watchdog.h). Its other trainers are
// stopped: they drop out of their workers' desired state.
//
// The transitions are free functions over a JobRecord. They change the record and
// return a JobDelta saying what changed: which rows to store, whether the active
// attempt formed or ended, whether the job finished. They know nothing of workers,
// the queue, the store or any lock; the Coordinator facade acts on the delta.
#ifndef DDP_COORDINATOR_CORE_JOB_LIFECYCLE_H_
#define DDP_COORDINATOR_CORE_JOB_LIFECYCLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/jobspec/job_spec.h"
#include "coordinator/core/rendezvous.h"
#include "coordinator/core/stall_watchdog.h"
#include "ddp/v1/types.pb.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

bool IsTerminal(v1::JobState state);
const char* JobStateName(v1::JobState state);

// "a, b, c, d, e and 995 more": failure reasons name a few workers, never thousands.
std::string ListSome(const std::vector<std::string>& names, size_t shown = 5);

struct JobRecord {
  v1::Job job;  // As stored: attempts and rank tables, no metrics.
  JobSpec spec;
  int64_t seq = 0;            // Submission order.
  bool gathering = false;     // RENDEZVOUS before the attempt forms.
  absl::Time window_end;      // End of the last-call window while gathering.
  absl::Time start_deadline;  // Formed attempt: trainers must be up by then.
  absl::Duration start_timeout;  // What start_deadline allowed (for the reason).
  bool retiring = false;      // Past retention: being deleted, no longer written.
  // Counts over the active attempt's rank table, kept as ranks change, so that a
  // report of a few ranks costs as much in a 4,096-rank job as in a 2-rank one.
  int ranks_up = 0;      // pid reported.
  int ranks_exited = 0;
  int ranks_failed = 0;  // Exited nonzero or by a signal.
  uint64_t formed_ticket = 0;  // The store ticket of the active attempt's rows.
  int64_t log_bytes = 0;       // Output text accepted (UsageLimits::log_bytes_per_job).
  StallWatch stall;  // The active attempt's progress, by rank (reset when one forms).
  // Chosen by the scheduler to make room for a higher-priority job (its id), moving at
  // its next checkpoint; cleared when the attempt ends or the room is no longer needed.
  std::string preempt_for;
  // A `kill` job with preemption_notice_s, marked and asked for a checkpoint: when it
  // moves without one (InfiniteFuture: not waiting for one).
  absl::Time preempt_deadline = absl::InfiniteFuture();
  // The attempt a priority preemption ended (0: none), until its trainers are gone:
  // the scheduler counts their nodes as coming free.
  int stopping_attempt = 0;
  // While the active attempt recovers live: when the recovery falls back to a restart.
  absl::Time recovery_deadline = absl::InfiniteFuture();
  // The checkpoint-now notice (Task.notice_seq): the newest, raised for attempt
  // `notice_attempt` (a later attempt starts without one).
  int notice_seq = 0;
  int notice_attempt = 0;
  std::string notice;
  absl::Time notice_deadline = absl::InfinitePast();  // InfinitePast: none given.
  // The newest stack capture (Task.stacks_seq, decision 194), asked of attempt
  // `stacks_attempt`'s workers: a stall suspected, or CaptureStacks. Not stored: after
  // a restart it goes on from the highest seq the workers report.
  int stacks_seq = 0;
  int stacks_attempt = 0;
  // A worker with ranks of the active attempt is stopping (SIGTERM): the attempt moves
  // after the checkpoint its notice asked for.
  std::string stopping_worker;
  // (attempt, rank) -> the workers that hosted the rank earlier in that attempt, before
  // a live recovery moved it to a spare (ReplaceNodeLocked). Their output lines, sent
  // when such a worker comes back (what its ranks printed before the fence), are the
  // rank's own and kept; nothing else of theirs is (decision 187). Not stored: a
  // coordinator restart forgets it.
  std::map<std::pair<int, int>, std::vector<std::string>> former_hosts;
};

// What a transition changed.
struct JobDelta {
  bool job_row = false;                       // The job's own row.
  std::vector<int> attempt_rows;              // Attempt numbers.
  std::vector<std::pair<int, int>> rank_rows; // (attempt, rank)
  bool formed = false;    // A new active attempt: its ranks join their workers.
  int ended_attempt = 0;  // The active attempt that ended (its trainers are to stop).
  bool finished = false;  // The job reached a terminal state.
  // The active attempt's failed ranks can be replaced live (LiveRecoveryRefusal said
  // ""): the facade places them (BeginRecovery) or fails the attempt.
  bool recover = false;

  bool empty() const { return !job_row && attempt_rows.empty() && rank_rows.empty(); }
  void Merge(const JobDelta& other);
};

// The active attempt (RENDEZVOUS with ranks, or RUNNING), or null.
v1::Attempt* ActiveAttempt(JobRecord& job);
const v1::Attempt* ActiveAttempt(const JobRecord& job);
// Whether the job waits in the queue: PENDING, or RENDEZVOUS still gathering.
bool Queued(const JobRecord& job);

// The job's view (v1::Job) of its spec: nodes, nproc_per_node, max_restarts,
// max_recoveries, epochs, priority, node_selector and preemption, from `rec.spec`,
// the one place each is read from (a new job's, and a stored job's once its text is
// parsed again). The view's counters (restarts, recoveries, preemptions) are the
// job's own, kept in its row.
void ShowSpec(JobRecord& rec);

// A new job, PENDING ("queued"), from a validated spec.
JobRecord NewJob(std::string id, int64_t seq, JobSpec spec, std::string rdzv_id,
                 std::string spec_yaml, std::string workdir, absl::Time now);

// A job loaded from the store, made whole again: its spec parsed (a job in flight
// whose spec no longer parses becomes FAILED: shown, not hidden), a RENDEZVOUS that
// was still gathering back to PENDING, the rank counts recomputed, and a formed
// attempt given rdzv.timeout_s from `now` to start.
JobDelta RestoreJob(JobRecord& job, absl::Time now);

// Scheduler outcomes for a queued job. Each writes only if something changed.
JobDelta Wait(JobRecord& job, const std::string& reason);
JobDelta MarkUnschedulable(JobRecord& job, const std::string& reason);
JobDelta OpenLastCall(JobRecord& job, absl::Time window_end, int nodes);
JobDelta WaitForPort(JobRecord& job, const std::string& worker);
// A new attempt on `nodes` (chosen, at least one) with the store on `port` of node 0;
// its trainers must all be up (pids reported) within `start_timeout`.
JobDelta FormAttempt(JobRecord& job, const std::vector<NodeOffer>& nodes, int port,
                     absl::Time now, absl::Duration start_timeout);

// A worker's report on its ranks of one attempt (pids and exits, or a start error).
// Decides RUNNING (every rank up), SUCCEEDED (every rank exited 0) and failures (a
// permanent failure anywhere decides; a permanent exit reported while the job waits
// to restart after a retryable one fails the job instead).
JobDelta ApplyReport(JobRecord& job, const std::string& worker, const v1::TaskStatus& status,
                     absl::Time now);
// A trainer's `error` event: kept in its rank's row to explain its exit.
JobDelta RecordRankError(JobRecord& job, int attempt, int rank, const std::string& message);
// Fails the active attempt: back to PENDING if retryable with restarts left, else
// FAILED. No-op without an active attempt.
JobDelta FailAttempt(JobRecord& job, const std::string& reason, bool retryable,
                     absl::Time now);
// Ends the active attempt to move the job elsewhere (an operator drains one of its
// workers): back to PENDING, resuming from its checkpoint, without counting against
// max_restarts. The attempt shows as FAILED, `preempted`, with the reason
// "preempted: <reason>". No-op without an active attempt.
JobDelta PreemptAttempt(JobRecord& job, const std::string& reason, absl::Time now);
inline constexpr char kPreemptedPrefix[] = "preempted: ";
// Whether `attempt` ended by PreemptAttempt (Attempt.preempted; the reason is text for
// people, never parsed).
bool Preempted(const v1::Attempt& attempt);
// Live recovery (docs/recovery.md). The active attempt is recovering: its last
// Recovery has not ended.
bool Recovering(const v1::Attempt& attempt);
// Why the active attempt's failed ranks cannot be replaced live, or "" when they can:
// the job allows recoveries and has some left, the attempt was RUNNING and is not
// recovering already, every failure is retryable, and some rank survives.
std::string LiveRecoveryRefusal(const JobRecord& job);
// Whether `worker`'s loss can be recovered live: as LiveRecoveryRefusal, with that
// worker's ranks as the failed ones ("" when it can).
std::string NodeRecoveryRefusal(const JobRecord& job, const std::string& worker);
// Starts recovery generation N+1 of the active attempt: the failed ranks' rows (and
// those of `moved`, the ranks of a lost node already given to a spare) are cleared
// for their replacements, the process group moves to master_addr:port, and the job
// counts a recovery; `cause` adds to the failed ranks' exits. The attempt stays
// RUNNING.
JobDelta BeginRecovery(JobRecord& job, const std::string& master_addr, int port,
                       absl::Time now, const std::vector<int>& moved = {},
                       const std::string& cause = "");
// Rank 0's `recovered` event for `generation` of `attempt`: the recovery is done.
JobDelta FinishRecovery(JobRecord& job, int attempt, int generation, int source_rank,
                        int64_t global_step, absl::Time now);
// Fails the active attempt (a restart from the checkpoint, within max_restarts), naming
// the recovery that could not finish and why: "live recovery 2 failed: <why>; ...".
JobDelta FailRecovery(JobRecord& job, const std::string& why, absl::Time now);
// Fails a formed attempt whose trainers are not all up by its start deadline.
JobDelta TimeOutRendezvous(JobRecord& job, absl::Time now);
// FAILED_PRECONDITION when already finished.
absl::StatusOr<JobDelta> Cancel(JobRecord& job, absl::Time now);
// A `checkpoint` event of `attempt` (rank 0's, once the checkpoint is durable): the
// job's newest checkpoint (Job.last_checkpoint_*), heard of at `now`.
JobDelta RecordCheckpoint(JobRecord& job, int attempt, int64_t global_step, absl::Time now);
// The training a priority preemption of the job at `now` would throw away
// (decision 188): none for `preemption: at_checkpoint` (it moves at its next
// checkpoint); for `kill` the time since the state its next attempt would resume from,
// the active attempt's newest checkpoint if it resumes from checkpoints, else the
// attempt's start. nullopt when the job is not RUNNING or is never preempted
// (`never`, or `at_checkpoint` without periodic checkpoints to resume from).
std::optional<absl::Duration> PreemptionLoss(const JobRecord& job, absl::Time now);

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_JOB_LIFECYCLE_H_
