// The facade's time-driven work: heartbeat expiry, quarantines ending, start deadlines,
// last-call windows and retention. Each costs what is due, not a scan of the cluster.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "coordinator/core/coordinator.h"

namespace ddp {

std::optional<std::vector<std::string>> Coordinator::Housekeep() {
  TouchList touched(hub_);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const std::string& name : registry_.Expire(now)) {
    const WorkerRecord* w = registry_.Find(name);
    const std::string reason =
        absl::StrFormat("worker %s lost: no heartbeat for %.1fs", name,
                        absl::ToDoubleSeconds(now - w->last_seen));
    DDP_LOG(WARNING) << reason;
    FailAttemptsOnWorkerLocked(name, reason, touched, /*lost=*/true);
    schedule_dirty_ = true;  // The cluster shrank: a queued job may no longer fit.
  }
  for (const std::string& name : registry_.LiftQuarantines(now)) {
    DDP_LOG(INFO) << "worker " << name << ": quarantine over";
    schedule_dirty_ = true;  // Capacity came back.
  }
  for (const auto& [id, attempt] : start_deadlines_.Due(now)) {
    JobRecord* rec = FindLocked(id);
    const v1::Attempt* a = rec == nullptr ? nullptr : ActiveAttempt(*rec);
    if (a == nullptr || a->number() != attempt) continue;  // Long since decided.
    ApplyLocked(*rec, TimeOutRendezvous(*rec, now), touched);
  }
  for (const auto& [id, attempt] : recovery_deadlines_.Due(now)) {
    JobRecord* rec = FindLocked(id);
    const v1::Attempt* a = rec == nullptr ? nullptr : ActiveAttempt(*rec);
    if (a == nullptr || a->number() != attempt || !Recovering(*a)) continue;
    if (now < rec->recovery_deadline) {  // A later recovery of the same attempt.
      recovery_deadlines_.Add(rec->recovery_deadline, id, attempt);
      continue;
    }
    std::vector<std::string> missing;
    for (const v1::RankAssignment& r : a->ranks()) {
      if (r.pid() == 0) missing.push_back(absl::StrCat(r.rank()));
    }
    ApplyLocked(*rec,
                FailRecovery(*rec,
                             absl::StrFormat("not done within recovery_timeout_s (%gs)%s",
                                             rec->spec.recovery_timeout_s,
                                             missing.empty()
                                                 ? ""
                                                 : absl::StrCat(": rank(s) ",
                                                                ListSome(missing),
                                                                " never started")),
                             now),
                touched);
  }
  for (const auto& [id, attempt] : preempt_deadlines_.Due(now)) {
    JobRecord* rec = FindLocked(id);
    const v1::Attempt* a = rec == nullptr ? nullptr : ActiveAttempt(*rec);
    // Moved already (after its checkpoint), or no longer needed.
    if (a == nullptr || a->number() != attempt || rec->preempt_for.empty()) continue;
    if (now < rec->preempt_deadline) continue;  // Unmarked and marked again: a later one.
    rec->preempt_deadline = absl::InfiniteFuture();
    PreemptForPriorityLocked(
        *rec,
        absl::StrFormat("job %s (higher priority) needs its nodes; no checkpoint within its "
                        "preemption_notice_s (%gs), so from its last one",
                        rec->preempt_for, rec->spec.preemption_notice_s),
        touched);
    schedule_dirty_ = true;
  }
  CheckStallsLocked(now, touched);
  for (const auto& [seq, job] : queue_.jobs()) {
    if (job->gathering && now >= job->window_end) schedule_dirty_ = true;  // Last call over.
  }
  ScheduleLocked(touched);
  task_waiters_.Expire(now);
  if (now - last_retention_ < absl::Minutes(1)) return std::nullopt;
  last_retention_ = now;
  // Jobs past retention stop being written (ApplyLocked skips them, their events are
  // dropped) until the store has deleted them and they are erased.
  std::vector<FinishedJob> finished;
  for (const auto& [id, rec] : jobs_) {
    if (IsTerminal(rec.job.state()) && !rec.retiring) {
      finished.push_back({id, rec.job.end_ms(), rec.seq});
    }
  }
  std::vector<std::string> retired =
      JobsPastRetention(std::move(finished), store_->retention().retain_jobs);
  for (const std::string& id : retired) jobs_[id].retiring = true;
  return retired;
}

void Coordinator::CheckStallsLocked(absl::Time now, TouchList& touched) {
  if (!stall_checks_.Due(now)) return;
  for (const std::string& id : stall_checks_.watched()) {
    JobRecord* rec = FindLocked(id);
    const v1::Attempt* a = rec == nullptr ? nullptr : ActiveAttempt(*rec);
    if (a == nullptr || a->state() != v1::RUNNING || !rec->stall.armed()) {
      stall_checks_.Unwatch(id);  // Ended (a new attempt re-arms it with its steps).
      continue;
    }
    const absl::Duration timeout =
        rec->stall.Timeout(rec->spec.train.stall_timeout_s, rec->spec.train.collective_timeout_s);
    if (!rec->stall.Suspected(now, timeout)) {
      rec->stall.AskedStacks(0, absl::InfinitePast());  // Progress again: a later stall asks anew.
      continue;
    }
    // A stopped rank's agent says so with its next heartbeat: wait that long before
    // blaming a rank that may only be waiting for it (at the interval the agents are
    // told, decision 162).
    const absl::Duration beat = options_.heartbeat_interval * BeatStretchLocked();
    std::optional<StallWatch::Stall> stall = rec->stall.Find(now, timeout, 2 * beat);
    // Before the attempt ends, its ranks' stacks (decision 194): they show where the
    // culprit is, and they are what tells it when its program keeps no flight
    // recorder. A stopped process's stack says nothing more than that it is stopped.
    if (!(stall.has_value() && stall->stopped)) {
      if (rec->stall.asked_seq() == 0) {
        const int seq = RequestStacksLocked(*rec);
        rec->stall.AskedStacks(seq, now + StallWatch::kStackWait + 2 * beat);
        DDP_LOG(INFO) << "job " << rec->job.id() << " attempt " << a->number()
                      << ": a rank is silent past the stall timeout ("
                      << absl::FormatDuration(timeout) << "); taking the ranks' stacks (capture "
                      << seq << ") before naming it";
        continue;
      }
      if (!rec->stall.StacksIn(rec->stall.asked_seq()) && now < rec->stall.asked_until()) {
        continue;
      }
      stall = rec->stall.Find(now, timeout, 2 * beat);
    }
    if (!stall.has_value()) continue;
    const std::string& worker = a->ranks(stall->rank).worker();
    const std::string reason = absl::StrFormat(
        "rank %d on %s stalled: no progress for %.1fs (stall timeout %s%s)%s", stall->rank,
        worker, absl::ToDoubleSeconds(stall->silent), absl::FormatDuration(timeout),
        rec->spec.train.stall_timeout_s <= 0 ? ", learned"
        : rec->spec.is_command()             ? ", stall_timeout_s"
                                             : ", train.stall_timeout_s",
        stall->stopped ? "; its process is stopped (SIGSTOP or a debugger)" : "") +
        rec->stall.Explain(*stall, now);
    DDP_LOG(WARNING) << "job " << rec->job.id() << ": " << reason;
    ApplyLocked(*rec, FailAttempt(*rec, reason, /*retryable=*/true, now), touched);
  }
}

void Coordinator::Tick() {
  std::optional<std::vector<std::string>> due = Housekeep();
  if (!due.has_value()) return;
  const std::vector<std::string> retired = *std::move(due);
  // The deletes (by job id, and each over-long job's oldest output by row id) run on
  // the store writer after every row staged before, without the coordinator's lock:
  // heartbeats and watchers carry on meanwhile.
  absl::Notification deleted;
  absl::Status st;
  writer_.EnforceRetention(retired, [&](const absl::Status& s) {
    st = s;
    deleted.Notify();
  });
  deleted.WaitForNotification();
  if (!st.ok()) DDP_LOG(ERROR) << "retention: " << st << " (retrying in a minute)";
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : retired) {
      if (st.ok()) {
        jobs_.erase(id);
      } else if (JobRecord* rec = FindLocked(id)) {
        rec->retiring = false;
      }
    }
  }
  if (!st.ok()) return;
  for (const std::string& id : retired) hub_->Forget(id);
  if (!retired.empty()) {
    DDP_LOG(INFO) << "retention: deleted " << retired.size() << " finished job(s)";
  }
}

}  // namespace ddp
