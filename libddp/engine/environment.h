// The launch environment of a rank (common/contract/environment.h), read and checked.
//
// The engine reads exactly torchrun's variables (and ddp's own), so both
//   ddp-worker (which sets them per local rank) and
//   torchrun --no-python --nproc_per_node=2 ddp-trainer --spec job.yaml
// launch ddp-trainer and any libddp program. No LibTorch here; the public
// ddp::read_environment() is this, throwing.
#ifndef DDP_LIBDDP_ENGINE_ENVIRONMENT_H_
#define DDP_LIBDDP_ENGINE_ENVIRONMENT_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/contract/environment.h"

namespace ddp {

// Reads the variables through `getenv` (injectable for tests). Errors are
// INVALID_ARGUMENT and name the variable: "WORLD_SIZE: expected an integer >= 1, got 'x'".
// RANK/WORLD_SIZE/MASTER_* are required; LOCAL_* and GROUP_RANK default to a single
// node (LOCAL_RANK = RANK, LOCAL_WORLD_SIZE = WORLD_SIZE, GROUP_RANK = 0).
absl::StatusOr<Environment> ReadEnvironment(
    const std::function<std::optional<std::string>(const char*)>& getenv);
// The process environment.
absl::StatusOr<Environment> ReadEnvironment();

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_ENVIRONMENT_H_
