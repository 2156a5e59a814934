// The coordinator's service logic, as a thin facade over its parts. No gRPC here:
// methods take and return protos and absl::Status; grpc_service.h adapts them.
//
// Where things are (Ray GCS's managers are the model: one concern each, over plain
// records, reporting what changed, with no reference back to this class):
//   job_lifecycle.h    the job and attempt records and every state transition
//                      (the state diagram is there)
//   worker_registry.h  registration, incarnations, liveness, slots, tasks per worker
//   scheduler.h        the queue and the scheduling pass (rendezvous.h: its rules)
//   admission.h        whether a submission may enter: spec vs policy, rdzv_id in
//                      use, queue limits; reservations while it is being stored
//   port_book.h        the store port each active attempt holds on its rank-0 node
//   timers.h           start deadlines of formed attempts; the stall checks' schedule
//   drain_policy.h     what a node drain does to each job running there
//   stall_watchdog.h   one attempt's stall verdict
//   store_writer.h     group commit of changed rows to the Store (store.h)
// This class owns the lock, calls the parts, and acts on what they report: stages
// the changed rows, keeps the queue and the workers' desired state in step, and
// wakes watchers.
//
// How a job becomes RUNNING: Submit -> (scheduling pass) FormAttempt assigns ranks
// to workers -> each worker's next heartbeat reply carries its task -> the workers
// report their trainers' pids (ApplyReport) -> every rank up: RUNNING; every rank
// exited 0: SUCCEEDED.
//
// Costs: a heartbeat that brings nothing new touches only its worker's record: no
// scan, no store write, no scheduling pass. The queue is examined when something
// that can change its answer happens (submit, cancel, slots freed, a worker joined
// or left, a last-call window closed), once per call however many such events it
// saw. Writes go to the StoreWriter and are committed off the lock; history reads
// (metrics, epochs) run after the lock is released; trainer events are stored by the
// IngestQueue's thread, so no gRPC thread waits on SQLite for a heartbeat or a report.
//
// Durability: a submitted job is stored before it is visible, and Submit and Cancel
// answer only once their change is committed, so a crash loses no acknowledged
// submit or cancel. A heartbeat reply that hands out a newly formed attempt is sent
// once the attempt is committed, so a restarted coordinator never meets trainers of
// an attempt it has no record of. Other changes are committed within a few ms; what
// a crash loses of them the workers' next heartbeats report again.
//
// Threading: one mutex guards the records; the StoreWriter and EventHub have their
// own, taken after it (never the other way round). Listener notifications run after
// the lock is released (TouchList). Time comes from the Clock; Tick() does the
// time-driven work (the server calls it periodically, tests call it with a FakeClock).
#ifndef DDP_COORDINATOR_CORE_COORDINATOR_H_
#define DDP_COORDINATOR_CORE_COORDINATOR_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/core/admission.h"
#include "coordinator/core/coordinator_metrics.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/core/ingest_queue.h"
#include "coordinator/core/task_waiters.h"
#include "coordinator/core/timers.h"
#include "coordinator/core/job_lifecycle.h"
#include "coordinator/core/port_book.h"
#include "coordinator/core/scheduler.h"
#include "coordinator/store/store.h"
#include "coordinator/store/store_writer.h"
#include "coordinator/core/worker_registry.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

// The default rate past which heartbeats are spread out (decision 164).
inline constexpr double kDefaultMaxHeartbeatsPerSecond = 5000;

struct CoordinatorOptions {
  // Ordered, and checked by ValidateTimeouts(): rpc_deadline < heartbeat_interval <
  // heartbeat_timeout; each job's rdzv.timeout_s must exceed heartbeat_timeout and its
  // train.collective_timeout_s must exceed rdzv.timeout_s (checked at submit).
  // A silent node is declared lost <= heartbeat_timeout + one housekeeping tick
  // (100 ms) after its last heartbeat: 2.6 s, having missed 5 heartbeats in a row
  // (docs/control-plane.md, "Detection").
  absl::Duration rpc_deadline = absl::Milliseconds(400);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Milliseconds(2500);
  // How long a restarted coordinator waits for the workers it recovered to check in:
  // at least heartbeat_timeout, and above the agents' reconnect bound (ReconnectBound
  // in worker/agent/agent.h: 3.4 s with these defaults), however short the timeout.
  absl::Duration recovery_grace = absl::Seconds(10);
  // Heartbeat rate scaling (decision 162), as Nomad scales its heartbeat TTL: when the
  // live workers beating every heartbeat_interval would send more than this many
  // heartbeats a second, the interval the agents are told (RegisterResponse and every
  // HeartbeatResponse) and the timeout they are held to are both stretched by the
  // same whole factor, HeartbeatStretch(). 0: never (every worker beats every
  // heartbeat_interval). On by default (decision 164): with the 1 s interval, past
  // 5,000 live workers.
  double max_heartbeats_per_second = kDefaultMaxHeartbeatsPerSecond;
  // How long a formed attempt's workers have to report every trainer started (a
  // pid): a worker that holds its task but never starts it fails the attempt
  // (retryably) after this, not after rdzv.timeout_s. Zero: StartTimeout()'s default.
  absl::Duration start_timeout = absl::ZeroDuration();
  // MLflow (coordinator/tracking/mlflow_tracker.h). --mlflow-uri: the server every job
  // is a run on unless its job.yaml says `tracking: {mlflow: false}`; empty: only jobs
  // that ask. --mlflow-allow: further servers a job may name (tracking.mlflow.uri);
  // a job naming any other is refused at submit, so job files cannot make the
  // coordinator send requests to addresses its operator did not list.
  std::string mlflow_uri;
  std::vector<std::string> mlflow_allowed;
};

// Heartbeat rate scaling (decision 162): the whole factor, from 1 to
// kMaxHeartbeatStretch, that keeps `live_workers` beating once every `interval * factor`
// at or under `max_per_second` heartbeats a second (1 when `max_per_second` is 0). The
// cap keeps a stretched interval within the restarted coordinator's recovery grace and
// the detection of a dead node within 4 heartbeat timeouts.
inline constexpr int kMaxHeartbeatStretch = 4;
int HeartbeatStretch(int live_workers, double max_per_second, absl::Duration interval);

// The MLflow server a job's runs go to ("": none), or INVALID_ARGUMENT naming the
// field when the job asks for one the coordinator does not allow.
absl::StatusOr<std::string> MlflowServerFor(const JobSpec& spec, const std::string& source,
                                            const CoordinatorOptions& options);

// The start timeout in effect: options.start_timeout, or by default
// max(5 heartbeat intervals, 10 s): the task reaches its worker with the next
// heartbeat reply and the pids come back with the one after, so five intervals
// are two heartbeats lost in a row; the 10 s floor absorbs a slow fork/exec on a
// loaded node (see docs/control-plane.md).
absl::Duration StartTimeout(const CoordinatorOptions& options);

// INVALID_ARGUMENT naming the flags that are out of order.
absl::Status ValidateTimeouts(const CoordinatorOptions& options);

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options, Store* store, EventHub* hub, Clock* clock,
              UsageLimits limits = UsageLimits());
  // Commits what is staged. Destroy after the server that calls it has shut down.
  ~Coordinator() = default;

  // Loads jobs, attempts, rank tables and workers from the store. Running attempts
  // keep running: their workers have one heartbeat timeout to check in.
  absl::Status Recover();

  // --- JobService ---
  // INVALID_ARGUMENT (spec errors with field and line), ALREADY_EXISTS (live rdzv_id),
  // UNAVAILABLE (the store could not write it: nothing is kept).
  // RESOURCE_EXHAUSTED (UsageLimits). The caller is stored as the job's owner.
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request,
                                 const Caller& caller = Caller());
  // NOT_FOUND. The spec's env values are redacted unless `caller` owns the job.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, bool metric_history = false,
                                 const Caller& caller = Caller());
  // Newest first, without metrics, epoch history or spec (GetJob has them).
  std::vector<v1::Job> ListJobs(int limit);
  // NOT_FOUND, PERMISSION_DENIED (`caller` does not own the job: the message names
  // the owner), FAILED_PRECONDITION (already finished), UNAVAILABLE (cancelled, but
  // not stored yet: the coordinator keeps retrying).
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const Caller& caller = Caller());
  // Asks the workers of the job's running attempt for its ranks' stacks now (`ddpctl
  // diagnose --now`, decision 194). NOT_FOUND, PERMISSION_DENIED (as Cancel),
  // FAILED_PRECONDITION (no attempt runs).
  absl::StatusOr<v1::CaptureStacksResponse> CaptureStacks(const std::string& job_id,
                                                          const Caller& caller = Caller());
  // A page of workers in name order, and the cluster's summary. INVALID_ARGUMENT
  // (negative limit).
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request);

  // --- Node maintenance (coordinator_maintenance.cc) ---
  // Cordons, drains (per `policy`) or uncordons `worker` (WORKER_SCHEDULABLE), and
  // answers with its view once the change is stored. A drain restarts the jobs it
  // must move at once (DRAIN_NOW; or, at a checkpoint, attempts still starting) and
  // the rest after their next checkpoint event. NOT_FOUND; UNAVAILABLE (applied, not
  // stored yet: the writer keeps retrying).
  absl::StatusOr<v1::Worker> SetMaintenance(const std::string& worker,
                                            v1::WorkerMaintenance maintenance,
                                            v1::DrainPolicy policy = v1::DRAIN_AT_CHECKPOINT,
                                            const Caller& caller = Caller());
  // Forgets a lost worker. NOT_FOUND, FAILED_PRECONDITION (alive, or not yet checked
  // in since a coordinator restart), UNAVAILABLE (not stored yet).
  absl::Status RemoveWorker(const std::string& worker);
  // WorkerService.Leave: the agent is going away for good; forgotten at once, as
  // RemoveWorker, its active attempts failing retryably. An unknown worker is OK
  // (left already); FAILED_PRECONDITION for a stale incarnation.
  absl::Status Leave(const v1::LeaveRequest& request);

  // Replaces the per-owner quotas (--quota-file re-read on SIGHUP) and runs a
  // scheduling pass: jobs that waited for quota may start now. Jobs already running
  // past a lowered quota keep running; the owner's next jobs wait.
  void SetQuotas(Quotas quotas) ABSL_LOCKS_EXCLUDED(mu_);

  // --- WorkerService ---
  // INVALID_ARGUMENT.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // NOT_FOUND (unknown worker), FAILED_PRECONDITION (stale incarnation). `done` runs
  // once, on the caller's thread or (when the reply hands out an attempt not yet
  // committed) on the store writer's; it must not block.
  using HeartbeatDone = std::function<void(absl::StatusOr<v1::HeartbeatResponse>)>;
  void Heartbeat(const v1::HeartbeatRequest& request, HeartbeatDone done);
  // The same, waiting for the reply (tests, tools).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // NOT_FOUND, FAILED_PRECONDITION, as Heartbeat. A batch whose batch_seq was
  // already applied is dropped (OK); so are events of unknown jobs. `done` runs once
  // the events are stored: on the ingest queue's thread (so the caller's thread never
  // waits on SQLite), or at once on the caller's when there is nothing to store.
  using ReportDone = std::function<void(absl::Status)>;
  void ReportEvents(const v1::ReportEventsRequest& request, ReportDone done);
  // The same, waiting for the answer (tests, tools).
  absl::Status ReportEvents(const v1::ReportEventsRequest& request);

  // A long poll (WaitForTasks): `done` gets the worker's desired-state version once
  // it differs from request.desired_version (at once if it does already), or that
  // same version after request.timeout_ms (clamped to 1..60 s; 0: 30 s). Errors as
  // Heartbeat. `done` runs on the TaskWaiters' thread or the caller's; must not block.
  void WaitForTasks(const v1::WaitForTasksRequest& request, TaskWaiters::Done done);
  // Answers every open long poll UNAVAILABLE (the server is shutting down).
  void CloseLongPolls() { task_waiters_.Close(); }
  int open_long_polls() const { return task_waiters_.open(); }

  // Expires heartbeats, times out rendezvous, closes last-call windows, runs the
  // scheduler if anything asked for it, and once a minute applies retention: the
  // `retain_jobs` finished jobs that ended last are kept.
  void Tick();

  // Waits until every change made so far is committed; the last commit's status.
  absl::Status Flush() { return writer_.Flush(); }

  // Counters (monitoring and tests).
  struct Stats {
    int64_t heartbeats = 0;
    int64_t scheduling_passes = 0;
    // Task statuses and events a worker sent about ranks the coordinator's rank
    // table does not give it: ignored (a misbehaving or hostile worker).
    int64_t foreign_reports = 0;
    StoreWriter::Stats store;
  };
  Stats stats();
  // What a metrics scrape shows (coordinator_metrics.cc): counts read under the lock,
  // the running ranks' latest metrics from the hub after it is released.
  CoordinatorMetrics Metrics() ABSL_LOCKS_EXCLUDED(mu_);

 private:
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

  JobRecord* FindLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acts on what a transition changed: stages its rows (not for a retiring job), keeps
  // the queue, the workers' desired state, the store ports and the start deadlines in
  // step, and queues the watchers' wake-up.
  void ApplyLocked(JobRecord& job, const JobDelta& delta, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active attempt's ranks join their workers' desired state (after forming, and
  // on recovery); EndAttemptLocked takes an ended attempt's ranks out again.
  void PlaceAttemptLocked(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `worker`'s open long polls if its desired state moved on.
  void WakeLongPollsLocked(const std::string& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts restarts and times rendezvous from what a transition changed.
  void NoteMetricsLocked(const JobRecord& job, const JobDelta& delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndAttemptLocked(JobRecord& job, int attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active attempt's failed ranks are to be replaced live (JobDelta::recover):
  // starts the recovery (BeginRecovery) with replacements where the failed ranks ran
  // and a new store port on rank 0's node, or falls back to a restart (FailRecovery)
  // when their workers cannot take them or no port is free.
  void RecoverLocked(JobRecord& job, TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint-now notice for the active attempt of a job that resumes from
  // periodic checkpoints (docs/recovery.md): every worker of the attempt hears it with
  // its next heartbeat (long polls woken). `deadline`: when the ranks will be stopped
  // (InfinitePast: not known). False when the job does not take such checkpoints.
  bool RaiseNoticeLocked(JobRecord& job, const std::string& reason, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stack capture of the active attempt's ranks (Task.stacks_seq): its seq, 0 when
  // no attempt is active. Its workers hear it with their next heartbeat (long polls woken).
  int RequestStacksLocked(JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes every worker of the active attempt to fetch its desired state again.
  void TouchAttemptWorkersLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker` got SIGTERM and will stop its ranks within `grace`: attempts there that
  // can move at a checkpoint get the notice and move after it (MoveAfterCheckpointLocked);
  // the others end at once, as when a worker leaves.
  void StoppingWorkerLocked(const std::string& worker, const std::string& why,
                            absl::Duration grace, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BeginRecovery with a new store port on rank 0's node (FailRecovery when it has
  // none), its deadline armed and every worker of the attempt woken.
  void StartRecoveryLocked(JobRecord& job, const std::vector<int>& moved,
                           const std::string& cause, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs scheduling passes if something asked for one (schedule_dirty_), applying
  // their decisions, until no more attempts form.
  void ScheduleLocked(TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs holding nodes (scheduler.h RunningJob): active attempts, and attempts a
  // priority preemption ended whose trainers may still run. O(holding_ + their ranks).
  std::vector<RunningJob> RunningJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies a pass's kPreempt decisions: marks each new victim (preempted at once if
  // it says `kill` or is not RUNNING yet), and unmarks victims no longer needed.
  void PreemptLocked(const std::vector<Decision>& decisions, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job's active attempt to make room for a higher-priority job: back to the
  // queue, not counted as a restart, counted in Job.preemptions.
  void PreemptForPriorityLocked(JobRecord& job, const std::string& reason, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker an operator named: NOT_FOUND saying where the names are listed.
  absl::StatusOr<WorkerRecord*> KnownWorkerLocked(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `worker` (RemoveWorker, Leave): its active attempts fail (retryably) with
  // `reason`, its row is deleted. Returns the store ticket to wait on.
  StoreWriter::Ticket ForgetWorkerLocked(WorkerRecord& worker, const std::string& reason,
                                         TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forms the attempt if its rank-0 node has a free port for the store, and no rank of
  // the attempt before it may still live.
  bool FormLocked(JobRecord& job, const std::vector<NodeOffer>& nodes, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ranks of the job's last attempt that may still run on a live worker.
  int PreviousAttemptLiveRanksLocked(const JobRecord& rec) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A changed report of `worker`: a start error with node_fault, or a rank that
  // exited kExitNodeFault, quarantines the worker; a rank that exited 0 ends its
  // streak of node faults.
  void NoteNodeFaultsLocked(WorkerRecord& worker, const v1::TaskStatus& status,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the task's exit codes are ddp-trainer's (3: node fault), not a program's.
  bool TrainerExitCodesLocked(const v1::TaskStatus& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stall watchdog (stall_watchdog.h): fails each watched attempt with a rank
  // silent past its timeout. Runs at most once a second.
  void CheckStallsLocked(absl::Time now, TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The jobs whose active attempt has ranks on `worker`, with that attempt's number
  // (taken before acting on them: ending an attempt changes the worker's assignments).
  std::vector<std::pair<JobRecord*, int>> ActiveJobsOnWorkerLocked(const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailAttemptsOnWorkerLocked(const std::string& worker, const std::string& reason,
                                  TouchList& touched, bool lost = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `lost` is gone with its trainers: when the job may recover live, its ranks there
  // move to a spare worker (the first eligible one, by name, with room for all of
  // them) and the attempt recovers; with no spare the recovery falls back to a
  // restart, named so. False when live recovery does not apply (the caller fails the
  // attempt as before).
  bool ReplaceNodeLocked(JobRecord& job, const std::string& lost, const std::string& reason,
                         TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker as ListWorkers shows it.
  v1::Worker WorkerViewLocked(const WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restarts elsewhere the active attempts on draining `worker` that must move now:
  // all of them (DRAIN_NOW), or (DRAIN_AT_CHECKPOINT) those not RUNNING yet.
  void DrainNowLocked(WorkerRecord& worker, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank 0 of `job`'s active attempt reported a checkpoint: if a worker of the
  // attempt drains at a checkpoint, the job moves now, resuming from it.
  // (Not the checkpoint taken at the job's end.)
  void MoveAfterCheckpointLocked(JobRecord& job, const v1::TrainerEvent::Checkpoint& checkpoint,
                                 TouchList& touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What one trainer event of `job` (already checked to come from its rank's worker)
  // means to the coordinator: the stall watch, a drain at a checkpoint, a rank's error.
  void ApplyEventLocked(JobRecord& job, const v1::ReportedEvent& event, TouchList& touched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::HeartbeatResponse> HeartbeatLocked(const v1::HeartbeatRequest& request,
                                                        TouchList& touched,
                                                        StoreWriter::Ticket* commit_first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The flight recorders the beat carries, into their attempts' stall watches (every
  // beat's: they move while the statuses stay the same).
  void NoteFlightsLocked(const WorkerRecord& worker, const v1::HeartbeatRequest& req,
                         absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HeartbeatStretch() for the live workers now (decision 162).
  int BeatStretchLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's desired tasks; records those it had not reported as dispatched and
  // raises `*commit_first` to the store ticket the reply must wait for.
  v1::HeartbeatResponse DesiredLocked(WorkerRecord& worker, StoreWriter::Ticket* commit_first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The job as clients see it, without what lives outside the lock: queue position
  // and live trainers. FillView adds the latest metrics and epochs (from the hub)
  // and, on request, the stored metric history (the store's error, naming what was
  // read, when it cannot: an empty history would read as a job that never stepped);
  // call it unlocked.
  v1::Job SummaryLocked(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FillView(v1::Job& view, bool metric_history) ABSL_LOCKS_EXCLUDED(mu_);
  std::string NewJobIdLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick()'s work under the lock; returns the finished jobs past retention (marked
  // retiring) when retention is due.
  std::optional<std::vector<std::string>> Housekeep() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `worker` may report `status`: every rank it names is the worker's in the
  // rank table, and a task of the active attempt is in its desired state. O(ranks
  // reported).
  bool OwnsReportLocked(const WorkerRecord& worker, const JobRecord& job,
                        const v1::TaskStatus& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an output line of `job` is within its UsageLimits::log_bytes_per_job
  // (counting it if so). The line that reaches the limit is added to `known` here,
  // followed by a notice, and false is returned: nothing more of the job is kept.
  bool AdmitOutputLocked(JobRecord& job, const v1::ReportedEvent& event,
                         std::vector<v1::ReportedEvent>& known)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `n` ignored reports of `worker`; logs the first of each worker.
  void CountForeignLocked(const std::string& worker, int64_t n, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const UsageLimits limits_;
  Store* const store_;
  EventHub* const hub_;
  Clock* const clock_;
  StoreWriter writer_;
  // Numbered event batches the store did not take (their workers send them again):
  // shared with the ingest queue's answers, which may run as the coordinator goes.
  class UnstoredBatches {
   public:
    void Add(const std::string& worker, const std::string& incarnation, int64_t seq) {
      absl::MutexLock lock(&mu_);
      keys_.emplace(worker, incarnation, seq);
    }
    // Whether the batch was one of them (it is not any more).
    bool Take(const std::string& worker, const std::string& incarnation, int64_t seq) {
      absl::MutexLock lock(&mu_);
      return keys_.erase({worker, incarnation, seq}) > 0;
    }

   private:
    absl::Mutex mu_;
    std::set<std::tuple<std::string, std::string, int64_t>> keys_ ABSL_GUARDED_BY(mu_);
  };
  std::shared_ptr<UnstoredBatches> unstored_ = std::make_shared<UnstoredBatches>();
  IngestQueue ingest_;  // Trainer events on their way to the hub.
  TaskWaiters task_waiters_;  // Open WaitForTasks calls.

  absl::Mutex mu_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  JobQueue queue_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry registry_ ABSL_GUARDED_BY(mu_);
  // Store ports of active attempts, by rank-0 address: never handed out twice.
  PortBook ports_ ABSL_GUARDED_BY(mu_);
  // Formed attempts whose trainers must be up by a deadline (timers.h).
  StartDeadlines start_deadlines_ ABSL_GUARDED_BY(mu_);
  // Live recoveries that fall back to a restart unless done by then (same records).
  StartDeadlines recovery_deadlines_ ABSL_GUARDED_BY(mu_);
  // Marked `kill` jobs given a checkpoint-now notice: when each moves without one.
  StartDeadlines preempt_deadlines_ ABSL_GUARDED_BY(mu_);
  // Per-owner slot quotas: limits_.quotas until SetQuotas.
  Quotas quotas_ ABSL_GUARDED_BY(mu_);
  // Jobs holding nodes: an active attempt with ranks, or a preempted one whose
  // trainers may still run (JobRecord::stopping_attempt). RunningJobsLocked's list.
  std::set<std::string> holding_ ABSL_GUARDED_BY(mu_);
  // Jobs marked to be preempted at their next checkpoint (JobRecord::preempt_for).
  std::set<std::string> preempting_ ABSL_GUARDED_BY(mu_);
  // Submission checks and the submissions being stored (not visible yet).
  Admission admission_ ABSL_GUARDED_BY(mu_);
  // Ignored reports per worker name (CountForeignLocked).
  std::map<std::string, int64_t> foreign_reports_ ABSL_GUARDED_BY(mu_);
  int64_t foreign_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool schedule_dirty_ ABSL_GUARDED_BY(mu_) = false;
  // Jobs whose active attempt's stall watch is armed, checked once a second.
  StallChecks stall_checks_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // The store's, told to workers: set by Recover, before any call is served.
  std::string cluster_id_;
  absl::Time last_retention_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
  // Monitoring (coordinator_metrics.h): event-driven numbers only.
  BucketHistogram heartbeat_lag_ ABSL_GUARDED_BY(mu_){HeartbeatLagBounds()};
  BucketHistogram rendezvous_times_ ABSL_GUARDED_BY(mu_){RendezvousBounds()};
  int64_t restarts_total_ ABSL_GUARDED_BY(mu_) = 0;
  // Live recoveries begun, and ended by outcome ("recovered", "failed").
  int64_t recoveries_started_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> recoveries_ended_ ABSL_GUARDED_BY(mu_);
  // Attempts formed by this coordinator and not yet RUNNING or ended: when formed.
  std::map<TaskKey, absl::Time> rendezvous_started_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_COORDINATOR_H_
