// `ddpctl tensorboard JOB DIR`: the job's stored history as a TensorBoard run.
//
// DIR/JOB/events.out.tfevents.ddpctl holds, from GetJob with the metric history,
// every stored point under the tags of common/tensorboard/job_run.h (those the
// coordinator's --tensorboard-dir writes as points arrive). The file is written whole
// and renamed over the previous export, so exporting again (a running job) replaces it.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "common/tensorboard/event_file.h"
#include "common/tensorboard/job_run.h"

namespace ddp {
namespace {

double Seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

}  // namespace

int Tensorboard(CtlContext& ctx, const std::string& job_id, const std::string& dir) {
  if (dir.empty()) {
    *ctx.err << "ddpctl tensorboard: DIR must not be empty\n";
    return kCtlUsage;
  }
  // What `ddpctl get --history` shows.
  auto fetched = FetchJob(ctx, job_id, /*history=*/true);
  if (!fetched.ok()) return ReportError(ctx, fetched.status(), job_id);
  const v1::Job& job = *fetched;

  tensorboard::EventFile file(Seconds(job.submit_ms()));
  std::set<int> ranks;
  int64_t first_step = 0, last_step = 0;
  for (const v1::RankMetrics& m : job.history()) {
    tensorboard::AddStep(m, &file);
    const int64_t step = m.global_step();
    if (ranks.empty()) first_step = last_step = step;
    first_step = std::min(first_step, step);
    last_step = std::max(last_step, step);
    ranks.insert(m.rank());
  }
  for (const v1::EpochSummary& e : job.epoch_history()) tensorboard::AddEpoch(e, &file);
  int recoveries = 0;
  for (const v1::Attempt& a : job.attempts()) {
    tensorboard::AddAttempt(job, a, &file);
    for (const v1::Recovery& r : a.recoveries()) {
      tensorboard::AddRecovery(a.number(), r, &file);
      ++recoveries;
    }
  }

  // One directory per job under DIR: the id must stay one path component.
  if (!tensorboard::IsRunName(job.id())) {
    *ctx.err << "ddpctl: the coordinator answered with a job id unfit for a directory name: '"
             << job.id() << "'\n";
    return kCtlFailed;
  }
  const std::string run_dir = absl::StrCat(dir, "/", job.id());
  const std::string path = run_dir + "/events.out.tfevents.ddpctl";
  if (absl::Status made = tensorboard::MakeDirectories(run_dir); !made.ok()) {
    *ctx.err << "ddpctl: " << made.message() << "\n";
    return kCtlFailed;
  }
  if (absl::Status w = file.Write(path); !w.ok()) {
    *ctx.err << "ddpctl: " << w.message() << ": check the directory is writable\n";
    return kCtlFailed;
  }
  *ctx.out << "wrote " << path << ": " << job.history_size() << " points of " << ranks.size()
           << " rank(s)";
  if (!ranks.empty()) *ctx.out << " (global steps " << first_step << "-" << last_step << ")";
  *ctx.out << ", " << job.epoch_history_size() << " epoch(s), " << job.attempts_size()
           << " attempt(s), " << recoveries << " recovery(ies)\n"
           << "view it with: tensorboard --logdir " << dir << "\n";
  return kCtlOk;
}

}  // namespace ddp
