// The launch contract: the environment every rank process starts with, whether it is
// ddp-trainer or a user's own program (a `command:` job). One torch-free definition
// that the worker agent writes (LaunchEnvironment) and the trainer and libddp read
// (libddp/engine/environment.h), so no name is spelled twice.
//
// torchrun's names, with torchrun's meanings (torch.distributed.run, static
// rendezvous, one role):
//
//   RANK, LOCAL_RANK            global rank; rank on this node (0..LOCAL_WORLD_SIZE-1)
//   WORLD_SIZE                  ranks in the attempt
//   LOCAL_WORLD_SIZE            ranks on this node
//   GROUP_RANK, GROUP_WORLD_SIZE  this node's index; nodes in the attempt
//   ROLE_RANK, ROLE_WORLD_SIZE  = RANK, WORLD_SIZE (one role)
//   ROLE_NAME                   "default", as torchrun names its one role
//   MASTER_ADDR, MASTER_PORT    rank 0's host and the port its store listens on
//   TORCHELASTIC_RESTART_COUNT  restarts of the job so far (0 on the first attempt)
//   TORCHELASTIC_MAX_RESTARTS   the job's max_restarts
//   TORCHELASTIC_RUN_ID         the job's rdzv_id
//   TORCHELASTIC_USE_AGENT_STORE  "False": rank 0's own init_process_group hosts the
//                               store on MASTER_PORT (no agent store to reuse)
//   OMP_NUM_THREADS             1 unless the job's env sets it (torchrun's default);
//                               the built-in trainer gets the node's cores / slots
//
// and ddp's own:
//
//   DDP_EVENTS_FD   the descriptor of the events pipe (JSON lines, docs/command-jobs.md)
//   DDP_JOB_ID, DDP_ATTEMPT, DDP_NODE   the job, the attempt (1, 2, ...), the worker
//
// CUDA_VISIBLE_DEVICES is the worker's (one GPU per rank, or none on a GPU node).
#ifndef DDP_COMMON_CONTRACT_LAUNCH_ENV_H_
#define DDP_COMMON_CONTRACT_LAUNCH_ENV_H_

#include <map>
#include <string>
#include <vector>

namespace ddp {
namespace env {

inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";
inline constexpr char kOpenblasNumThreads[] = "OPENBLAS_NUM_THREADS";
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
inline constexpr char kEventsFd[] = "DDP_EVENTS_FD";
inline constexpr char kJobId[] = "DDP_JOB_ID";
inline constexpr char kAttempt[] = "DDP_ATTEMPT";
inline constexpr char kNode[] = "DDP_NODE";
// Live recovery (docs/recovery.md): the attempt's generation this process was started
// for (0: its first processes), and the file where the worker announces each new
// generation to running ranks: one line "GENERATION MASTER_ADDR MASTER_PORT",
// replaced atomically.
inline constexpr char kGeneration[] = "DDP_GENERATION";
inline constexpr char kGenerationFile[] = "DDP_GENERATION_FILE";
// The checkpoint-now notice: a file with one line "SEQ DEADLINE_MS REASON" (SEQ 0: no
// notice yet; DEADLINE_MS the Unix time in ms when the ranks will be stopped, 0 if
// unknown), replaced atomically whenever the coordinator raises a new notice.
inline constexpr char kNoticeFile[] = "DDP_NOTICE_FILE";
// The rank's flight recorder (common/contract/flight_recorder.h): a file the rank
// maps and its worker reads at each heartbeat.
inline constexpr char kFlightRecorder[] = "DDP_FLIGHT_RECORDER";
// Seconds between SIGTERM to a rank and its SIGKILL when its worker stops it (the
// job's stop_grace_s within the worker's --stop-grace).
inline constexpr char kStopGrace[] = "DDP_STOP_GRACE_S";

// torchrun's single role's name.
inline constexpr char kDefaultRoleName[] = "default";
// The descriptor number the agent gives the events pipe in every rank process.
inline constexpr int kEventsFdNumber = 3;

}  // namespace env

// What one rank process is told. Filled by the agent from its task.
struct RankLaunch {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;  // rdzv_id
  std::string job_id;
  int attempt = 0;
  std::string node;    // Empty: DDP_NODE is not set.
  int events_fd = env::kEventsFdNumber;
};

// The contract variables for one rank, by name: the list above, less
// OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES (they depend on the job and the node), and
// DDP_NODE only when `node` is set.
std::map<std::string, std::string> LaunchEnvironment(const RankLaunch& launch);

// Every name LaunchEnvironment sets: a job's `env` may not set them (a rank would
// be told the wrong thing about its place in the job).
const std::vector<std::string>& ContractEnvNames();

}  // namespace ddp

#endif  // DDP_COMMON_CONTRACT_LAUNCH_ENV_H_
