// `ddpctl tensorboard JOB DIR`: the job's stored history as a TensorBoard run.
//
// DIR/JOB/events.out.tfevents.ddpctl holds, from GetJob with the metric history:
//   loss/rankR, samples_per_s/rankR, step_time_ms/rankR, comm_time_ms/rankR
//       every stored step of every rank (every attempt), against the global step;
//   epoch/train_loss, epoch/val_loss, epoch/val_accuracy
//       each epoch's summary (rank 0's, reduced over the ranks), against the epoch;
//   attempts (text, at the attempt's number)   how each attempt ran and ended;
//   recoveries (text, at the global step)      each live recovery.
// Wall times are when the coordinator received each point. The file is written whole
// and renamed over the previous export, so exporting again (a running job) replaces it.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "common/tensorboard/event_file.h"

namespace ddp {
namespace {

absl::Status MakeDirs(const std::string& path) {
  std::string sofar;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    sofar = path.substr(0, i);
    if (sofar.empty()) continue;
    if (::mkdir(sofar.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::UnavailableError(absl::StrCat("cannot create ", sofar, ": ", std::strerror(errno)));
    }
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat(path, " is not a directory"));
  }
  return absl::OkStatus();
}

double Seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

std::string AttemptText(const v1::Job& job, const v1::Attempt& a) {
  std::string text = absl::StrCat("attempt ", a.number(), ": ", v1::JobState_Name(a.state()),
                                  ", world size ", a.world_size());
  if (a.end_ms() > a.start_ms() && a.start_ms() > 0) {
    absl::StrAppend(&text, ", ", Seconds(a.end_ms() - a.start_ms()), " s");
  }
  if (a.preempted()) absl::StrAppend(&text, ", preempted");
  if (!a.reason().empty()) absl::StrAppend(&text, " (", a.reason(), ")");
  if (a.number() > 1) absl::StrAppend(&text, "; restart ", a.number() - 1, " of job ", job.id());
  return text;
}

std::string RecoveryText(int attempt, const v1::Recovery& r) {
  std::string text = absl::StrCat("attempt ", attempt, " recovery ", r.generation(), ": ranks ",
                                  absl::StrJoin(r.ranks(), ","), " replaced after ", r.cause(),
                                  "; ", r.outcome());
  if (r.outcome() == "recovered") {
    absl::StrAppend(&text, " from rank ", r.source_rank(), "'s state at global step ",
                    r.global_step());
  }
  return text;
}

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
    const double t = Seconds(m.update_ms());
    const std::string rank = absl::StrCat("/rank", m.rank());
    const int64_t step = m.global_step();
    file.Scalar(t, step, "loss" + rank, static_cast<float>(m.loss()));
    file.Scalar(t, step, "samples_per_s" + rank, static_cast<float>(m.samples_per_s()));
    file.Scalar(t, step, "step_time_ms" + rank, static_cast<float>(m.step_ms()));
    file.Scalar(t, step, "comm_time_ms" + rank, static_cast<float>(m.comm_ms()));
    if (ranks.empty()) first_step = last_step = step;
    first_step = std::min(first_step, step);
    last_step = std::max(last_step, step);
    ranks.insert(m.rank());
  }
  for (const v1::EpochSummary& e : job.epoch_history()) {
    const double t = Seconds(e.time_ms());
    file.Scalar(t, e.epoch(), "epoch/train_loss", static_cast<float>(e.train_loss()));
    if (!std::isnan(e.val_loss())) {
      file.Scalar(t, e.epoch(), "epoch/val_loss", static_cast<float>(e.val_loss()));
    }
    if (!std::isnan(e.val_accuracy())) {
      file.Scalar(t, e.epoch(), "epoch/val_accuracy", static_cast<float>(e.val_accuracy()));
    }
  }
  int recoveries = 0;
  for (const v1::Attempt& a : job.attempts()) {
    file.Text(Seconds(a.start_ms() > 0 ? a.start_ms() : job.submit_ms()), a.number(), "attempts",
              AttemptText(job, a));
    for (const v1::Recovery& r : a.recoveries()) {
      file.Text(Seconds(r.start_ms()), r.global_step(), "recoveries", RecoveryText(a.number(), r));
      ++recoveries;
    }
  }

  // One directory per job under DIR: the id must stay one path component.
  if (job.id().empty() || job.id().find('/') != std::string::npos || job.id()[0] == '.') {
    *ctx.err << "ddpctl: the coordinator answered with a job id unfit for a directory name: '"
             << job.id() << "'\n";
    return kCtlFailed;
  }
  const std::string run_dir = absl::StrCat(dir, "/", job.id());
  const std::string path = run_dir + "/events.out.tfevents.ddpctl";
  if (absl::Status made = MakeDirs(run_dir); !made.ok()) {
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
