// The facade's monitoring side: the numbers events give, kept under the lock, and
// the scrape-time view (coordinator_metrics.h).
#include "coordinator/core/coordinator_metrics.h"

#include <algorithm>
#include <utility>

#include "coordinator/core/coordinator.h"

namespace ddp {

BucketHistogram::BucketHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void BucketHistogram::Observe(double value) {
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[i];
  ++count_;
  sum_ += value;
}

std::vector<double> HeartbeatLagBounds() {
  return {0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30};
}

std::vector<double> RendezvousBounds() { return {0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300}; }

void Coordinator::NoteMetricsLocked(const JobRecord& rec, const JobDelta& delta) {
  if (delta.attempt_rows.empty()) return;  // No attempt changed state.
  const std::string& id = rec.job.id();
  const v1::Attempt* active = ActiveAttempt(rec);
  // Live recoveries: the attempts this delta wrote whose last recovery began or ended
  // just now (its start or end is the delta's time).
  const int64_t now_ms = absl::ToUnixMillis(clock_->Now());
  for (int n : delta.attempt_rows) {
    const v1::Attempt& a = rec.job.attempts(n - 1);
    if (a.recoveries_size() == 0) continue;
    const v1::Recovery& r = a.recoveries(a.recoveries_size() - 1);
    if (r.start_ms() == now_ms && r.end_ms() == 0) ++recoveries_started_;
    if (r.end_ms() == now_ms) {
      ++recoveries_ended_[r.outcome() == "recovered" ? "recovered" : "failed"];
    }
  }
  if (delta.formed && active != nullptr) {
    if (active->number() > 1) ++restarts_total_;
    rendezvous_started_[{id, active->number()}] = clock_->Now();
  }
  if (delta.ended_attempt != 0) rendezvous_started_.erase({id, delta.ended_attempt});
  if (active != nullptr && active->state() == v1::RUNNING) {
    auto it = rendezvous_started_.find({id, active->number()});
    if (it != rendezvous_started_.end()) {
      rendezvous_times_.Observe(absl::ToDoubleSeconds(clock_->Now() - it->second));
      rendezvous_started_.erase(it);
    }
  }
}

CoordinatorMetrics Coordinator::Metrics() {
  CoordinatorMetrics out;
  // (job id, attempt) of the running jobs, for the hub afterwards.
  std::vector<std::pair<std::string, int>> running;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s != v1::JOB_STATE_UNSPECIFIED) out.jobs[static_cast<v1::JobState>(s)] = 0;
  }
  {
    absl::MutexLock lock(&mu_);
    out.workers = registry_.Summary();
    out.heartbeat_lag = heartbeat_lag_;
    out.rendezvous = rendezvous_times_;
    out.job_restarts = restarts_total_;
    const int stretch = BeatStretchLocked();
    out.heartbeat_interval = options_.heartbeat_interval * stretch;
    out.heartbeat_timeout = options_.heartbeat_timeout * stretch;
    out.recoveries_started = recoveries_started_;
    out.recoveries_ended = recoveries_ended_;
    for (const auto& [name, w] : registry_.workers()) {
      if (w.info.labels().empty()) continue;
      out.worker_labels[name] = {w.info.labels().begin(), w.info.labels().end()};
    }
    for (const auto& [id, rec] : jobs_) {
      if (rec.retiring) continue;
      ++out.jobs[rec.job.state()];
      const v1::Attempt* a = ActiveAttempt(rec);
      if (rec.job.state() != v1::RUNNING || a == nullptr) continue;
      running.emplace_back(id, a->number());
      for (const v1::RankAssignment& r : a->ranks()) {
        CoordinatorMetrics::Rank& rank = out.ranks.emplace_back();
        rank.job_id = id;
        rank.rank = r.rank();
        rank.worker = r.worker();
        const WorkerRecord* w = r.gpu_uuid().empty() ? nullptr : registry_.Find(r.worker());
        if (const v1::GpuUsage* u = w ? w->GpuUsageOf(r.gpu_uuid()) : nullptr) {
          rank.gpu_utilization_pct = u->utilization_percent();
        }
      }
    }
  }
  // Latest metrics from the hub, off the coordinator's lock. out.ranks is in (job,
  // rank table) order, as `running`.
  size_t next = 0;
  for (const auto& [id, attempt] : running) {
    v1::Job view;
    hub_->Fill(id, attempt, &view);
    for (; next < out.ranks.size() && out.ranks[next].job_id == id; ++next) {
      CoordinatorMetrics::Rank& rank = out.ranks[next];
      for (const v1::RankMetrics& m : view.metrics()) {
        if (m.rank() != rank.rank || m.attempt() != attempt) continue;
        rank.has_metrics = true;
        rank.metrics = m;
      }
    }
  }
  return out;
}

}  // namespace ddp
