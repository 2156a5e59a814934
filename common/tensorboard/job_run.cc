#include "common/tensorboard/job_run.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp::tensorboard {
namespace {

double Seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

}  // namespace

void AddStep(const v1::RankMetrics& m, EventFile* file) {
  const double t = Seconds(m.update_ms());
  const std::string rank = absl::StrCat("/rank", m.rank());
  const int64_t step = m.global_step();
  file->Scalar(t, step, "loss" + rank, static_cast<float>(m.loss()));
  file->Scalar(t, step, "samples_per_s" + rank, static_cast<float>(m.samples_per_s()));
  file->Scalar(t, step, "step_time_ms" + rank, static_cast<float>(m.step_ms()));
  file->Scalar(t, step, "comm_time_ms" + rank, static_cast<float>(m.comm_ms()));
}

void AddEpoch(const v1::EpochSummary& e, EventFile* file) {
  const double t = Seconds(e.time_ms());
  file->Scalar(t, e.epoch(), "epoch/train_loss", static_cast<float>(e.train_loss()));
  if (!std::isnan(e.val_loss())) {
    file->Scalar(t, e.epoch(), "epoch/val_loss", static_cast<float>(e.val_loss()));
  }
  if (!std::isnan(e.val_accuracy())) {
    file->Scalar(t, e.epoch(), "epoch/val_accuracy", static_cast<float>(e.val_accuracy()));
  }
}

void AddAttempt(const v1::Job& job, const v1::Attempt& a, EventFile* file) {
  file->Text(Seconds(a.start_ms() > 0 ? a.start_ms() : job.submit_ms()), a.number(), "attempts",
             AttemptText(job, a));
}

void AddRecovery(int attempt, const v1::Recovery& r, EventFile* file) {
  file->Text(Seconds(r.start_ms()), r.global_step(), "recoveries", RecoveryText(attempt, r));
}

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

absl::Status MakeDirectories(const std::string& path) {
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

bool IsRunName(const std::string& job_id) {
  return !job_id.empty() && job_id.find('/') == std::string::npos && job_id[0] != '.';
}

}  // namespace ddp::tensorboard
