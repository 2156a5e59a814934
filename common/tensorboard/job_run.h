// What a job's TensorBoard run holds, point by point: the one description of its tags,
// shared by `ddpctl tensorboard` (the stored history, written whole) and the
// coordinator's --tensorboard-dir (each point as it is stored), so both read the same.
//
//   loss/rankR, samples_per_s/rankR, step_time_ms/rankR, comm_time_ms/rankR
//       each step point of each rank (every attempt), against the global step;
//   epoch/train_loss, epoch/val_loss, epoch/val_accuracy
//       each epoch's summary (rank 0's, reduced over the ranks), against the epoch;
//   attempts (text, at the attempt's number)   how each attempt ran and ended;
//   recoveries (text, at the global step)      each live recovery.
// Wall times are when the coordinator received each point (an attempt: its start).
#ifndef DDP_COMMON_TENSORBOARD_JOB_RUN_H_
#define DDP_COMMON_TENSORBOARD_JOB_RUN_H_

#include <string>

#include "absl/status/status.h"
#include "common/tensorboard/event_file.h"
#include "ddp/v1/types.pb.h"

namespace ddp::tensorboard {

void AddStep(const v1::RankMetrics& m, EventFile* file);
void AddEpoch(const v1::EpochSummary& e, EventFile* file);
void AddAttempt(const v1::Job& job, const v1::Attempt& a, EventFile* file);
void AddRecovery(int attempt, const v1::Recovery& r, EventFile* file);

// "attempt 2: FAILED, world size 2, 3.5 s (rank 1 exited 1); restart 1 of job x".
std::string AttemptText(const v1::Job& job, const v1::Attempt& a);
std::string RecoveryText(int attempt, const v1::Recovery& r);

// mkdir -p: UNAVAILABLE naming the directory it could not make, or the path that is
// not a directory.
absl::Status MakeDirectories(const std::string& path);

// Whether `job_id` can name a run's directory: one path component, not hidden.
bool IsRunName(const std::string& job_id);

}  // namespace ddp::tensorboard

#endif  // DDP_COMMON_TENSORBOARD_JOB_RUN_H_
