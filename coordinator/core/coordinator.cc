// The facade's job side: submission, queries, cancellation, scheduling, and acting
// on what transitions changed. Worker-facing methods are in coordinator_workers.cc,
// time-driven work in coordinator_housekeeping.cc.
#include "coordinator/core/coordinator.h"
#include "coordinator/core/drain_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/jobspec/redact.h"
#include "common/logging.h"
#include "coordinator/core/rendezvous.h"

namespace ddp {
namespace {

// `caller` (a user) may not `what` the job, someone else's: whose it is, and the rule.
absl::Status NotOwned(const Caller& caller, const v1::Job& job, const char* what,
                      const char* rule) {
  return absl::PermissionDeniedError(absl::StrCat(
      caller.name, " may not ", what, " job ", job.id(), ": it belongs to ",
      job.owner().empty() ? "no one (submitted without authentication)" : job.owner(), "; ",
      rule));
}

}  // namespace

absl::Status ValidateTimeouts(const CoordinatorOptions& o) {
  if (o.rpc_deadline <= absl::ZeroDuration() || o.rpc_deadline >= o.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rpc-deadline (", absl::FormatDuration(o.rpc_deadline),
        ") must be positive and shorter than --heartbeat-interval (",
        absl::FormatDuration(o.heartbeat_interval), ")"));
  }
  if (o.heartbeat_interval >= o.heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat-interval (", absl::FormatDuration(o.heartbeat_interval),
        ") must be shorter than --heartbeat-timeout (",
        absl::FormatDuration(o.heartbeat_timeout), ")"));
  }
  if (!(o.max_heartbeats_per_second >= 0) || std::isinf(o.max_heartbeats_per_second)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-heartbeats-per-second (", o.max_heartbeats_per_second,
        ") must be a number >= 0 (0: heartbeats are never spread out)"));
  }
  return absl::OkStatus();
}

int HeartbeatStretch(int live_workers, double max_per_second, absl::Duration interval) {
  if (max_per_second <= 0 || live_workers <= 0) return 1;
  const double per_interval = max_per_second * absl::ToDoubleSeconds(interval);
  const double factor = std::ceil(static_cast<double>(live_workers) / per_interval);
  return static_cast<int>(std::clamp(factor, 1.0, static_cast<double>(kMaxHeartbeatStretch)));
}

absl::StatusOr<std::string> MlflowServerFor(const JobSpec& spec, const std::string& source,
                                            const CoordinatorOptions& options) {
  const TrackingSpec& t = spec.tracking;
  if (t.mlflow == TrackingSpec::Mlflow::kOff) return std::string();
  if (t.mlflow == TrackingSpec::Mlflow::kDefault) return options.mlflow_uri;
  if (t.mlflow_uri.empty()) {
    if (options.mlflow_uri.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tracking.mlflow: this coordinator has no MLflow server (ddp-coordinator "
                  "--mlflow-uri): name one of its allowed servers with tracking.mlflow.uri, "
                  "or leave tracking out"));
    }
    return options.mlflow_uri;
  }
  if (t.mlflow_uri == options.mlflow_uri ||
      std::find(options.mlflow_allowed.begin(), options.mlflow_allowed.end(), t.mlflow_uri) !=
          options.mlflow_allowed.end()) {
    return t.mlflow_uri;
  }
  std::vector<std::string> allowed;
  if (!options.mlflow_uri.empty()) allowed.push_back(options.mlflow_uri);
  allowed.insert(allowed.end(), options.mlflow_allowed.begin(), options.mlflow_allowed.end());
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": tracking.mlflow.uri ", t.mlflow_uri,
      " is not one of this coordinator's MLflow servers (",
      allowed.empty() ? "it has none" : absl::StrJoin(allowed, ", "),
      "): its operator lists them with ddp-coordinator --mlflow-uri and --mlflow-allow"));
}

absl::Duration StartTimeout(const CoordinatorOptions& o) {
  if (o.start_timeout > absl::ZeroDuration()) return o.start_timeout;
  return std::max(5 * o.heartbeat_interval, absl::Seconds(10));
}

Coordinator::TouchList::~TouchList() {
  for (const std::string& id : finished_) hub_->MarkFinished(id);
  for (const std::string& id : ids_) hub_->Touch(id);
}

Coordinator::Coordinator(CoordinatorOptions options, Store* store, EventHub* hub,
                         Clock* clock, UsageLimits limits)
    : options_(options),
      limits_(limits),
      store_(store),
      hub_(hub),
      clock_(clock),
      writer_(store),
      ingest_(hub),
      registry_(options.heartbeat_timeout),
      admission_(limits) {
  absl::MutexLock lock(&mu_);
  last_retention_ = clock_->Now();
  quotas_ = limits.quotas;
}

void Coordinator::SetQuotas(Quotas quotas) {
  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  quotas_ = std::move(quotas);
  schedule_dirty_ = true;  // A job waiting for quota may fit now.
  ScheduleLocked(touched);
}

JobRecord* Coordinator::FindLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Coordinator::Stats Coordinator::stats() {
  Stats s;
  s.store = writer_.stats();
  absl::MutexLock lock(&mu_);
  s.heartbeats = heartbeats_;
  s.scheduling_passes = passes_;
  s.foreign_reports = foreign_total_;
  return s;
}

void Coordinator::ApplyLocked(JobRecord& rec, const JobDelta& delta, TouchList& touched) {
  const std::string& id = rec.job.id();
  if (!rec.retiring) {  // A retiring job is being deleted: nothing more is written.
    if (delta.job_row) writer_.PutJob(rec.job, rec.seq);
    for (int n : delta.attempt_rows) writer_.PutAttempt(id, rec.job.attempts(n - 1));
    for (const auto& [n, rank] : delta.rank_rows) {
      const v1::Attempt& a = rec.job.attempts(n - 1);
      if (rank < a.ranks_size() && a.ranks(rank).rank() == rank) {
        writer_.PutRank(id, n, a.ranks(rank));
      } else {
        for (const v1::RankAssignment& r : a.ranks()) {
          if (r.rank() == rank) writer_.PutRank(id, n, r);
        }
      }
    }
  }
  if (!delta.empty() || delta.finished) touched.Add(id, IsTerminal(rec.job.state()));
  if (delta.ended_attempt != 0) EndAttemptLocked(rec, delta.ended_attempt);
  if (delta.formed) {
    PlaceAttemptLocked(rec);
    rec.formed_ticket = writer_.last_staged();  // Covers the attempt's rows.
  }
  NoteMetricsLocked(rec, delta);
  if (delta.recover) RecoverLocked(rec, touched);
  if (queue_.Sync(rec)) schedule_dirty_ = true;  // The queue changed.
}

void Coordinator::PlaceAttemptLocked(JobRecord& rec) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return;
  const TaskKey key{rec.job.id(), a->number()};
  std::map<std::string, AssignedTask> tasks;
  for (const v1::RankAssignment& r : a->ranks()) {
    AssignedTask& t = tasks[r.worker()];
    t.ranks.push_back(r.rank());
    if (!r.gpu_uuid().empty()) t.gpu_uuids.push_back(r.gpu_uuid());
    t.group_rank = r.group_rank();
  }
  for (auto& [worker, task] : tasks) {
    registry_.Assign(worker, key, std::move(task));
    WakeLongPollsLocked(worker);
  }
  ports_.Hold(a->master_addr(), a->master_port());
  if (a->ranks_size() > 0) holding_.insert(rec.job.id());
  if (a->state() == v1::RENDEZVOUS) {
    start_deadlines_.Add(rec.start_deadline, rec.job.id(), a->number());
  }
  if (Recovering(*a)) {  // Restored mid-recovery: it still has its bound.
    recovery_deadlines_.Add(rec.recovery_deadline, rec.job.id(), a->number());
  }
}

void Coordinator::RecoverLocked(JobRecord& rec, TouchList& touched) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr || a->ranks_size() == 0) return;
  const absl::Time now = clock_->Now();
  for (const v1::RankAssignment& r : a->ranks()) {
    if (!r.exited()) continue;
    const WorkerRecord* w = registry_.Find(r.worker());
    if (w == nullptr || !w->alive || w->leaving) {
      ApplyLocked(rec,
                  FailRecovery(rec, absl::StrCat("rank ", r.rank(), "'s worker ", r.worker(),
                                                 " cannot start its replacement (",
                                                 w == nullptr || !w->alive ? "lost" : "leaving",
                                                 ")"),
                               now),
                  touched);
      return;
    }
  }
  StartRecoveryLocked(rec, {}, "", touched);
}

void Coordinator::StartRecoveryLocked(JobRecord& rec, const std::vector<int>& moved,
                                      const std::string& cause, TouchList& touched) {
  const v1::Attempt* a = ActiveAttempt(rec);
  const absl::Time now = clock_->Now();
  // A fresh store for the new generation, on rank 0's node: a port it found free.
  const v1::RankAssignment& head = a->ranks(0);
  WorkerRecord* w0 = registry_.Find(head.worker());
  const int port =
      w0 == nullptr ? 0 : ports_.Pick(head.worker(), head.address(), w0->free_ports, now);
  if (port == 0) {
    ApplyLocked(rec,
                FailRecovery(rec, absl::StrCat(cause.empty() ? "" : cause + ", and ", "no free port on ",
                                               head.worker(), " for the new generation's store"),
                             now),
                touched);
    return;
  }
  ports_.Release(a->master_addr(), a->master_port(), now);
  ports_.Hold(head.address(), port);
  const std::string address = head.address();
  ApplyLocked(rec, BeginRecovery(rec, address, port, now, moved, cause), touched);
  a = ActiveAttempt(rec);
  const TaskKey key{rec.job.id(), a->number()};
  recovery_deadlines_.Add(rec.recovery_deadline, key.first, key.second);
  TouchAttemptWorkersLocked(rec);  // They hear of the new generation now, not a beat later.
}

void Coordinator::TouchAttemptWorkersLocked(const JobRecord& rec) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return;
  const TaskKey key{rec.job.id(), a->number()};
  std::set<std::string> workers;
  for (const v1::RankAssignment& r : a->ranks()) workers.insert(r.worker());
  for (const std::string& name : workers) {
    if (WorkerRecord* w = registry_.Find(name); w != nullptr && w->assigned.count(key)) {
      AssignedTask same = w->assigned.at(key);
      registry_.Assign(name, key, std::move(same));  // Bumps its desired version.
      WakeLongPollsLocked(name);
    }
  }
}

int Coordinator::RequestStacksLocked(JobRecord& rec) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return 0;
  ++rec.stacks_seq;
  rec.stacks_attempt = a->number();
  TouchAttemptWorkersLocked(rec);
  return rec.stacks_seq;
}

absl::StatusOr<v1::CaptureStacksResponse> Coordinator::CaptureStacks(const std::string& job_id,
                                                                     const Caller& caller) {
  absl::MutexLock lock(&mu_);
  JobRecord* rec = FindLocked(job_id);
  if (rec == nullptr) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  if (!caller.Owns(rec->job)) {
    return NotOwned(caller, rec->job, "take the stacks of",
                    "a user asks only of the jobs it submitted (an admin token of any)");
  }
  const v1::Attempt* a = ActiveAttempt(*rec);
  if (a == nullptr || a->state() != v1::RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no running attempt (it is ", v1::JobState_Name(rec->job.state()),
        "): `ddpctl diagnose ", job_id,
        "` without --now shows what its last attempt's workers logged"));
  }
  v1::CaptureStacksResponse resp;
  resp.set_attempt(a->number());
  resp.set_seq(RequestStacksLocked(*rec));
  DDP_LOG(INFO) << "job " << job_id << " attempt " << a->number() << ": stacks asked for (capture "
                << resp.seq() << ")" << (caller.name.empty() ? "" : " by " + caller.name);
  return resp;
}

bool Coordinator::RaiseNoticeLocked(JobRecord& rec, const std::string& reason,
                                    absl::Time deadline) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr || !ResumesFromPeriodicCheckpoints(rec.spec)) return false;
  ++rec.notice_seq;
  rec.notice_attempt = a->number();
  rec.notice = reason;
  rec.notice_deadline = deadline;
  DDP_LOG(INFO) << "job " << rec.job.id() << " attempt " << a->number()
                << ": checkpoint-now notice " << rec.notice_seq << " (" << reason << ")";
  TouchAttemptWorkersLocked(rec);
  return true;
}

void Coordinator::WakeLongPollsLocked(const std::string& worker) {
  if (const WorkerRecord* w = registry_.Find(worker)) {
    task_waiters_.Changed(worker, w->desired_version);
  }
}

void Coordinator::EndAttemptLocked(JobRecord& rec, int attempt) {
  rec.preempt_for.clear();  // The next attempt starts unmarked.
  rec.preempt_deadline = absl::InfiniteFuture();
  rec.stopping_worker.clear();
  // Holds nothing once its trainers are gone; only a preempted attempt's are counted
  // as coming free (RunningJobsLocked), since only for them does a job wait.
  if (rec.stopping_attempt != attempt) holding_.erase(rec.job.id());
  const v1::Attempt& a = rec.job.attempts(attempt - 1);
  const TaskKey key{rec.job.id(), attempt};
  std::set<std::string> workers;
  for (const v1::RankAssignment& r : a.ranks()) workers.insert(r.worker());
  // Its trainers drop out of their workers' desired state; their slots free up as
  // the workers report them gone.
  for (const std::string& w : workers) {
    if (registry_.Unassign(w, key)) schedule_dirty_ = true;
    WakeLongPollsLocked(w);
  }
  ports_.Release(a.master_addr(), a.master_port(), clock_->Now());
}

void Coordinator::ScheduleLocked(TouchList& touched) {
  if (!schedule_dirty_) return;
  ++passes_;
  const absl::Time now = clock_->Now();
  PassContext context;
  context.quotas = &quotas_;
  context.running = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return RunningJobsLocked(); };
  std::vector<Decision> preempt;  // The last pass's: the complete list.
  bool formed = true;
  while (formed) {  // Each attempt formed changes the cluster: look again.
    schedule_dirty_ = false;
    formed = false;
    preempt.clear();
    for (Decision& d : SchedulePass(queue_, registry_, now, context)) {
      JobRecord& rec = *d.job;
      switch (d.kind) {
        case Decision::Kind::kPreempt:
          preempt.push_back(std::move(d));
          break;
        case Decision::Kind::kUnschedulable:
          ApplyLocked(rec, MarkUnschedulable(rec, d.reason), touched);
          break;
        case Decision::Kind::kWait:
          ApplyLocked(rec, Wait(rec, d.reason), touched);
          break;
        case Decision::Kind::kLastCall:
          ApplyLocked(rec, OpenLastCall(rec, d.window_end, d.eligible), touched);
          break;
        case Decision::Kind::kForm:
          formed = FormLocked(rec, d.nodes, touched);
          break;
      }
    }
  }
  schedule_dirty_ = false;
  PreemptLocked(preempt, touched);
}

std::vector<RunningJob> Coordinator::RunningJobsLocked() {
  std::vector<RunningJob> running;
  for (auto it = holding_.begin(); it != holding_.end();) {
    JobRecord* rec = FindLocked(*it);
    const v1::Attempt* active = rec == nullptr ? nullptr : ActiveAttempt(*rec);
    RunningJob r{rec, {}, 0, false, false, {}};
    // The GPUs it holds on each worker: ranks sharing a GPU (train.device cuda over
    // Gloo) hold it once.
    std::map<std::string, std::set<std::string>> gpus;
    if (active != nullptr && active->ranks_size() > 0) {
      r.preempting = !rec->preempt_for.empty();
      for (const v1::RankAssignment& rank : active->ranks()) {
        ++r.ranks_by_worker[rank.worker()];
        if (!rank.gpu_uuid().empty()) gpus[rank.worker()].insert(rank.gpu_uuid());
      }
    } else if (rec != nullptr && rec->stopping_attempt > 0) {
      // A preempted attempt: its nodes come free as its trainers go.
      r.ended = true;
      const TaskKey key{rec->job.id(), rec->stopping_attempt};
      for (const v1::RankAssignment& rank : rec->job.attempts(rec->stopping_attempt - 1).ranks()) {
        const WorkerRecord* w = registry_.Find(rank.worker());
        if (w == nullptr || !registry_.RankMayLive(*w, key, rank)) continue;
        ++r.ranks_by_worker[rank.worker()];
        if (!rank.gpu_uuid().empty()) gpus[rank.worker()].insert(rank.gpu_uuid());
      }
      if (r.ranks_by_worker.empty()) rec->stopping_attempt = 0;  // All gone.
    }
    for (const auto& [worker, held] : gpus) r.gpus_by_worker[worker] = static_cast<int>(held.size());
    if (r.ranks_by_worker.empty()) {  // Holds nothing (any more).
      it = holding_.erase(it);
      continue;
    }
    for (const auto& [worker, ranks] : r.ranks_by_worker) r.ranks += ranks;
    // Not RUNNING yet (or stopping): it moves at once, and has nothing to lose.
    r.loss = PreemptionLoss(*rec, clock_->Now()).value_or(absl::ZeroDuration());
    running.push_back(std::move(r));
    ++it;
  }
  return running;
}

void Coordinator::PreemptLocked(const std::vector<Decision>& decisions, TouchList& touched) {
  std::set<std::string> wanted;
  for (const Decision& d : decisions) {
    JobRecord& rec = *d.job;
    wanted.insert(rec.job.id());
    const v1::Attempt* a = ActiveAttempt(rec);
    if (a == nullptr) continue;  // Stopping already.
    if (!rec.preempt_for.empty()) {
      if (rec.preempt_for != d.for_job->job.id()) {  // Another job needs it now.
        DDP_LOG(INFO) << "job " << rec.job.id() << " will be preempted for job "
                      << d.for_job->job.id() << " (instead of " << rec.preempt_for << ")";
        rec.preempt_for = d.for_job->job.id();
      }
      continue;
    }
    rec.preempt_for = d.for_job->job.id();
    preempting_.insert(rec.job.id());
    const std::string why = absl::StrCat("job ", rec.preempt_for, " (higher priority) needs its nodes");
    // Moves at once when it has not started training (nothing to lose), or says it may
    // be killed and asks no notice; else after the checkpoint it is asked for
    // (MoveAfterCheckpointLocked), for a `kill` job with preemption_notice_s at the
    // latest when the notice runs out (Housekeep).
    if (rec.job.state() != v1::RUNNING) {
      PreemptForPriorityLocked(rec, d.reason, touched);
    } else if (rec.spec.preemption == PreemptionPolicy::kKill) {
      const absl::Time deadline =
          clock_->Now() + absl::Seconds(rec.spec.preemption_notice_s);
      if (rec.spec.preemption_notice_s > 0 && RaiseNoticeLocked(rec, why, deadline)) {
        rec.preempt_deadline = deadline;
        preempt_deadlines_.Add(deadline, rec.job.id(), a->number());
        DDP_LOG(INFO) << "job " << rec.job.id() << " is asked for a checkpoint within "
                      << rec.spec.preemption_notice_s << " s, then preempted: " << d.reason;
      } else {
        PreemptForPriorityLocked(rec, d.reason, touched);
      }
    } else {
      RaiseNoticeLocked(rec, why, absl::InfinitePast());
      DDP_LOG(INFO) << "job " << rec.job.id() << " will be preempted at its next checkpoint: "
                    << d.reason;
    }
  }
  for (auto it = preempting_.begin(); it != preempting_.end();) {
    JobRecord* rec = FindLocked(*it);
    if (rec != nullptr && wanted.count(*it) == 0 && !rec->preempt_for.empty()) {
      DDP_LOG(INFO) << "job " << *it << " is no longer to be preempted (job " << rec->preempt_for
                    << " no longer needs its nodes)";
      rec->preempt_for.clear();
      rec->preempt_deadline = absl::InfiniteFuture();
    }
    it = (rec == nullptr || rec->preempt_for.empty()) ? preempting_.erase(it) : std::next(it);
  }
}

void Coordinator::PreemptForPriorityLocked(JobRecord& rec, const std::string& reason,
                                           TouchList& touched) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr) return;
  rec.stopping_attempt = a->number();  // Still in holding_: its trainers are stopping.
  DDP_LOG(INFO) << "job " << rec.job.id() << " preempted: " << reason;
  rec.job.set_preemptions(rec.job.preemptions() + 1);
  JobDelta delta = PreemptAttempt(rec, reason, clock_->Now());
  delta.job_row = true;
  ApplyLocked(rec, delta, touched);
  schedule_dirty_ = true;
}

bool Coordinator::FormLocked(JobRecord& rec, const std::vector<NodeOffer>& nodes,
                             TouchList& touched) {
  // Never two live processes of one rank: a restart waits until every rank of the
  // attempt before it is gone, on every worker, not only where it would land (a free
  // slot elsewhere is no reason to start rank 0 while the old rank 0 still stops). A
  // rank on a lost worker counts as gone: that worker killed it before it could be
  // declared lost (worker/agent/fence.h). The exits reported free the job again.
  if (const int live = PreviousAttemptLiveRanksLocked(rec); live > 0) {
    ApplyLocked(rec,
                Wait(rec, absl::StrCat("waiting for ", live, " rank(s) of attempt ",
                                       rec.job.attempts_size(), " to exit before restarting")),
                touched);
    return false;
  }
  WorkerRecord* head = registry_.Find(nodes[0].worker);
  std::vector<int32_t> no_ports;
  const int port = ports_.Pick(nodes[0].worker, nodes[0].address,
                               head == nullptr ? no_ports : head->free_ports, clock_->Now());
  if (port == 0) {
    ApplyLocked(rec, WaitForPort(rec, nodes[0].worker), touched);
    return false;
  }
  ApplyLocked(rec, FormAttempt(rec, nodes, port, clock_->Now(), StartTimeout(options_)), touched);
  return true;
}

int Coordinator::PreviousAttemptLiveRanksLocked(const JobRecord& rec) const {
  if (rec.job.attempts_size() == 0) return 0;
  const v1::Attempt& previous = rec.job.attempts(rec.job.attempts_size() - 1);
  const TaskKey key{rec.job.id(), previous.number()};
  int live = 0;
  for (const v1::RankAssignment& r : previous.ranks()) {
    const WorkerRecord* w = registry_.Find(r.worker());
    if (w != nullptr && w->alive && registry_.RankMayLive(*w, key, r)) ++live;
  }
  return live;
}

absl::Status Coordinator::Recover() {
  auto loaded = store_->Load();
  if (!loaded.ok()) return loaded.status();
  {
    cluster_id_ = loaded->cluster_id;  // Before any call is served.
    TouchList touched(hub_);  // Tells the hub which jobs are finished.
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    // With heartbeat rate scaling (decision 162) a recovered agent may beat at a
    // stretched interval that this coordinator has not told it: it gets the largest
    // stretch the last leader could have told it until it says which it uses (agents
    // older than the field never say). That leader's live workers were among the
    // stored ones, lost ones included, so their count bounds its factor (decision 164:
    // a cluster under the rate keeps the plain grace).
    const int stretch =
        HeartbeatStretch(static_cast<int>(loaded->workers.size()),
                         options_.max_heartbeats_per_second, options_.heartbeat_interval);
    const absl::Duration grace =
        std::max(options_.recovery_grace, options_.heartbeat_timeout * stretch);
    for (const v1::Worker& w : loaded->workers) {
      registry_.Restore(w, now, grace);
      if (WorkerRecord* r = registry_.Find(w.name())) {
        r->registered_stretch = stretch;
        r->beat_stretch = stretch;
      }
    }
    // The last batch stored of each worker's incarnation: a re-sent one is dropped.
    for (const BatchMark& m : loaded->batch_marks) {
      WorkerRecord* w = registry_.Find(m.worker);
      if (w != nullptr && w->info.incarnation() == m.incarnation) {
        w->last_batch_seq = m.batch_seq;
      }
    }
    for (auto& stored : loaded->jobs) {
      JobRecord loaded_rec;
      loaded_rec.job = std::move(stored.job);
      loaded_rec.seq = stored.seq;
      loaded_rec.log_bytes = stored.log_bytes;
      next_seq_ = std::max(next_seq_, loaded_rec.seq + 1);
      const std::string id = loaded_rec.job.id();
      JobRecord& rec = jobs_[id] = std::move(loaded_rec);
      const JobDelta delta = RestoreJob(rec, now);
      PlaceAttemptLocked(rec);
      // A preempted attempt's trainers may still be stopping: their nodes are counted
      // as coming free until the workers show them gone (not chosen again for room).
      if (ActiveAttempt(rec) == nullptr && rec.job.attempts_size() > 0 &&
          Preempted(*rec.job.attempts().rbegin())) {
        rec.stopping_attempt = rec.job.attempts_size();
        holding_.insert(id);
      }
      ApplyLocked(rec, delta, touched);
      if (IsTerminal(rec.job.state())) touched.Add(id, /*finished=*/true);
    }
    schedule_dirty_ = true;  // The next Tick decides for the queue.
    DDP_LOG(INFO) << "recovered " << jobs_.size() << " jobs and "
                  << registry_.workers().size() << " workers from the state store";
  }
  // What recovery changed (jobs whose spec no longer parses) is stored before the
  // coordinator serves.
  return writer_.Flush();
}

std::string Coordinator::NewJobIdLocked(const std::string& name) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  while (true) {
    std::string id = name.substr(0, 50) + "-";
    for (int i = 0; i < 5; ++i) id += kAlphabet[absl::Uniform(rng_, 0, 36)];
    if (jobs_.count(id) == 0 && !admission_.Reserved(id)) return id;
  }
}

absl::StatusOr<v1::Job> Coordinator::Submit(const v1::SubmitJobRequest& request,
                                            const Caller& caller) {
  const std::string source = request.source_name().empty() ? "job.yaml" : request.source_name();
  auto spec = ParseJobSpec(request.spec_yaml(), source);
  if (!spec.ok()) return spec.status();
  const std::string workdir = !request.workdir().empty() ? request.workdir() : spec->workdir;
  int stretch = 1;
  {
    absl::MutexLock lock(&mu_);
    stretch = BeatStretchLocked();
  }
  if (absl::Status st = CheckSubmission(*spec, source, workdir, caller, limits_,
                                        options_.heartbeat_timeout, stretch);
      !st.ok()) {
    return st;
  }
  if (auto mlflow = MlflowServerFor(*spec, source, options_); !mlflow.ok()) {
    return mlflow.status();
  }

  JobRecord rec;
  StoreWriter::Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    const std::string id = NewJobIdLocked(spec->name);
    const std::string rdzv_id = spec->rdzv_id.empty() ? id : spec->rdzv_id;
    if (absl::Status st = admission_.Admit(jobs_, rdzv_id, caller.name); !st.ok()) return st;
    rec = NewJob(id, next_seq_++, *std::move(spec), rdzv_id, request.spec_yaml(), workdir,
                 clock_->Now());
    rec.job.set_owner(caller.name);
    admission_.Reserve(id, rdzv_id, caller.name);
    ticket = writer_.PutJob(rec.job, rec.seq, /*creation=*/true);
  }
  // Stored before it is visible: a job the store did not take was never submitted.
  // Concurrent submissions share one commit.
  const absl::Status stored = writer_.Wait(ticket);
  v1::Job view;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    const std::string id = rec.job.id();
    admission_.Release(id, rec.job.rdzv_id(), caller.name);
    if (!stored.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "the coordinator could not store the job (", stored.message(),
          "); nothing was queued: check the coordinator's --state-dir (disk full? "
          "permissions?) and submit again"));
    }
    JobRecord& job = jobs_[id] = std::move(rec);
    DDP_LOG(INFO) << "job " << id << " submitted (" << NodeRangeString(job.spec.nodes)
                  << " nodes)" << (caller.name.empty() ? "" : " by " + caller.name);
    touched.Add(id, false);
    if (queue_.Sync(job)) schedule_dirty_ = true;
    ScheduleLocked(touched);
    view = SummaryLocked(job);
  }
  FillView(view, false).IgnoreError();  // Without history it cannot fail.
  return view;
}

v1::Job Coordinator::SummaryLocked(const JobRecord& rec) {
  v1::Job view = rec.job;
  const absl::Time now = clock_->Now();
  // The flight recorders of the running attempt (the stall watch is reset when an
  // attempt forms): live only, like the GPU figures, so the view of an ended attempt is
  // the stored one, the same after a coordinator restart (its reason tells a stall, and
  // the stopped ranks' recorders are in its log).
  const std::vector<RankFlight>& flights = rec.stall.flights();
  if (!flights.empty() && view.attempts_size() > 0 &&
      !IsTerminal(view.attempts().rbegin()->state())) {
    v1::Attempt& last = *view.mutable_attempts()->rbegin();
    for (v1::RankAssignment& r : *last.mutable_ranks()) {
      if (r.rank() < 0 || static_cast<size_t>(r.rank()) >= flights.size()) continue;
      const RankFlight& f = flights[static_cast<size_t>(r.rank())];
      if (!f.known) continue;
      v1::FlightState* out = r.mutable_flight();
      *out = f.state;
      out->set_age_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(now - f.read_at)));
    }
    const std::vector<RankStack>& stacks = rec.stall.stacks();
    for (v1::RankAssignment& r : *last.mutable_ranks()) {
      if (r.rank() < 0 || static_cast<size_t>(r.rank()) >= stacks.size()) continue;
      if (stacks[static_cast<size_t>(r.rank())].known) {
        *r.mutable_stack() = stacks[static_cast<size_t>(r.rank())].summary;
      }
    }
  }
  for (v1::Attempt& a : *view.mutable_attempts()) {
    const TaskKey key{rec.job.id(), a.number()};
    int live = 0;
    for (v1::RankAssignment& r : *a.mutable_ranks()) {
      const WorkerRecord* w = registry_.Find(r.worker());
      if (w != nullptr && registry_.RankMayLive(*w, key, r)) {
        ++live;
        const v1::GpuUsage* gpu = r.gpu_uuid().empty() ? nullptr : w->GpuUsageOf(r.gpu_uuid());
        if (gpu != nullptr && !IsTerminal(a.state())) {
          r.set_gpu_utilization_pct(gpu->utilization_percent());
          r.set_gpu_memory_used_mib(static_cast<double>(gpu->memory_used_bytes()) / (1 << 20));
        }
      } else if (!r.exited() && IsTerminal(a.state())) {
        r.set_lost(true);  // Not "running": nobody runs it, and how it ended is unknown.
      }
    }
    a.set_live_trainers(live);
  }
  view.set_queue_position(queue_.Position(rec));
  if (std::optional<absl::Duration> loss = PreemptionLoss(rec, now)) {
    view.set_preemption_loss_ms(absl::ToInt64Milliseconds(*loss));
  }
  return view;
}

absl::Status Coordinator::FillView(v1::Job& view, bool metric_history) {
  const int attempt =
      view.attempts().empty() ? 0 : view.attempts(view.attempts_size() - 1).number();
  hub_->Fill(view.id(), attempt, &view);
  if (!metric_history) return absl::OkStatus();
  auto history = store_->MetricHistory(view.id());
  if (!history.ok()) {
    return absl::Status(history.status().code(),
                        absl::StrCat("job '", view.id(), "': its metric history could not be read "
                                     "from the state store (try again; the job itself is "
                                     "unaffected): ",
                                     history.status().message()));
  }
  for (auto& m : *history) *view.add_history() = std::move(m);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id, bool metric_history,
                                            const Caller& caller) {
  v1::Job view;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* rec = FindLocked(job_id);
    if (rec == nullptr) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
    }
    view = SummaryLocked(*rec);
  }
  if (!caller.Owns(view)) view.set_spec_yaml(RedactSpecEnv(view.spec_yaml()));
  // Reads of history never hold the lock.
  if (absl::Status filled = FillView(view, metric_history); !filled.ok()) return filled;
  return view;
}

std::vector<v1::Job> Coordinator::ListJobs(int limit) {
  absl::MutexLock lock(&mu_);
  std::vector<const JobRecord*> recs;
  for (const auto& [id, rec] : jobs_) recs.push_back(&rec);
  std::sort(recs.begin(), recs.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq > b->seq; });
  if (limit <= 0) limit = 100;
  std::vector<v1::Job> out;
  for (const JobRecord* rec : recs) {
    if (static_cast<int>(out.size()) >= limit) break;
    v1::Job view = SummaryLocked(*rec);  // No metrics: no hub (or SQLite) reads per job.
    view.clear_spec_yaml();
    out.push_back(std::move(view));
  }
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& job_id, const Caller& caller) {
  v1::Job view;
  StoreWriter::Ticket ticket;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    JobRecord* rec = FindLocked(job_id);
    if (rec == nullptr) {
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
    }
    if (!caller.Owns(rec->job)) {
      return NotOwned(caller, rec->job, "cancel",
                      "a user cancels only the jobs it submitted (an admin token cancels any)");
    }
    auto delta = ddp::Cancel(*rec, clock_->Now());
    if (!delta.ok()) return delta.status();
    ApplyLocked(*rec, *delta, touched);
    DDP_LOG(INFO) << "job " << job_id << " cancelled"
                  << (caller.name.empty() ? "" : " by " + caller.name);
    ScheduleLocked(touched);  // Its slots free up once its trainers are gone.
    ticket = writer_.last_staged();
    view = SummaryLocked(*rec);
  }
  // Answered once stored: an acknowledged cancel survives a crash.
  if (absl::Status st = writer_.Wait(ticket); !st.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "job ", job_id, " is cancelled, but the coordinator could not store that yet (",
        st.message(), "); it keeps retrying: check the coordinator's --state-dir"));
  }
  FillView(view, false).IgnoreError();  // Without history it cannot fail.
  return view;
}

}  // namespace ddp
