// What a job may touch on this node, decided before any of its trainers starts.
//
// Paths: with `--allow-root DIR` (repeatable), every path a job names (its workdir,
// data files, TorchScript model and checkpoint dir) must resolve, relative ones
// against the workdir and after following symlinks, to DIR or below it for some
// allowed root (or to the agent's own directory for that job). The parts of a path
// that do not exist yet (a checkpoint dir) are normalized lexically. A job that
// breaks the rule fails permanently, naming the field, the path and the rule. The
// check runs when the task starts: roots must not be writable by users who could
// swap a checked directory for a symlink afterwards.
//
// Environment: trainers get an explicit environment, never the agent's whole one: the
// contract variables (torchrun's, DDP_*), the job's `env`, and from the agent's own
// environment only the allowlisted variables below plus those named by --pass-env.
#ifndef DDP_WORKER_AGENT_JOB_SANDBOX_H_
#define DDP_WORKER_AGENT_JOB_SANDBOX_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"

namespace ddp {

// Canonical forms of the --allow-root directories; INVALID_ARGUMENT naming one that
// does not exist or is not a directory.
absl::StatusOr<std::vector<std::string>> CanonicalRoots(const std::vector<std::string>& roots);

// OK if every path of `spec` lies in `roots` (canonical) or in `own_dir`, resolving
// relative paths against `cwd` and `{job_id}` as the trainer does. No roots: OK.
// PERMISSION_DENIED naming the field, the path, where it resolves and the roots.
absl::Status CheckJobPaths(const JobSpec& spec, const std::string& cwd,
                           const std::string& job_id, const std::string& own_dir,
                           const std::vector<std::string>& roots);

// The agent's variables passed to trainers: PATH, HOME, USER, LOGNAME, LANG, LANGUAGE,
// TZ, TMPDIR, LD_LIBRARY_PATH (the operator's, never the job's), and LC_*, CUDA_*,
// NCCL_*, GLOO_*, NVIDIA_*, TORCH_*; plus each name in `extra` ("NAME", or "PREFIX*").
std::map<std::string, std::string> TrainerBaseEnv(char** environ,
                                                  const std::vector<std::string>& extra);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_JOB_SANDBOX_H_
