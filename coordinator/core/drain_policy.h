// What a node drain does to the jobs running there (ddpctl workers drain): the rules,
// as pure functions over a job's spec and attempt. The facade
// (coordinator_maintenance.cc) finds the jobs and applies PreemptAttempt when a rule
// says move; the records stay job_lifecycle's.
//
//   DRAIN_NOW            every job moves at once, from its last checkpoint if any.
//   DRAIN_AT_CHECKPOINT  a job still starting moves at once (nothing to lose); a
//                        running one moves right after its next checkpoint, if it takes
//                        periodic checkpoints it resumes from, and runs to its end
//                        there otherwise. The checkpoint a job takes as it finishes is
//                        not one to move at.
//   DRAIN_WAIT           jobs run to their end there; only new ranks go elsewhere.
#ifndef DDP_COORDINATOR_CORE_DRAIN_POLICY_H_
#define DDP_COORDINATOR_CORE_DRAIN_POLICY_H_

#include <optional>
#include <string>

#include "common/jobspec/job_spec.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// Whether a restart of `spec` resumes from a checkpoint it took: a command job from
// its own (it reports them), a built-in one from its checkpoint directory unless it
// said `resume: false`.
bool ResumesFromCheckpoints(const JobSpec& spec);

// Whether `spec` takes checkpoints before its end that a restart resumes from: only
// then is there a "next checkpoint" to move the job at. A user's program keeps its
// own checkpoints and says when it wrote one, so a command job always may.
bool ResumesFromPeriodicCheckpoints(const JobSpec& spec);

// When `worker` starts draining with `policy`: the reason `attempt` (the job's active
// one) moves at once, or nullopt when it stays (until its next checkpoint, or its end).
std::optional<std::string> MoveNowReason(const std::string& worker, v1::DrainPolicy policy,
                                         const JobSpec& spec, const v1::Attempt& attempt);

// Whether a job draining at a checkpoint moves after `checkpoint`: it resumes from
// periodic checkpoints and this is not the one taken as the job finishes.
bool MovesAtCheckpoint(const JobSpec& spec, const v1::TrainerEvent::Checkpoint& checkpoint);
std::string MoveAtCheckpointReason(const std::string& worker,
                                   const v1::TrainerEvent::Checkpoint& checkpoint);

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_DRAIN_POLICY_H_
