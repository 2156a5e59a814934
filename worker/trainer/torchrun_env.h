// The torchrun environment contract of ddp-trainer (design.md), parsed and checked.
//
// The trainer reads exactly torchrun's variables, so both
//   ddp-worker (which sets them per local rank) and
//   torchrun --no-python --nproc_per_node=2 ddp-trainer --spec job.yaml
// launch it. No LibTorch here.
#ifndef DDP_WORKER_TRAINER_TORCHRUN_ENV_H_
#define DDP_WORKER_TRAINER_TORCHRUN_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ddp/environment.h"

namespace ddp {

// The struct is libddp's public ddp::Environment (<ddp/environment.h>): one
// definition for the library's users and the trainer.
using TorchrunEnv = Environment;

// Reads the variables through `getenv` (injectable for tests). Errors are
// INVALID_ARGUMENT and name the variable: "WORLD_SIZE: expected an integer >= 1, got 'x'".
// RANK/WORLD_SIZE/MASTER_* are required; LOCAL_* and GROUP_RANK default to a single
// node (LOCAL_RANK = RANK, LOCAL_WORLD_SIZE = WORLD_SIZE, GROUP_RANK = 0).
absl::StatusOr<TorchrunEnv> ReadTorchrunEnv(
    const std::function<std::optional<std::string>(const char*)>& getenv);
// The process environment.
absl::StatusOr<TorchrunEnv> ReadTorchrunEnv();

}  // namespace ddp

#endif  // DDP_WORKER_TRAINER_TORCHRUN_ENV_H_
