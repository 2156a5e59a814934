// What the coordinator counts for monitoring, in plain types (no Prometheus here:
// coordinator/metrics.h exports it). The coordinator keeps the few numbers that only
// events can give (heartbeat gaps, rendezvous times, restarts) under its lock, at the
// cost of a few integer operations per event; everything else (workers and jobs by
// state, the running ranks' latest metrics) is read when a scrape asks for it, so
// nothing on the heartbeat path updates a metric that nobody reads.
#ifndef DDP_COORDINATOR_CORE_COORDINATOR_METRICS_H_
#define DDP_COORDINATOR_CORE_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// A histogram over fixed upper bounds (an implicit +Inf bucket last). Not
// thread-safe: its owner's lock guards it.
class BucketHistogram {
 public:
  explicit BucketHistogram(std::vector<double> bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket, not cumulative: bounds().size() + 1 entries, the last for +Inf.
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Bounds in seconds of ddp_heartbeat_lag_seconds (the gap between two heartbeats
// of a worker: the heartbeat interval when all is well) and ddp_rendezvous_seconds
// (from an attempt's forming to its last trainer up).
std::vector<double> HeartbeatLagBounds();
std::vector<double> RendezvousBounds();

// One scrape's view of the coordinator.
struct CoordinatorMetrics {
  v1::WorkerSummary workers;
  std::map<v1::JobState, int64_t> jobs;  // Every state, zeros included.
  BucketHistogram heartbeat_lag{HeartbeatLagBounds()};
  BucketHistogram rendezvous{RendezvousBounds()};
  int64_t job_restarts = 0;  // Attempts formed after a job's first, since start.
  // What workers are told now: the configured heartbeat interval and timeout, times
  // the rate scaling's factor (decisions 162, 164; 1 below the rate).
  absl::Duration heartbeat_interval;
  absl::Duration heartbeat_timeout;
  int64_t recoveries_started = 0;                      // Live recoveries begun.
  std::map<std::string, int64_t> recoveries_ended;  // By outcome: recovered, failed.
  // Each rank of each RUNNING job, with its latest metrics of the running attempt
  // (has_metrics false until its first step event).
  struct Rank {
    std::string job_id;
    int32_t rank = 0;
    std::string worker;
    bool has_metrics = false;
    v1::RankMetrics metrics;
    std::optional<double> gpu_utilization_pct;  // Its GPU's, per its worker's NVML.
  };
  std::vector<Rank> ranks;
  // The labels of each registered worker that has any (--label), by worker name.
  std::map<std::string, std::map<std::string, std::string>> worker_labels;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_COORDINATOR_METRICS_H_
