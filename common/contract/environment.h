// ddp::Environment: the launch environment of one rank, torchrun's variables and ddp's.
//
// ddp-worker sets them for every rank it starts (command jobs and ddp-trainer alike;
// common/contract/launch_env.h names them), and so does `torchrun --no-python`. A
// contract type: torch-free, defined here once. The engine reads it
// (libddp/engine/environment.h); libddp publishes this same file as
// <ddp/contract/environment.h>, which <ddp/environment.h> includes.
#ifndef DDP_CONTRACT_ENVIRONMENT_H_
#define DDP_CONTRACT_ENVIRONMENT_H_

#include <cstdint>
#include <string>

namespace ddp {

struct Environment {
  int rank = 0;              // RANK: global rank, 0..WORLD_SIZE-1.
  int local_rank = 0;        // LOCAL_RANK: rank on this node; picks cuda:LOCAL_RANK.
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE: ranks on this node.
  int group_rank = 0;        // GROUP_RANK: this node's index in the job.
  std::string master_addr;   // MASTER_ADDR: rank 0's host; its TCPStore listens here.
  int master_port = 0;       // MASTER_PORT
  int events_fd = -1;        // DDP_EVENTS_FD: where events go, or -1 (none / stdout).
  // GLOO_SOCKET_IFNAME (PyTorch's own variable): the interface Gloo binds to.
  std::string gloo_socket_ifname;
  // OMP_NUM_THREADS (torchrun sets it): intra-op threads; 0 when unset.
  int omp_num_threads = 0;
  // DDP_JOB_ID (set by ddp-worker; "local" otherwise): replaces {job_id} in checkpoint
  // directories and is recorded in checkpoints, whose resume another job id refuses.
  std::string job_id = "local";
  // DDP_ATTEMPT (set by ddp-worker), else TORCHELASTIC_RESTART_COUNT (torchrun), else
  // 0: with the job id, it scopes the rendezvous keys, so a straggler of another job or
  // attempt can never join (and torchrun's store, which outlives a restart, holds no
  // stale keys for the next one).
  int attempt = 0;
  // TORCHELASTIC_USE_AGENT_STORE=True (torchrun's static rendezvous): torchrun's agent
  // already hosts the store on MASTER_PORT, so rank 0 connects to it instead of hosting
  // one. ddp-worker sets False.
  bool use_agent_store = false;
  // DDP_NODE (the worker's name; the host name otherwise): replaces {node} in
  // checkpoint directories.
  std::string node;
  // DDP_DEBUG_CHECKPOINT_STALL (tests only; -1 when unset): a writer stops halfway
  // through the checkpoint of this global step and waits to be killed.
  int64_t debug_checkpoint_stall = -1;
  // Live recovery (DDP_GENERATION, DDP_GENERATION_FILE; set by ddp-worker): the
  // attempt's generation this process was started for (> 0: a replacement, which takes
  // its state from a surviving rank), and the file where the worker announces later
  // generations ("" outside ddp-worker: no live recovery).
  int generation = 0;
  std::string generation_file;
  // DDP_NOTICE_FILE (set by ddp-worker): where the checkpoint-now notice appears
  // ("" outside ddp-worker: none ever does).
  std::string notice_file;
  // DDP_FLIGHT_RECORDER (set by ddp-worker): the file this rank keeps its flight recorder
  // in, for its worker to read (common/contract/flight_recorder.h); "" outside
  // ddp-worker: the recorder stays in memory.
  std::string flight_recorder;
};

}  // namespace ddp

#endif  // DDP_CONTRACT_ENVIRONMENT_H_
