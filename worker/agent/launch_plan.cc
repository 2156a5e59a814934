#include "worker/agent/launch_plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/contract/launch_env.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

// Under `dir` or equal to it, comparing lexically normal absolute paths.
bool Within(const std::string& path, const std::string& entry) {
  if (path == entry) return true;
  std::string dir = entry;
  if (dir.empty() || dir.back() != '/') dir += '/';
  return path.compare(0, dir.size(), dir) == 0;
}

absl::Status CheckRunnable(const std::string& path, const std::string& name) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("command[0]: ", path, " does not exist",
                                            path == name ? "" : absl::StrCat(" (from '", name, "')")));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("command[0]: ", path, " is a directory"));
  }
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "command[0]: ", path, " is not an executable file (chmod +x it, or run it through "
        "its interpreter: command: [python3, ", name, ", ...])"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ResolveProgram(const std::string& name, const std::string& cwd,
                                           const std::string& path_var) {
  if (name.empty()) return absl::InvalidArgumentError("command[0]: the program is empty");
  if (name.find('/') != std::string::npos) {
    const fs::path p = name[0] == '/' ? fs::path(name) : fs::path(cwd) / name;
    const std::string path = p.lexically_normal().string();
    if (absl::Status st = CheckRunnable(path, name); !st.ok()) return st;
    return path;
  }
  bool found_unrunnable = false;
  for (absl::string_view dir : absl::StrSplit(path_var, ':', absl::SkipEmpty())) {
    if (dir[0] != '/') continue;  // A relative PATH entry would depend on the workdir.
    const std::string path = (fs::path(std::string(dir)) / name).lexically_normal().string();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;
    if (S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0) return path;
    found_unrunnable = true;
  }
  return absl::NotFoundError(absl::StrCat(
      "command[0]: '", name, "' is not ", found_unrunnable ? "an executable file " : "",
      "in the worker's PATH (", path_var.empty() ? "empty" : path_var,
      "): give an absolute path, a path relative to the workdir (./", name,
      "), or install it on every node"));
}

absl::StatusOr<std::string> CheckExecAllowed(const std::string& program,
                                             const ExecPolicy& policy, const std::string& worker) {
  if (policy.allow_all) return program;
  std::error_code ec;
  const std::string canonical = fs::canonical(program, ec).string();
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("command[0]: cannot resolve ", program, " (",
                                                    ec.message(), ") to check it against --allow-exec"));
  }
  for (const std::string& entry : policy.allowed) {
    if (Within(canonical, entry)) return canonical;
  }
  const std::string shown =
      canonical != program ? absl::StrCat(program, " (", canonical, ")") : program;
  if (policy.allowed.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "command[0]: worker ", worker, " starts no programs of command jobs (no --allow-exec): "
        "its operator may allow ", shown, " with ddp-worker --allow-exec ", program));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "command[0]: ", shown, " is not allowed on worker ", worker, ": its --allow-exec admits ",
      absl::StrJoin(policy.allowed, ", "), "; its operator may add --allow-exec ", program));
}

absl::StatusOr<LaunchPlan> PlanLaunch(const JobSpec& spec, const LaunchOptions& options) {
  LaunchPlan plan;
  if (!spec.is_command()) {
    plan.argv = {options.trainer_path, "--spec", options.spec_path};
    plan.executable = options.trainer_path;
    return plan;
  }
  plan.command = true;
  auto program = ResolveProgram(spec.command[0], options.cwd, options.path_var);
  if (!program.ok()) return program.status();
  auto executable = CheckExecAllowed(*program, options.exec, options.worker);
  if (!executable.ok()) return executable.status();
  plan.argv = spec.command;
  plan.argv[0] = *program;
  plan.executable = *executable;
  return plan;
}

std::map<std::string, std::string> RankEnvironment(const v1::Task& task, int local,
                                                   const JobSpec& spec, bool command,
                                                   const RankEnvOptions& options) {
  std::map<std::string, std::string> out = options.base_env;
  if (command) {
    out[env::kOmpNumThreads] = "1";  // torchrun's default, unless the job says.
  } else {
    out[env::kOmpNumThreads] = std::to_string(options.threads_per_rank);
    out[env::kOpenblasNumThreads] = std::to_string(options.threads_per_rank);
  }
  for (const auto& [k, v] : task.env()) out[k] = v;  // The job's own choices win.
  if (command && !options.python_path.empty()) {
    std::string& pp = out["PYTHONPATH"];
    pp = pp.empty() ? options.python_path : absl::StrCat(pp, ":", options.python_path);
  }
  RankLaunch l;
  l.rank = task.ranks(local);
  l.local_rank = local;
  l.world_size = task.world_size();
  l.local_world_size = task.ranks_size();
  l.group_rank = task.group_rank();
  l.group_world_size = std::max(1, task.group_world_size());
  l.master_addr = task.master_addr();
  l.master_port = task.master_port();
  l.restart_count = task.restart_count();
  l.max_restarts = spec.max_restarts;
  l.run_id = task.rdzv_id().empty() ? task.job_id() : task.rdzv_id();
  l.job_id = task.job_id();
  l.attempt = task.attempt();
  l.node = options.node;
  for (auto& [k, v] : LaunchEnvironment(l)) out[k] = std::move(v);
  if (!options.gloo_socket_ifname.empty()) out.emplace("GLOO_SOCKET_IFNAME", options.gloo_socket_ifname);
  // Exactly the rank's own GPU (by UUID, stable across reboots and PCI order), which
  // it then sees as cuda:0; none for a CPU rank on a GPU node. Set after the job's
  // env: a job cannot reach a GPU it was not given.
  if (task.gpu_uuids_size() > 0) {
    out[env::kCudaVisibleDevices] = task.gpu_uuids(local);
  } else if (options.node_has_gpus) {
    out[env::kCudaVisibleDevices] = "";
  }
  return out;
}

}  // namespace ddp
