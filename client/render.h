// What ddpctl prints: pure functions from protos to text, so the output is tested
// without a terminal or a coordinator.
#ifndef DDP_CLIENT_RENDER_H_
#define DDP_CLIENT_RENDER_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// A left-aligned text table; the first row is the header.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);
// "45s", "3m07s", "2h05m".
std::string HumanDuration(absl::Duration d);
// "12,345".
std::string WithThousands(double value);
// "[██████░░░░] 60%"
std::string ProgressBar(double fraction, int width);
const char* StateName(v1::JobState state);

// Estimates training speed from successive watch updates (global steps of rank 0
// over wall time, smoothed) for the ETA.
class ProgressEstimator {
 public:
  void Observe(const v1::Job& job, absl::Time now);
  // Fraction of all epochs done, 0..1; negative when unknown.
  double Fraction(const v1::Job& job) const;
  // Remaining time; negative when unknown.
  absl::Duration Eta(const v1::Job& job) const;

 private:
  int64_t last_step_ = -1;
  absl::Time last_time_;
  double steps_per_s_ = 0;
};

// The live per-rank table `ddpctl watch` redraws on a terminal.
std::vector<std::string> RenderWatch(const v1::Job& job, const ProgressEstimator& progress,
                                     absl::Time now, bool color);
// One plain line per rank whose metrics changed since `previous` (non-TTY watch).
std::vector<std::string> RenderWatchLines(const v1::Job& job, const v1::Job* previous,
                                          absl::Time now);
// `ddpctl get`.
std::string RenderJob(const v1::Job& job, absl::Time now);
// `ddpctl diagnose`: the latest attempt's state and reason, and per rank what its flight
// recorder said at its worker's last heartbeat (decision 193): the phase and for how
// long, the last collective entered, and how long the one in flight has waited; for an
// ended attempt, `stopped`: the lines its workers logged for the ranks they stopped;
// `stacks`: each rank's latest stacks its worker logged (decision 194), and the STACK
// column from RankAssignment.stack while it runs.
std::string RenderDiagnosis(const v1::Job& job, const std::vector<v1::LogLine>& stopped,
                            const std::vector<v1::LogLine>& stacks = {});
// `ddpctl list`.
std::string RenderJobList(const std::vector<v1::Job>& jobs, absl::Time now);
// `ddpctl workers`.
// "pool=team-a,slurm_job=1234" (key order), "-" for none: worker labels, a job's
// node_selector.
std::string LabelCell(const google::protobuf::Map<std::string, std::string>& labels);
std::string RenderWorkers(const std::vector<v1::Worker>& workers, absl::Time now);
// "3 workers: 2 alive, 1 lost; 4 slots, 3 free; 1 busy".
std::string RenderWorkerSummary(const v1::WorkerSummary& summary);
// The STATE cell of a worker: alive, lost or quarantined, then ",cordoned",
// ",draining" or ",drained" (draining with no jobs left) for one in maintenance.
std::string WorkerState(const v1::Worker& worker);
// What a cordon, drain or uncordon made of the worker and the jobs on it, in a sentence.
std::string DescribeMaintenance(const v1::Worker& worker);
// One warning per worker whose version differs from the coordinator's (none when either
// is unknown).
std::vector<std::string> WorkerVersionWarnings(const std::vector<v1::Worker>& workers,
                                               const std::string& coordinator_version);
// `ddpctl logs`: "[rank 1] text" (prefix omitted when only one rank is shown).
std::string RenderLogLine(const v1::LogLine& line, bool with_rank);

}  // namespace ddp

#endif  // DDP_CLIENT_RENDER_H_
