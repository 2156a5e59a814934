// `ddp-coordinator --mlflow-uri URI` (or a job's `tracking: {mlflow: ...}`): every
// such job is an MLflow run, kept up to date through the tracking server's REST API.
//
//   run          one per job, named after the job id, in the experiment named by
//                tracking.mlflow.experiment (default: the job's name); found again by
//                its `ddp.job_id` tag after a coordinator restart or takeover
//   parameters   job.yaml flattened (train.optimizer.lr = 0.01), never its `env`
//   tags         ddp.job_id, ddp.owner (and mlflow.user), ddp.attempt (the latest)
//   metrics      the tags of ddpctl tensorboard (loss/rankR, samples_per_s/rankR,
//                step_time_ms/rankR, comm_time_ms/rankR at the global step;
//                epoch/train_loss, epoch/val_loss, epoch/val_accuracy at the epoch),
//                with the time the coordinator received each point
//   status       FINISHED, FAILED or KILLED once the job ends and its points are in
//
// Off the coordinator's paths, as the TensorBoard writer: an EventHub sink that
// queues what the store took and which jobs changed; one thread of its own talks to
// the servers, log-batch by log-batch (at most 1,000 metrics each). A server that is
// away (no connection, a timeout, 429, 5xx) is retried with back-off (0.5 s doubling
// to 30 s) and its points are kept meanwhile, in order, up to `max_points` in all
// (past that new points are dropped, counted and logged; the store still has them).
// A refusal that no retry cures (a 4xx) drops that call's points, logged.
//
// Catching up: before it sends a run's first point, the tracker reads the job's stored
// history and sends what the run lacks: per metric, the points past those the run
// already holds (a run of a job whose first coordinator stopped with points queued, or
// dropped them), in the store's order; live points the history already had are sent
// once. A coordinator that starts (restarted, or taken over) looks at every job that
// has not ended or ended within `catch_up_window` (Resume): their runs get what was
// queued when the last one stopped, and their end. A run that is no longer RUNNING was
// ended with all its points: it is left alone (decision 182).
#ifndef DDP_COORDINATOR_TRACKING_MLFLOW_TRACKER_H_
#define DDP_COORDINATOR_TRACKING_MLFLOW_TRACKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/tracking/mlflow_client.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

class MlflowTracker : public EventHub::Sink {
 public:
  // Where a job's run goes; uri "" for a job that is not tracked.
  struct Target {
    std::string uri;
    std::string experiment;
  };
  struct Options {
    size_t max_points = 1'000'000;         // Kept for servers that are away.
    absl::Duration timeout = absl::Seconds(10);   // Per request.
    absl::Duration min_backoff = absl::Milliseconds(500);
    absl::Duration max_backoff = absl::Seconds(30);
    // Ended jobs a starting coordinator still looks at (Resume's caller).
    absl::Duration catch_up_window = absl::Hours(24);
  };
  // A job as GetJob answers it (attempts, owner, spec_yaml), and its target. Both
  // are called on the tracker's thread.
  using JobLookup = std::function<absl::StatusOr<v1::Job>(const std::string& job_id)>;
  using Resolve = std::function<absl::StatusOr<Target>(const v1::Job& job)>;
  // The job's stored step metrics and epochs (GetJob's metric history), in the store's
  // order: attempt, then step. Called on the tracker's thread.
  using HistoryLookup = std::function<absl::StatusOr<JobOutput>(const std::string& job_id)>;

  MlflowTracker(Options options, JobLookup lookup, Resolve resolve, HistoryLookup history);
  // Tries once more to send what is kept (servers that answer), then joins.
  ~MlflowTracker() override;
  MlflowTracker(const MlflowTracker&) = delete;
  MlflowTracker& operator=(const MlflowTracker&) = delete;

  // EventHub::Sink
  void Stored(const std::vector<JobOutput>& outputs) override;
  void Changed(const std::string& job_id) override;
  // A starting coordinator's jobs: each is looked at, and its run caught up.
  void Resume(const std::vector<std::string>& job_ids);

  struct Stats {
    int64_t sent = 0;      // Metric points the servers took.
    int64_t dropped = 0;   // Points dropped: over max_points, or refused by a server.
    int64_t kept = 0;      // Points waiting now.
    int64_t runs_ended = 0;
    int64_t errors = 0;    // Calls that failed (each retried or logged).
    int64_t caught_up = 0;  // Points from the store's history that runs lacked.
  };
  Stats stats();
  // Waits until nothing is queued or kept and no run waits to end, or `timeout`
  // passes; whether it got there (tests).
  bool WaitIdle(absl::Duration timeout);

 private:
  struct Item {
    std::vector<JobOutput> outputs;  // Stored points; or:
    std::string changed;             // A job that changed.
  };
  struct Run {
    bool looked_up = false;
    bool look_again = true;     // Changed since it was looked up.
    Target target;
    std::string owner;
    std::string run_name;
    int64_t submit_ms = 0;
    mlflow::KeyValues params;
    std::string run_id;
    bool found = false;         // run_id is a run made before (another coordinator's).
    bool caught_up = false;     // CatchUp done.
    // Per metric, the (time, step) of the history's last point: live points up to it
    // were in the history, and were sent from there.
    std::map<std::string, std::pair<int64_t, int64_t>> history_until;
    bool params_sent = false;
    int attempt = 0, attempt_tagged = 0;
    std::deque<mlflow::Metric> points;
    std::string end_status;     // FINISHED, FAILED, KILLED once the job ended.
    int64_t end_ms = 0;
    bool gone = false;          // Deleted, or not tracked and ended: forget it.
  };
  struct Server {
    std::unique_ptr<mlflow::Client> client;
    std::map<std::string, std::string> experiments;  // name -> id
    absl::Time next_try = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    bool away = false;  // Logged as away; logged again when it answers.
  };

  void Loop();
  // Moves what was queued into runs_ (false: stopping).
  bool Take(absl::Time wake);
  void Look(const std::string& job_id, Run& run);
  // Sends what `run` has for its server; false when the server is away.
  bool Send(const std::string& job_id, Run& run, Server& server);
  // Puts before `run`'s points what its history has and the run lacks (the class
  // comment); false when the server is away (tried again).
  bool CatchUp(const std::string& job_id, Run& run, Server& server);
  // Appends `o`'s points to `run`'s, less those its history had; the number left out.
  static int64_t AddLive(const JobOutput& o, Run& run);
  // Appends `points` to `run`'s but those up to its history_until; the number left out.
  static int64_t KeepNewerThanHistory(std::deque<mlflow::Metric> points, Run& run);
  // After a failed call: back off (UNAVAILABLE) or drop what it carried.
  bool Failed(Server& server, const absl::Status& status, const std::string& job_id);
  Server& ServerFor(const std::string& uri);

  const Options options_;
  const JobLookup lookup_;
  const Resolve resolve_;
  const HistoryLookup history_;

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  int64_t points_ ABSL_GUARDED_BY(mu_) = 0;  // Queued and kept.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;   // Runs have work left (WaitIdle).
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // The thread's own.
  std::map<std::string, Run> runs_;
  std::map<std::string, Server> servers_;

  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_TRACKING_MLFLOW_TRACKER_H_
