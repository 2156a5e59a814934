// Workers: registration, heartbeats (liveness + desired state), trainer reports and
// failure detection.
#include <signal.h>
#include <string.h>

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "coordinator/coordinator.h"

namespace ddp {
namespace {

int64_t Millis(absl::Time t) { return absl::ToUnixMillis(t); }

std::string DescribeExit(const v1::RankAssignment& r) {
  if (r.signal() != 0) {
    const char* name = sigabbrev_np(r.signal());
    return absl::StrCat("was killed by SIG", name ? name : std::to_string(r.signal()));
  }
  return absl::StrCat("exited with code ", r.exit_code(),
                      r.exit_code() == kExitPermanent ? " (permanent error)" : "");
}

bool Failed(const v1::RankAssignment& r) {
  return r.exited() && (r.exit_code() != 0 || r.signal() != 0);
}

bool FailedPermanently(const v1::RankAssignment& r) {
  return Failed(r) && r.signal() == 0 && !IsRetryableExit(r.exit_code());
}

// The failed rank that decides an attempt's fate: a permanent failure anywhere (a
// restart cannot cure it, whichever rank failed first), else the first in rank order.
const v1::RankAssignment* DecidingFailure(const v1::Attempt& a) {
  const v1::RankAssignment* decider = nullptr;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (!Failed(r)) continue;
    if (decider == nullptr || (FailedPermanently(r) && !FailedPermanently(*decider))) {
      decider = &r;
    }
  }
  return decider;
}

std::string FailureReason(const v1::RankAssignment& r) {
  std::string reason = absl::StrCat("rank ", r.rank(), " on ", r.worker(), " ", DescribeExit(r));
  if (!r.error().empty()) absl::StrAppend(&reason, ": ", r.error());
  return reason;
}

}  // namespace

void Coordinator::PersistWorkerLocked(const WorkerRecord& worker) {
  absl::Status st = store_->SaveWorker(worker.info);
  if (!st.ok()) DDP_LOG(ERROR) << "persisting worker " << worker.info.name() << ": " << st;
}

absl::StatusOr<Coordinator::WorkerRecord*> Coordinator::CheckWorkerLocked(
    const std::string& name, const std::string& incarnation) {
  auto it = workers_.find(name);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", name, "' is not registered: register first"));
  }
  if (it->second.info.incarnation() != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale worker: '", name, "' incarnation ", incarnation,
        " was replaced by incarnation ", it->second.info.incarnation(),
        " (another ddp-worker registered under this name)"));
  }
  return &it->second;
}

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::RegisterRequest& req) {
  if (req.worker().empty()) return absl::InvalidArgumentError("worker: a name is required");
  if (req.incarnation().empty()) {
    return absl::InvalidArgumentError("incarnation: required (a random id per agent start)");
  }
  if (req.slots() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots: must be >= 1 (got ", req.slots(), ")"));
  }
  if (req.address().empty()) return absl::InvalidArgumentError("address: required");
  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  auto [it, inserted] = workers_.try_emplace(req.worker());
  WorkerRecord& w = it->second;
  if (!inserted && w.info.incarnation() != req.incarnation()) {
    DDP_LOG(WARNING) << "worker " << req.worker() << " restarted (incarnation "
                     << w.info.incarnation() << " -> " << req.incarnation() << ")";
    FailAttemptsOnWorkerLocked(
        req.worker(),
        absl::StrCat("worker ", req.worker(), " restarted: its trainers are gone"), touched);
    w.reported.clear();
    w.dispatched.clear();
    w.last_batch_seq = 0;
  }
  if (inserted || w.info.incarnation() != req.incarnation()) {
    w.info.set_registered_ms(Millis(now));
    DDP_LOG(INFO) << "worker " << req.worker() << " registered: " << req.slots() << " slots at "
                  << req.address() << " (incarnation " << req.incarnation() << ")";
  }
  w.info.set_name(req.worker());
  w.info.set_incarnation(req.incarnation());
  w.info.set_address(req.address());
  w.info.set_hostname(req.hostname());
  w.info.set_slots(req.slots());
  w.info.set_gpus(req.gpus());
  w.info.set_last_heartbeat_ms(Millis(now));
  w.last_seen = now;
  w.alive = true;
  w.confirmed = true;
  PersistWorkerLocked(w);
  v1::RegisterResponse resp;
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  resp.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout));
  resp.set_rpc_deadline_ms(absl::ToInt64Milliseconds(options_.rpc_deadline));
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  auto w = CheckWorkerLocked(req.worker(), req.incarnation());
  if (!w.ok()) return w.status();
  WorkerRecord& worker = **w;
  const absl::Time now = clock_->Now();
  if (!worker.alive) DDP_LOG(INFO) << "worker " << req.worker() << " is back";
  worker.alive = true;
  worker.confirmed = true;
  worker.last_seen = now;
  worker.info.set_last_heartbeat_ms(Millis(now));
  worker.free_ports.assign(req.free_ports().begin(), req.free_ports().end());
  // What the worker reports now accounts for its trainers: a task handed out earlier
  // is either among them or was never received (a lost reply).
  worker.reported.assign(req.tasks().begin(), req.tasks().end());
  worker.dispatched.clear();
  for (const v1::TaskStatus& t : req.tasks()) ApplyTaskStatusLocked(req.worker(), t, touched);
  ScheduleLocked(touched);
  std::set<TaskKey> has;
  for (const v1::TaskStatus& t : req.tasks()) has.insert({t.job_id(), t.attempt()});
  v1::HeartbeatResponse resp;
  for (auto& task : DesiredTasksLocked(req.worker())) {
    const TaskKey key{task.job_id(), task.attempt()};
    if (!has.count(key)) worker.dispatched[key] = task.ranks_size();
    *resp.add_tasks() = std::move(task);
  }
  return resp;
}

void Coordinator::ApplyTaskStatusLocked(const std::string& worker, const v1::TaskStatus& status,
                                        TouchList& touched) {
  JobRecord* rec = FindLocked(status.job_id());
  if (rec == nullptr || status.attempt() < 1 || status.attempt() > rec->job.attempts_size()) {
    return;  // Unknown to us (retention, or a wiped state dir): the worker drops it.
  }
  v1::Attempt* a = rec->job.mutable_attempts(status.attempt() - 1);
  bool changed = false;
  for (const v1::LocalRankStatus& s : status.ranks()) {
    for (v1::RankAssignment& r : *a->mutable_ranks()) {
      if (r.rank() != s.rank() || r.worker() != worker) continue;
      if (r.pid() != s.pid() || r.exited() != s.exited() || r.exit_code() != s.exit_code() ||
          r.signal() != s.signal()) {
        r.set_pid(s.pid());
        r.set_exited(s.exited());
        r.set_exit_code(s.exit_code());
        r.set_signal(s.signal());
        changed = true;
      }
    }
  }
  const bool active = a == ActiveAttempt(*rec);
  if (active && !status.error().empty()) {
    FailAttemptLocked(*rec, absl::StrCat("worker ", worker, " could not start trainers: ",
                                         status.error()),
                      /*retryable=*/false, touched);
    return;
  }
  if (!active) {
    if (!changed) return;
    // The job is waiting to restart after this attempt failed, and one of its ranks
    // now turns out to have failed permanently: no restart can cure that.
    const v1::RankAssignment* decider = DecidingFailure(*a);
    if (a->number() == rec->job.attempts_size() && !IsTerminal(rec->job.state()) &&
        ActiveAttempt(*rec) == nullptr && decider != nullptr && FailedPermanently(*decider)) {
      rec->gathering = false;
      rec->job.set_restarts(std::max(0, rec->job.restarts() - 1));  // It never happened.
      rec->job.set_state(v1::FAILED);
      rec->job.set_reason(FailureReason(*decider));
      rec->job.set_end_ms(Millis(clock_->Now()));
      DDP_LOG(WARNING) << "job " << rec->job.id() << " failed: " << rec->job.reason()
                       << " (no restart after a permanent error)";
    }
    PersistLocked(*rec, touched);  // Shows the stopped trainers' exits.
    return;
  }
  // A failed rank fails the attempt; a permanent failure decides whether to restart.
  if (const v1::RankAssignment* r = DecidingFailure(*a)) {
    FailAttemptLocked(*rec, FailureReason(*r), /*retryable=*/!FailedPermanently(*r), touched);
    return;
  }
  bool all_up = true, all_done = true;
  for (const v1::RankAssignment& r : a->ranks()) {
    all_up = all_up && r.pid() != 0;
    all_done = all_done && r.exited();
  }
  const int64_t now = Millis(clock_->Now());
  if (all_done) {
    a->set_state(v1::SUCCEEDED);
    a->set_reason(absl::StrCat("all ", a->world_size(), " ranks exited 0"));
    a->set_end_ms(now);
    rec->job.set_state(v1::SUCCEEDED);
    rec->job.set_reason(a->reason());
    if (rec->job.start_ms() == 0) rec->job.set_start_ms(now);  // Never seen RUNNING.
    rec->job.set_end_ms(now);
    DDP_LOG(INFO) << "job " << rec->job.id() << " succeeded";
    changed = true;
  } else if (all_up && a->state() == v1::RENDEZVOUS) {
    a->set_state(v1::RUNNING);
    rec->job.set_state(v1::RUNNING);
    rec->job.set_reason(absl::StrCat("attempt ", a->number(), ": ", a->world_size(),
                                     " ranks running"));
    if (rec->job.start_ms() == 0) rec->job.set_start_ms(now);
    changed = true;
  }
  if (changed) PersistLocked(*rec, touched);
}

void Coordinator::FailAttemptsOnWorkerLocked(const std::string& worker, const std::string& reason,
                                             TouchList& touched) {
  for (auto& [id, rec] : jobs_) {
    v1::Attempt* a = ActiveAttempt(rec);
    if (a == nullptr) continue;
    for (const auto& r : a->ranks()) {
      if (r.worker() == worker) {
        FailAttemptLocked(rec, reason, /*retryable=*/true, touched);
        break;
      }
    }
  }
}

void Coordinator::ExpireLocked(TouchList& touched) {
  const absl::Time now = clock_->Now();
  for (auto& [name, w] : workers_) {
    if (!w.alive || now - w.last_seen <= options_.heartbeat_timeout) continue;
    w.alive = false;
    const std::string reason =
        absl::StrFormat("worker %s lost: no heartbeat for %.1fs", name,
                        absl::ToDoubleSeconds(now - w.last_seen));
    DDP_LOG(WARNING) << reason;
    FailAttemptsOnWorkerLocked(name, reason, touched);
    w.reported.clear();  // Its trainers died with it, or will be told to stop.
  }
}

absl::Status Coordinator::ReportEvents(const v1::ReportEventsRequest& req) {
  std::vector<v1::ReportedEvent> known;  // Events of jobs we have (not being deleted).
  {
    TouchList touched(hub_);
    absl::MutexLock lock(&mu_);
    auto w = CheckWorkerLocked(req.worker(), req.incarnation());
    if (!w.ok()) return w.status();
    WorkerRecord& worker = **w;
    if (req.batch_seq() > 0) {
      if (req.batch_seq() <= worker.last_batch_seq) {
        DDP_LOG(INFO) << "worker " << req.worker() << " re-sent batch " << req.batch_seq()
                      << ", already applied: dropped";
        return absl::OkStatus();
      }
      worker.last_batch_seq = req.batch_seq();
    }
    if (req.dropped() > 0) {
      DDP_LOG(WARNING) << "worker " << req.worker() << " dropped " << req.dropped()
                       << " events it could not deliver";
    }
    int unknown = 0;
    for (const v1::ReportedEvent& ev : req.events()) {
      JobRecord* rec = FindLocked(ev.job_id());
      if (rec == nullptr || rec->retiring) {
        ++unknown;  // Deleted (retention) or never ours: nowhere to keep it.
        continue;
      }
      known.push_back(ev);
      // A trainer's `error` event explains its exit: keep it in the rank table.
      if (!ev.has_event() || ev.event().type() != "error") continue;
      if (ev.attempt() < 1 || ev.attempt() > rec->job.attempts_size()) continue;
      for (v1::RankAssignment& r : *rec->job.mutable_attempts(ev.attempt() - 1)->mutable_ranks()) {
        if (r.rank() == ev.rank()) r.set_error(ev.event().message());
      }
      PersistLocked(*rec, touched);
    }
    if (unknown > 0) {
      DDP_LOG(INFO) << "worker " << req.worker() << " reported " << unknown
                    << " event(s) of unknown jobs: dropped";
    }
  }
  if (!known.empty()) hub_->Ingest(known);
  return absl::OkStatus();
}

std::vector<v1::Worker> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Worker> out;
  for (auto& [name, w] : workers_) {
    v1::Worker info = w.info;
    info.set_alive(w.alive);
    info.set_free_slots(w.alive ? std::max(0, FreeSlotsLocked(w)) : 0);
    for (auto& [id, rec] : jobs_) {
      v1::Attempt* a = ActiveAttempt(rec);
      if (a == nullptr) continue;
      for (const auto& r : a->ranks()) {
        if (r.worker() == name) {
          info.add_jobs(id);
          break;
        }
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace ddp
