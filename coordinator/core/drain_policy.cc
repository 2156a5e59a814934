#include "coordinator/core/drain_policy.h"

#include "absl/strings/str_cat.h"

namespace ddp {

bool ResumesFromCheckpoints(const JobSpec& spec) {
  return spec.is_command() ||
         (!spec.checkpoint.dir.empty() && spec.checkpoint.resume != ResumePolicy::kNo);
}

bool ResumesFromPeriodicCheckpoints(const JobSpec& spec) {
  if (spec.is_command()) return true;
  const CheckpointSpec& c = spec.checkpoint;
  return ResumesFromCheckpoints(spec) && (c.every_steps > 0 || c.every_epochs > 0);
}

std::optional<std::string> MoveNowReason(const std::string& worker, v1::DrainPolicy policy,
                                         const JobSpec& spec, const v1::Attempt& attempt) {
  switch (policy) {
    case v1::DRAIN_WAIT:
      return std::nullopt;
    case v1::DRAIN_NOW:
      return absl::StrCat("worker ", worker, " is draining now: restarting elsewhere",
                          spec.is_command() ? " (the program resumes from its own "
                                              "checkpoints, if it keeps any)"
                          : !ResumesFromCheckpoints(spec)
                              ? " from the start (it resumes from no checkpoint)"
                              : " from the last checkpoint");
    default:  // DRAIN_AT_CHECKPOINT
      if (attempt.state() != v1::RUNNING) {
        // Still starting: nothing to lose by moving at once.
        return absl::StrCat("worker ", worker, " is draining: moving before its trainers started");
      }
      return std::nullopt;  // After its next checkpoint, or never.
  }
}

bool MovesAtCheckpoint(const JobSpec& spec, const v1::TrainerEvent::Checkpoint& checkpoint) {
  if (!ResumesFromPeriodicCheckpoints(spec)) return false;
  // A program's epochs are its own: any checkpoint it reports is one to move at.
  if (spec.is_command()) return true;
  // The checkpoint taken as the job finishes: nothing would be left to train elsewhere.
  const TrainSpec& train = spec.train;
  return checkpoint.epoch() < train.epochs &&
         !(train.max_steps > 0 && checkpoint.global_step() >= train.max_steps);
}

std::string MoveAtCheckpointReason(const std::string& worker,
                                   const v1::TrainerEvent::Checkpoint& checkpoint) {
  return absl::StrCat("worker ", worker,
                      " is draining: moving to other workers from the checkpoint of global step ",
                      checkpoint.global_step());
}

}  // namespace ddp
