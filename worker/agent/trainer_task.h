// The rank processes of one attempt on this node: one per local rank, ddp-trainer or
// the job's own program (launch_plan.h), started with torchrun's environment and
// supervised until they exit.
//
// Lifecycle: Start() spawns every local rank (each in its own process group, with
// PR_SET_PDEATHSIG so it dies with the agent) -> Poll() reaps exits -> Stop() sends
// SIGTERM to every process group and SIGKILL once the grace period is over (at once
// to a stopped process). Status() reports each rank's pid, exit, and whether its
// process is stopped (the coordinator's stall watchdog blames such a rank). A rank
// counts as exited only when its output pipes are drained too, so its last lines
// (the `error` event that explains a failure) are reported before its exit.
#ifndef DDP_WORKER_AGENT_TRAINER_TASK_H_
#define DDP_WORKER_AGENT_TRAINER_TASK_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "ddp/v1/worker_service.pb.h"
#include "common/jobspec/job_spec.h"
#include "worker/agent/launch_plan.h"
#include "worker/agent/output_pump.h"
#include "worker/agent/rank_ledger.h"
#include "worker/agent/stack_capture.h"

namespace ddp {

struct TrainerTaskOptions {
  std::string trainer_path;   // The ddp-trainer binary.
  std::string work_dir;       // Per-job files: <work_dir>/<job>/attempt-<n>/job.yaml.
  std::string node;           // The worker's name: DDP_NODE ({node} in checkpoint.dir).
  int threads_per_rank = 1;   // OMP_NUM_THREADS / OPENBLAS_NUM_THREADS default.
  absl::Duration stop_grace = absl::Seconds(10);
  // Canonical --allow-root directories; empty: jobs may use any path (job_sandbox.h).
  std::vector<std::string> allowed_roots;
  // The agent's variables trainers inherit (TrainerBaseEnv); nothing else is.
  std::map<std::string, std::string> base_env;
  // The node has GPUs: a rank without one of its own (a CPU task) is hidden from all
  // of them with CUDA_VISIBLE_DEVICES="", so it cannot touch another job's GPU.
  bool node_has_gpus = false;
  // --allow-exec: what command jobs may start (launch_plan.h).
  ExecPolicy exec;
  // Appended to command jobs' PYTHONPATH: the directory of ddp_report.py.
  std::string python_path;
  // The ranks' GLOO_SOCKET_IFNAME unless set (RankEnvOptions); empty: none.
  std::string gloo_socket_ifname;
  // Where each rank's process group is recorded while the task lives (rank_ledger.h);
  // null: not recorded.
  RankLedger* ledger = nullptr;
  // What takes the ranks' stacks when the coordinator asks (Task.stacks_seq).
  StackTools stacks;
};

// Whether process `pid` is stopped (SIGSTOP, a debugger: state T or t in
// /proc/PID/stat). False if it is gone or /proc cannot tell.
bool ProcessStopped(int pid);

class TrainerTask {
 public:
  // Spawns the task's ranks. On failure the task exists with error() set and no
  // processes; node_fault() tells whether another node could run it (a missing
  // workdir or binary, files it cannot write) or not (a task without ranks).
  static std::unique_ptr<TrainerTask> Start(const v1::Task& task, const TrainerTaskOptions& options,
                                            OutputPump* pump);
  ~TrainerTask();  // Kills whatever still runs.

  const v1::Task& task() const { return task_; }
  // The job runs its own program (a command job).
  bool command() const { return command_; }
  const std::string& error() const { return error_; }
  bool node_fault() const { return node_fault_; }
  // Reaps exited ranks and escalates a stop to SIGKILL after the grace period.
  // Returns true if some rank's reported state changed.
  bool Poll(absl::Time now);
  // SIGTERM now, SIGKILL at now + grace; a rank whose process is stopped (it could
  // not run its handler) gets SIGKILL at once. Idempotent.
  void Stop(absl::Time now);
  // The same with another grace than the task's.
  void Stop(absl::Time now, absl::Duration grace);
  bool stopping() const { return kill_at_.has_value(); }
  // SIGKILL now, no grace: fencing (fence.h), where the ranks must be gone before the
  // coordinator restarts them elsewhere.
  void Kill();
  // Every rank has exited (and its output is drained), or it never started.
  bool Finished() const;
  // Ranks whose process runs (started, not yet reaped).
  int running() const;

  // Exits wait for the output before them. StampExits(n) tags exits seen since the
  // last call with n, the outbox's pushed() count read after Poll(): everything the
  // rank wrote was pushed before that. An exit is reported once the outbox has
  // delivered that far (`delivered`: events that left the outbox and reached the
  // coordinator, or were dropped), so the `error` event that explains a failure
  // always reaches the coordinator before the exit, however long the backlog.
  void StampExits(int64_t pushed);
  // Some exit is held back: the output before it is not yet delivered.
  bool HoldsExits(int64_t delivered) const;
  // Every rank's pid and, where it may be reported, its exit.
  v1::TaskStatus Status(int64_t delivered) const;

  // Live recovery: `task` is this task at a later generation (its store may have
  // moved). Announces the generation to the running ranks (the generation file) and
  // starts a replacement for every rank whose exit was reported. Returns whether a
  // rank's state changed (a replacement started, or one could not be).
  bool Recover(const v1::Task& task);
  int generation() const { return task_.generation(); }
  // The checkpoint-now notice of `task` (a later notice_seq): written to the notice
  // file for the ranks.
  void Notice(const v1::Task& task);
  // The stacks asked for by `task` (a later stacks_seq, decision 194): every running
  // rank's, taken off the calling thread (stack_capture.h), one rank per thread. Each
  // rank's stacks go into the job's log and its summary into Status() (with the seq);
  // Poll() reports the capture's end as a change. A request during a capture is taken
  // after it.
  void Stacks(const v1::Task& task);

 private:
  struct Rank {
    int rank = 0;
    std::unique_ptr<Subprocess> proc;
    pid_t pid = 0;
    std::optional<ExitStatus> exit;  // Reaped.
    bool reported_exit = false;      // Reaped and drained (or drain timed out).
    absl::Time reaped_at;
    int64_t exit_mark = -1;          // StampExits() count; -1 until stamped.
    int generation = 0;              // Task::generation it was started for.
  };
  // Starts local rank `local` (replacing its exited predecessor, if any).
  absl::Status SpawnRank(int local);
  // Writes the generation file (task_'s generation and store) atomically.
  absl::Status AnnounceGeneration();
  // Writes the notice file (task_'s notice) atomically.
  absl::Status WriteNotice();
  TrainerTask(v1::Task task, OutputPump* pump) : task_(std::move(task)), pump_(pump) {}
  OutputSource SourceOf(const Rank& r) const { return {task_.job_id(), task_.attempt(), r.rank}; }
  std::string FlightPath(int rank) const;
  // Starts a capture for wanted_seq_ unless one runs or it was taken; joins one that ended.
  void StartCapture();

  v1::Task task_;
  OutputPump* pump_;
  TrainerTaskOptions options_;
  std::vector<Rank> ranks_;
  // How ranks are started, kept for replacements.
  LaunchPlan plan_;
  JobSpec spec_;
  RankEnvOptions env_options_;
  std::string cwd_;
  std::string generation_file_;
  std::string notice_file_;
  // The task's directory: each rank keeps its flight recorder there, flight.RANK.
  std::string dir_;
  std::string error_;
  bool node_fault_ = false;
  bool command_ = false;
  std::optional<absl::Time> kill_at_;
  bool killed_ = false;
  // Stacks (Stacks()): the newest seq asked for, the one the capture thread answers.
  int wanted_seq_ = 0;
  int capture_seq_ = 0;
  std::thread capture_;
  std::atomic<bool> capture_done_{false};
  mutable absl::Mutex stacks_mu_;
  std::map<int, v1::StackSummary> stacks_ ABSL_GUARDED_BY(stacks_mu_);  // By rank.
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_TRAINER_TASK_H_
