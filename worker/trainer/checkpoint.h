// Checkpoints: written by rank 0 only, atomically, in PyTorch's own file format.
//
// <checkpoint.dir>/checkpoint.pt is a torch.save-compatible zip (torch::pickle_save)
// holding a dict:
//   format        "ddp.checkpoint/1"
//   model         {name: tensor}, parameters and buffers without any wrapper prefix:
//                 Python: module.load_state_dict(torch.load(p)["model"])
//   optimizer     torch.optim state_dict layout (optimizer.h)
//   epoch, step   where training resumes: `step` optimizer steps of `epoch` are done
//   global_step   optimizer steps done in total
//   world_size, batch_size, grad_accum_steps, seed, shuffle
//                 the sampler's inputs: with them the resumed run replays the same
//                 data order from the same position
//   rng_state     rank 0's CPU generator state
// Writes go to a temporary file that is fsync'ed and renamed over the old one, so a
// crash leaves either the previous checkpoint or the new one, never a torn file.
#ifndef DDP_WORKER_TRAINER_CHECKPOINT_H_
#define DDP_WORKER_TRAINER_CHECKPOINT_H_

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ddp {

inline constexpr char kCheckpointFormat[] = "ddp.checkpoint/1";
inline constexpr char kCheckpointFile[] = "checkpoint.pt";

struct TrainingPosition {
  int64_t epoch = 0;
  int64_t step = 0;  // Optimizer steps completed within `epoch`.
  int64_t global_step = 0;
};

struct SamplerState {
  int64_t world_size = 1;
  int64_t batch_size = 1;
  int64_t grad_accum_steps = 1;
  int64_t seed = 0;
  bool shuffle = true;
};

std::string CheckpointPath(const std::string& dir);

// Serializes a checkpoint dict (see above) to bytes.
std::vector<char> EncodeCheckpoint(const c10::IValue& dict);
// Writes bytes to <dir>/checkpoint.pt atomically, creating dir. UNAVAILABLE on I/O
// errors (a full disk is worth a retry elsewhere), with the path in the message.
absl::Status WriteFileAtomically(const std::string& path, const std::vector<char>& bytes);
// Reads a whole file. NOT_FOUND when it does not exist; UNAVAILABLE when it exists
// but cannot be read (permissions, I/O errors).
absl::StatusOr<std::vector<char>> ReadFileBytes(const std::string& path);
// Deletes the temporaries that writers of `path` killed mid-write left behind
// (<path>.tmp.<pid>). Only rank 0 writes, so at its start none is in use.
void RemoveStaleTemporaries(const std::string& path);
// Parses bytes into the checkpoint dict; INVALID_ARGUMENT for foreign or corrupt
// files, naming the path.
absl::StatusOr<c10::impl::GenericDict> DecodeCheckpoint(const std::vector<char>& bytes,
                                                        const std::string& path);

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_CHECKPOINT_H_
