// How the agent starts one rank of a task: the one launch path for the built-in
// trainer and users' own programs.
//
// A task's job is either a command job (`command:` in job.yaml: the user's program,
// run with torchrun's environment and failure semantics) or the built-in trainer,
// which is the special case whose argv is `ddp-trainer --spec <attempt dir>/job.yaml`.
// Both get the same launch contract (common/contract/launch_env.h); they differ in
// the program, the thread defaults, and how their event lines are read (strictly for
// ddp-trainer, leniently for a user's program: output_pump.h).
//
// The program of a command job: argv[0] as written when absolute, against the workdir
// when it holds a '/', else looked up in the worker's PATH (not the job's: what may
// run is the worker's to decide). It must be a regular executable file, and, when the
// worker has an --allow-exec list, lie in it (ExecPolicy).
#ifndef DDP_WORKER_AGENT_LAUNCH_PLAN_H_
#define DDP_WORKER_AGENT_LAUNCH_PLAN_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

// --allow-exec: the programs command jobs may start. `allow_all`: any (a plaintext
// loopback worker's default); otherwise only a listed file, or a file under a listed
// directory, matched by the program's canonical path (symlinks followed), which is then
// the file executed: a job cannot swap a symlink between the check and the exec. The
// list holds each entry's canonical form too (ddp-worker's flag parsing), so
// `--allow-exec /usr/bin/python3` admits `python3`, which links to python3.11. An
// empty list admits nothing (a secured worker's default).
struct ExecPolicy {
  bool allow_all = false;
  std::vector<std::string> allowed;  // Absolute, lexically normal paths.
};

// Where a program name resolves: an absolute path; against `cwd` when it holds a
// '/'; else the first executable regular file in `path_var`'s directories.
// NOT_FOUND naming the PATH searched, PERMISSION_DENIED for a file that is not
// executable, INVALID_ARGUMENT for a directory.
absl::StatusOr<std::string> ResolveProgram(const std::string& name, const std::string& cwd,
                                           const std::string& path_var);

// The file to execute for `program` (an absolute path) if `policy` admits it: its
// canonical path under a restrictive policy, `program` itself under allow_all.
// PERMISSION_DENIED naming the program, what it resolves to, and the flag that would
// admit it.
absl::StatusOr<std::string> CheckExecAllowed(const std::string& program,
                                             const ExecPolicy& policy, const std::string& worker);

struct LaunchPlan {
  bool command = false;            // A user's program (lenient events, torchrun exits).
  std::vector<std::string> argv;   // argv[0]: the resolved program, as the program sees it.
  std::string executable;          // The file to execute (see ExecPolicy).
};

struct LaunchOptions {
  std::string trainer_path;  // ddp-trainer.
  std::string spec_path;     // The attempt's job.yaml, for ddp-trainer.
  std::string cwd;           // The job's workdir.
  std::string path_var;      // The worker's PATH.
  std::string worker;        // This worker's name, for messages.
  ExecPolicy exec;
};

// The argv of every rank of `spec`'s task. Errors (a command that is not there, not
// executable or not allowed) are the job's: its attempt fails without a restart.
absl::StatusOr<LaunchPlan> PlanLaunch(const JobSpec& spec, const LaunchOptions& options);

struct RankEnvOptions {
  std::map<std::string, std::string> base_env;  // The worker's variables (TrainerBaseEnv).
  std::string node;                             // DDP_NODE; empty: unset.
  int threads_per_rank = 1;                     // The built-in trainer's OMP default.
  bool node_has_gpus = false;
  std::string python_path;  // Appended to a command job's PYTHONPATH (ddp_report.py).
  // GLOO_SOCKET_IFNAME for every rank unless the worker's or the job's environment sets
  // it: the interface of the worker's advertised address, so that Gloo (ddp's and
  // PyTorch's) listens where the other hosts reach this one, not where the host name
  // happens to resolve (Debian: 127.0.1.1). Empty: not set.
  std::string gloo_socket_ifname;
};

// The whole environment of local rank `local` of `task`: the worker's variables, the
// thread defaults, the job's `env` (which wins over both), then the launch contract
// and the rank's GPU (which nothing in the job can override).
std::map<std::string, std::string> RankEnvironment(const v1::Task& task, int local,
                                                   const JobSpec& spec, bool command,
                                                   const RankEnvOptions& options);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_LAUNCH_PLAN_H_
