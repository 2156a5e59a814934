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

namespace ddp {

struct TorchrunEnv {
  int rank = 0;              // RANK: global rank, 0..WORLD_SIZE-1.
  int local_rank = 0;        // LOCAL_RANK: rank on this node; picks cuda:LOCAL_RANK.
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE: ranks on this node.
  int group_rank = 0;        // GROUP_RANK: this node's index in the job.
  std::string master_addr;   // MASTER_ADDR: rank 0's host; its TCPStore listens here.
  int master_port = 0;       // MASTER_PORT
  int events_fd = -1;        // DDP_EVENTS_FD, or -1 for stdout.
  // GLOO_SOCKET_IFNAME (PyTorch's own variable): the interface Gloo binds to.
  std::string gloo_socket_ifname;
  // OMP_NUM_THREADS (torchrun sets it): intra-op threads unless train.threads says.
  int omp_num_threads = 0;
  // DDP_JOB_ID (set by ddp-worker; "local" otherwise): replaces {job_id} in
  // checkpoint.dir, so a job's restarts share a checkpoint and new jobs start fresh;
  // recorded in checkpoints, whose resume another job id is refused.
  std::string job_id = "local";
  // DDP_ATTEMPT (set by ddp-worker; 0 otherwise): with the job id, it scopes the
  // rendezvous keys in the store, so a straggler of another job or attempt that
  // reaches this store can never join this group.
  int attempt = 0;
  // DDP_NODE (set by ddp-worker to the worker's name; the host name otherwise): this
  // node's name, which replaces {node} in checkpoint.dir and is recorded in checkpoints.
  std::string node;
  // DDP_DEBUG_CHECKPOINT_STALL (debugging and tests only; -1 when unset): when a
  // writer saves the checkpoint of this global step, it stops halfway through the
  // temporary file, says so on stderr, and waits to be killed, so a kill during a
  // save can be staged.
  int64_t debug_checkpoint_stall = -1;
};

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
