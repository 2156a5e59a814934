// Node maintenance: an operator cordons, drains, uncordons or removes a worker
// (ddpctl workers cordon|drain|uncordon|rm). The state lives in the worker's record
// (v1::Worker.maintenance, stored with its row), so it survives coordinator and agent
// restarts; the registry counts a cordoned or draining worker out of capacity. What a
// drain does to the jobs running there is here: each moves by PreemptAttempt (back
// to PENDING without spending a restart) when the rules of drain_policy.h say so.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/utf8.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/drain_policy.h"

namespace ddp {
namespace {

const char* MaintenanceVerb(v1::WorkerMaintenance m) {
  switch (m) {
    case v1::WORKER_CORDONED: return "cordoned";
    case v1::WORKER_DRAINING: return "draining";
    default: return "uncordoned";
  }
}

}  // namespace

absl::StatusOr<WorkerRecord*> Coordinator::KnownWorkerLocked(const std::string& name) {
  WorkerRecord* w = registry_.Find(name);
  if (w == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no worker named '", name, "' (`ddpctl workers` lists them)"));
  }
  return w;
}

absl::StatusOr<v1::Worker> Coordinator::SetMaintenance(const std::string& name,
                                                       v1::WorkerMaintenance maintenance,
                                                       v1::DrainPolicy policy,
                                                       const Caller& caller) {
  if (!v1::WorkerMaintenance_IsValid(maintenance) || !v1::DrainPolicy_IsValid(policy)) {
    return absl::InvalidArgumentError("unknown maintenance state or drain policy");
  }
  v1::Worker view;
  StoreWriter::Ticket ticket;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<WorkerRecord*> known = KnownWorkerLocked(name);
    if (!known.ok()) return known.status();
    WorkerRecord* w = *known;
    if (registry_.SetMaintenance(*w, maintenance, policy, caller.name, clock_->Now())) {
      schedule_dirty_ = true;  // Capacity changed (shrank, or grew on an uncordon).
    }
    DDP_LOG(INFO) << "worker " << name << " " << MaintenanceVerb(maintenance)
                  << (maintenance == v1::WORKER_DRAINING
                          ? absl::StrCat(" (", v1::DrainPolicy_Name(policy), ")")
                          : "")
                  << (caller.name.empty() ? "" : " by " + caller.name);
    if (maintenance == v1::WORKER_DRAINING) DrainNowLocked(*w, touched);
    writer_.PutWorker(w->info);
    ScheduleLocked(touched);
    ticket = writer_.last_staged();
    view = WorkerViewLocked(*w);
  }
  // Answered once stored, as Cancel: an acknowledged cordon survives a crash.
  if (absl::Status st = writer_.Wait(ticket); !st.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "worker ", name, " is ", MaintenanceVerb(maintenance),
        ", but the coordinator could not store that yet (", st.message(),
        "); it keeps retrying: check the coordinator's --state-dir"));
  }
  return view;
}

absl::Status Coordinator::RemoveWorker(const std::string& name) {
  StoreWriter::Ticket ticket;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<WorkerRecord*> known = KnownWorkerLocked(name);
    if (!known.ok()) return known.status();
    WorkerRecord* w = *known;
    if (w->alive) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", name, " is ",
          w->confirmed ? "alive" : "not yet checked in since this coordinator started",
          ": only a lost worker can be removed; drain it (`ddpctl workers drain ", name,
          "`), stop its ddp-worker, and remove it once `ddpctl workers` shows it lost"));
    }
    // A lost worker's attempts failed when it was lost; anything still assigned (an
    // attempt of a restored job) is restarted elsewhere first.
    ticket = ForgetWorkerLocked(*w, absl::StrCat("worker ", name, " was removed"), touched);
    DDP_LOG(INFO) << "worker " << name << " removed";
  }
  if (absl::Status st = writer_.Wait(ticket); !st.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "worker ", name, " is removed, but the coordinator could not store that yet (",
        st.message(), "); it keeps retrying: check the coordinator's --state-dir"));
  }
  return absl::OkStatus();
}

StoreWriter::Ticket Coordinator::ForgetWorkerLocked(WorkerRecord& w, const std::string& reason,
                                                    TouchList& touched) {
  const std::string name = w.info.name();
  FailAttemptsOnWorkerLocked(name, reason, touched);
  std::vector<TaskKey> keys;
  for (const auto& [key, task] : w.assigned) keys.push_back(key);
  for (const TaskKey& key : keys) registry_.Unassign(name, key);
  // An open long poll returns (its next heartbeat hears that the worker is unknown).
  task_waiters_.Changed(name, ++w.desired_version);
  registry_.Remove(name);  // `w` is gone from here on.
  ports_.Forget(name);
  const StoreWriter::Ticket ticket = writer_.RemoveWorker(name);
  schedule_dirty_ = true;  // A queued job may have waited on it, or turn unschedulable.
  ScheduleLocked(touched);
  return ticket;
}

absl::Status Coordinator::Leave(const v1::LeaveRequest& request) {
  StoreWriter::Ticket ticket;
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<WorkerRecord*> w = registry_.Check(request.worker(), request.incarnation());
    if (absl::IsNotFound(w.status())) return absl::OkStatus();  // Left already: idempotent.
    if (!w.ok()) return w.status();
    const std::string why = request.reason().empty() ? std::string("its agent stopped")
                                                     : request.reason().substr(
                                                           0, Utf8SafeCut(request.reason(), 256));
    ticket = ForgetWorkerLocked(**w, absl::StrCat("worker ", request.worker(), " left (", why, ")"),
                                touched);
    DDP_LOG(INFO) << "worker " << request.worker() << " left the cluster: " << why;
  }
  return writer_.Wait(ticket);
}

void Coordinator::DrainNowLocked(WorkerRecord& w, TouchList& touched) {
  const v1::DrainPolicy policy = w.info.drain_policy();
  if (policy == v1::DRAIN_WAIT) return;
  for (auto [rec, attempt] : ActiveJobsOnWorkerLocked(w.info.name())) {
    const v1::Attempt* a = ActiveAttempt(*rec);
    if (a == nullptr || a->number() != attempt) continue;
    std::optional<std::string> reason = MoveNowReason(w.info.name(), policy, rec->spec, *a);
    if (!reason.has_value()) {
      if (!ResumesFromPeriodicCheckpoints(rec->spec)) {
        DDP_LOG(INFO) << "worker " << w.info.name() << " is draining: job " << rec->job.id()
                      << " takes no periodic checkpoints to resume from, so it runs to its "
                         "end there";
      }
      // Moves after its next checkpoint (MoveAfterCheckpointLocked), asked for now.
      RaiseNoticeLocked(*rec, absl::StrCat("worker ", w.info.name(), " is draining"),
                        absl::InfinitePast());
      continue;
    }
    ApplyLocked(*rec, PreemptAttempt(*rec, *reason, clock_->Now()), touched);
  }
}

void Coordinator::MoveAfterCheckpointLocked(JobRecord& rec,
                                            const v1::TrainerEvent::Checkpoint& checkpoint,
                                            TouchList& touched) {
  const v1::Attempt* a = ActiveAttempt(rec);
  if (a == nullptr || !MovesAtCheckpoint(rec.spec, checkpoint)) return;
  if (!rec.preempt_for.empty()) {  // A higher-priority job waits for its nodes.
    PreemptForPriorityLocked(
        rec,
        absl::StrCat("job ", rec.preempt_for, " (higher priority) needs its nodes; moved after "
                     "the checkpoint at step ", checkpoint.global_step()),
        touched);
    ScheduleLocked(touched);
    return;
  }
  const TaskKey key{rec.job.id(), a->number()};
  if (!rec.stopping_worker.empty()) {
    ApplyLocked(rec,
                PreemptAttempt(rec,
                               absl::StrCat("worker ", rec.stopping_worker, " is stopping: ",
                                            "moving to other workers from the checkpoint of "
                                            "global step ", checkpoint.global_step()),
                               clock_->Now()),
                touched);
    ScheduleLocked(touched);
    return;
  }
  for (const std::string& name : registry_.draining_at_checkpoint()) {
    const WorkerRecord* w = registry_.Find(name);
    if (w == nullptr || !w->assigned.count(key)) continue;
    ApplyLocked(rec, PreemptAttempt(rec, MoveAtCheckpointReason(name, checkpoint), clock_->Now()),
                touched);
    ScheduleLocked(touched);
    return;
  }
}

void Coordinator::StoppingWorkerLocked(const std::string& worker, const std::string& why,
                                       absl::Duration grace, TouchList& touched) {
  const absl::Time now = clock_->Now();
  for (auto [rec, attempt] : ActiveJobsOnWorkerLocked(worker)) {
    const v1::Attempt* a = ActiveAttempt(*rec);
    if (a == nullptr || a->number() != attempt) continue;
    const std::string reason = absl::StrCat("worker ", worker, " is stopping (", why, ")");
    if (a->state() == v1::RUNNING && RaiseNoticeLocked(*rec, reason, now + grace)) {
      rec->stopping_worker = worker;
      continue;
    }
    ApplyLocked(*rec, FailAttempt(*rec, reason, /*retryable=*/true, now), touched);
  }
}

}  // namespace ddp
