// The checkpoint's schema: TrainingState, everything a resumed run needs, and its one
// encoding, a torch.save-compatible file (torch::pickle_save of a dict):
//
//   format        "ddp.checkpoint/2" (files of format 1, without the identity keys,
//                 are read too)
//   job, job_id, attempt, node
//                 who wrote it: the job's name, its id (DDP_JOB_ID), the attempt
//                 (DDP_ATTEMPT) and the node (DDP_NODE); a run of another job id
//                 refuses to resume it unless checkpoint.resume is `force`
//   model         {name: tensor}, parameters and buffers without any wrapper prefix:
//                 Python: module.load_state_dict(torch.load(p)["model"])
//   optimizer     torch.optim state_dict layout (optimizer.h)
//   epoch, step   where training resumes: `step` optimizer steps of `epoch` are done
//   global_step   optimizer steps done in total
//   world_size, batch_size, grad_accum_steps, seed, shuffle
//                 the sampler's inputs: with them the resumed run replays the same
//                 data order from the same position
//   train_samples, data_seed
//                 the training set the order was drawn over
//   epoch_loss_sum, epoch_steps
//                 mid-epoch: the epoch's step losses so far, summed over ranks
//   epoch_samples_done
//                 mid-epoch: how many positions of the epoch's order (the sampler's
//                 shuffled indices) the whole job has trained on
//   epoch_order_offset, epoch_order_step
//                 where the epoch's present sharding began: at position offset of the
//                 order and at that step of the epoch (0, 0 unless an earlier world of
//                 another size trained the epoch's first samples: decision 191)
//   rng_state     rank 0's CPU generator state
//
// trainer.cc fills a TrainingState and uses the one it gets back; only this file
// knows the keys. Where the bytes are kept is checkpoint_store.h's business.
#ifndef DDP_LIBDDP_ENGINE_CHECKPOINT_H_
#define DDP_LIBDDP_ENGINE_CHECKPOINT_H_

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract/position.h"
#include "libddp/engine/named_tensor.h"

namespace ddp {

inline constexpr char kCheckpointFormat[] = "ddp.checkpoint/2";

// The inputs of the data order (DistributedSampler and the batching over it).
struct SamplerState {
  int64_t world_size = 1;
  int64_t batch_size = 1;
  int64_t grad_accum_steps = 1;
  int64_t seed = 0;
  bool shuffle = true;
  int64_t train_samples = -1;  // -1: unknown (format 1 files may lack it).
  int64_t data_seed = -1;      // -1: unknown.
};

// Whether a run with sampler `now` replays the data order of a checkpoint taken with
// `saved` (unknown values in `saved` are taken to match).
bool SameDataOrder(const SamplerState& saved, const SamplerState& now);

// Whether the epochs' orders are the same permutations (seed, shuffle, training set):
// then a run of another world size, batch size or accumulation can go on from the
// samples a checkpoint's epoch has consumed (decision 191).
bool SamePermutation(const SamplerState& saved, const SamplerState& now);


// Who wrote a checkpoint.
struct CheckpointIdentity {
  std::string job;     // The job's name.
  std::string job_id;  // Empty in format 1 files.
  int64_t attempt = 0;
  std::string node;
};

// How an epoch's order is sharded (decision 191): from position `offset` of the epoch's
// order on, over the present world, starting at step `first_step` of the epoch.
// {0, 0}: the whole epoch, as DistributedSampler shards it.
struct EpochOrder {
  int64_t offset = 0;
  int64_t first_step = 0;
};

struct TrainingState {
  CheckpointIdentity identity;
  Position position;
  SamplerState sampler;
  EpochOrder order;
  // Positions of the epoch's order trained on at `position` (informative: a resume
  // computes it from `order`, `position` and `sampler`; files before it lack it).
  int64_t epoch_samples_done = 0;
  // Mid-epoch: the epoch's step losses so far and their count, summed over ranks.
  double epoch_loss_sum = 0;
  int64_t epoch_steps = 0;
  std::vector<NamedTensor> model;  // Parameters, then buffers; on the CPU.
  c10::IValue optimizer;           // torch.optim's state_dict layout.
  // With train.lr_schedule: {"name", "interval", "last_epoch" (the scheduler's count),
  // "base_lrs", "_last_lr"}, as torch.optim.lr_scheduler names them. Informative: a
  // resume recomputes the lr from the position. None otherwise (and not written).
  c10::IValue lr_scheduler;
  at::Tensor rng_state;            // Undefined when the file has none.
};

// Positions of `state`'s epoch order that the job had trained on at its position.
int64_t SamplesDone(const TrainingState& state);

std::vector<char> EncodeCheckpoint(const TrainingState& state);
// INVALID_ARGUMENT for a file that is not a ddp checkpoint or lacks a key, naming
// `path` and the key and saying what to do.
absl::StatusOr<TrainingState> DecodeCheckpoint(const std::vector<char>& bytes,
                                               const std::string& path);

// Copies the checkpoint's model into `named` (the live model's parameters and
// buffers). INVALID_ARGUMENT naming the tensor when it belongs to another model.
absl::Status RestoreModel(const TrainingState& state, const std::vector<NamedTensor>& named,
                          const std::string& path);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_CHECKPOINT_H_
