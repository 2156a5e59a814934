// ddp-trainer's training loop: one rank of a data-parallel job.
//
// Lifecycle (Run):
//   load data (design.md split) -> seed train.seed, build model -> rendezvous + process
//   group -> broadcast parameters and buffers from rank 0 -> optimizer -> resume from
//   the newest checkpoint any rank holds (CheckpointKeeper) -> for each epoch:
//   DistributedSampler order, steps of grad_accum_steps micro-batches (gradients
//   all-reduced by GradientReducer, overlapped with backward), validation reduced
//   across ranks, checkpoints kept by every node's writer -> `done`.
// Everything observable goes out as events (events.h). Errors are returned as
// statuses; ClassifyFailure() (failure.h) tells the ones a restart cannot cure and
// the ones that are this node's fault.
#ifndef DDP_WORKER_TRAINER_TRAINER_H_
#define DDP_WORKER_TRAINER_TRAINER_H_

#include <memory>

#include "absl/status/status.h"
#include "common/jobspec/job_spec.h"
#include "common/contract/events.h"
#include "worker/trainer/failure.h"
#include "worker/trainer/torchrun_env.h"

namespace ddp {

class TrainerImpl;

class Trainer {
 public:
  Trainer(JobSpec spec, TorchrunEnv env, EventSink* events);
  ~Trainer();
  // Trains to the end (train.epochs, or train.max_steps). Never throws: LibTorch and
  // c10d exceptions come back as statuses.
  absl::Status Run();

 private:
  std::unique_ptr<TrainerImpl> impl_;
};

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_TRAINER_H_
