// The coordinator's service logic: job queue, worker registry, rendezvous, rank
// assignment, failure detection and restarts. No gRPC here: methods take and return
// protos and absl::Status; grpc_service.h adapts them to the wire.
//
// Job lifecycle (one attempt at a time):
//
//   submit ─▶ PENDING ──(head of queue, >= min nodes free)──▶ RENDEZVOUS
//                ▲                                              │ last-call window for
//                │                                              │ more nodes (elastic)
//                │                                              ▼ attempt formed: ranks
//                │                                     trainers start on its workers
//                │                                              │ every rank's process up
//                │  retryable failure, restarts left            ▼
//                └────────────────────────────────────────── RUNNING ──▶ SUCCEEDED
//                                                               │        (all ranks exit 0)
//                          permanent failure or no restarts left ▼
//                                                             FAILED
//   PENDING / RENDEZVOUS / RUNNING ──(CancelJob)──▶ CANCELLED
//
// An attempt fails when a rank exits nonzero (exit code 2, the trainer's permanent
// error, is never restarted), its worker misses heartbeats for the heartbeat timeout,
// its worker restarts (new incarnation), or its trainers are not all running within
// rdzv.timeout_s. Its other trainers are stopped: they drop out of their workers'
// desired state. The queue is strict FIFO with gang scheduling: a job starts only
// when all its ranks have slots, and jobs behind it wait.
//
// Threading: one mutex guards all state; SQLite writes happen under it (they are
// small; retention's big deletes run after it is released), listener notifications
// after it is released. Time comes from the Clock;
// Tick() does the time-driven work (the server calls it periodically, tests call it
// with a FakeClock).
#ifndef DDP_COORDINATOR_COORDINATOR_H_
#define DDP_COORDINATOR_COORDINATOR_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/jobspec/job_spec.h"
#include "coordinator/event_hub.h"
#include "coordinator/rendezvous.h"
#include "coordinator/state_store.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

struct CoordinatorOptions {
  // Ordered, and checked by ValidateTimeouts(): rpc_deadline < heartbeat_interval <
  // heartbeat_timeout; each job's rdzv.timeout_s must exceed heartbeat_timeout and its
  // train.collective_timeout_s must exceed rdzv.timeout_s (checked at submit).
  absl::Duration rpc_deadline = absl::Milliseconds(500);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
};

// INVALID_ARGUMENT naming the flags that are out of order.
absl::Status ValidateTimeouts(const CoordinatorOptions& options);

bool IsTerminal(v1::JobState state);
const char* JobStateName(v1::JobState state);

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options, StateStore* store, EventHub* hub, Clock* clock);

  // Loads jobs, attempts, rank tables and workers from the store. Running attempts
  // keep running: their workers have one heartbeat timeout to check in.
  absl::Status Recover();

  // --- JobService ---
  // INVALID_ARGUMENT (spec errors with field and line), ALREADY_EXISTS (live rdzv_id),
  // UNAVAILABLE (the store could not write it: nothing is kept).
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  // NOT_FOUND.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, bool metric_history = false);
  // Newest first, without metrics, epoch history or spec (GetJob has them).
  std::vector<v1::Job> ListJobs(int limit);
  // NOT_FOUND, FAILED_PRECONDITION (already finished).
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  std::vector<v1::Worker> ListWorkers();

  // --- WorkerService ---
  // INVALID_ARGUMENT.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // NOT_FOUND (unknown worker), FAILED_PRECONDITION (stale incarnation).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // NOT_FOUND, FAILED_PRECONDITION, as Heartbeat. A batch whose batch_seq was
  // already applied is dropped (OK); so are events of unknown jobs.
  absl::Status ReportEvents(const v1::ReportEventsRequest& request);

  // Expires heartbeats, times out rendezvous, schedules the queue, and once a minute
  // applies retention: the `retain_jobs` finished jobs that ended last are kept.
  void Tick();

 private:
  struct JobRecord {
    v1::Job job;
    JobSpec spec;
    int64_t seq = 0;
    bool gathering = false;     // RENDEZVOUS before the attempt forms.
    absl::Time window_end;      // End of the last-call window while gathering.
    absl::Time start_deadline;  // Formed attempt: trainers must be up by then.
    bool retiring = false;      // Past retention: being deleted, no longer written.
  };
  using TaskKey = std::pair<std::string, int>;  // (job id, attempt number)
  struct WorkerRecord {
    v1::Worker info;
    absl::Time last_seen;
    bool alive = true;
    bool confirmed = true;  // False after recovery until the worker checks in.
    std::vector<int32_t> free_ports;
    std::vector<v1::TaskStatus> reported;  // Its last heartbeat's tasks.
    // Tasks handed to it in its last heartbeat reply that it had not reported (with
    // their rank counts): their trainers may be starting whatever became of their
    // attempts, so their slots stay busy until the next heartbeat shows the task
    // (then `reported` accounts for it: busy until every rank exited) or not (the
    // reply was lost). Cleared when the agent restarts (its trainers died with it).
    std::map<TaskKey, int> dispatched;
    int64_t last_batch_seq = 0;  // ReportEvents: the last batch applied (this incarnation).
  };
  // Collects jobs whose watchers must be woken, and wakes them on destruction
  // (declare it before the lock, so it runs after the lock is released). Finished
  // jobs are also marked so in the hub, which then frees their feeds when unwatched.
  class TouchList {
   public:
    explicit TouchList(EventHub* hub) : hub_(hub) {}
    ~TouchList();
    void Add(const std::string& job_id, bool finished) {
      ids_.insert(job_id);
      if (finished) finished_.insert(job_id);
    }

   private:
    EventHub* hub_;
    std::set<std::string> ids_;
    std::set<std::string> finished_;
  };

  // Active attempt (RENDEZVOUS with ranks, or RUNNING), or null.
  static v1::Attempt* ActiveAttempt(JobRecord& job);
  JobRecord* FindLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WorkerRecord*> CheckWorkerLocked(const std::string& name,
                                                  const std::string& incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job as clients see it: with queue position and live trainers; the full view
  // adds the latest metrics and epoch history (from the hub) and, on request, the
  // stored metric history.
  v1::Job SummaryLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Job ViewLocked(const JobRecord& job, bool metric_history) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the job to the store (not when retiring); a failure is logged loudly and
  // returned. Submit acts on it: a job is stored before it is visible.
  absl::Status WriteLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WriteLocked, for changes that are live already (a failed write is only logged),
  // and queues the job's watchers' wake-up.
  void PersistLocked(const JobRecord& job, TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistWorkerLocked(const WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  int FreeSlotsLocked(const WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Trainers of the attempt that may still exist (Attempt.live_trainers).
  int LiveTrainersLocked(const std::string& job_id, const v1::Attempt& attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::Task> DesiredTasksLocked(const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked(TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FormLocked(JobRecord& job, const std::vector<NodeOffer>& nodes,
                  TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAttemptLocked(JobRecord& job, const std::string& reason, bool retryable,
                         TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyTaskStatusLocked(const std::string& worker, const v1::TaskStatus& status,
                             TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAttemptsOnWorkerLocked(const std::string& worker, const std::string& reason,
                                  TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick()'s work under the lock. When retention is due, returns the finished jobs
  // to delete (marked retiring); Tick() deletes them from the store unlocked.
  std::optional<std::vector<std::string>> Housekeep() ABSL_LOCKS_EXCLUDED(mu_);
  std::string NewJobIdLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  StateStore* const store_;
  EventHub* const hub_;
  Clock* const clock_;

  absl::Mutex mu_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_retention_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_COORDINATOR_H_
