// ddp-trainer's training loop: one rank of a data-parallel job.
//
// Lifecycle (Run):
//   load data (docs/trainer.md's split) -> seed train.seed, build model -> rendezvous + process
//   group -> broadcast parameters and buffers from rank 0 -> optimizer -> resume from
//   the newest checkpoint any rank holds (CheckpointKeeper) -> for each epoch:
//   DistributedSampler order, steps of grad_accum_steps micro-batches (gradients
//   all-reduced by GradientReducer, overlapped with backward), validation reduced
//   across ranks, checkpoints kept by every node's writer -> `done`.
// Everything observable goes out as events (events.h). Errors are returned as
// statuses; ClassifyFailure() (failure.h) tells the ones a restart cannot cure and
// the ones that are this node's fault.
#ifndef DDP_TRAINER_TRAINER_H_
#define DDP_TRAINER_TRAINER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/jobspec/job_spec.h"
#include "common/contract/events.h"
#include "libddp/engine/failure.h"
#include "libddp/engine/environment.h"

namespace ddp {

class TrainerImpl;

// The intervals of a whole run for train.lr_schedule's t_max 0: epochs, or optimizer
// steps (epochs x steps per epoch, capped by max_steps when it is > 0).
int64_t ScheduleIntervals(const LrSchedule& schedule, int64_t epochs, int64_t steps_per_epoch,
                          int64_t max_steps);

class Trainer {
 public:
  Trainer(JobSpec spec, Environment env, EventSink* events);
  ~Trainer();
  // Trains to the end (train.epochs, or train.max_steps). Never throws: LibTorch and
  // c10d exceptions come back as statuses.
  absl::Status Run();

 private:
  std::unique_ptr<TrainerImpl> impl_;
};

}  // namespace ddp

#endif  // DDP_TRAINER_TRAINER_H_
