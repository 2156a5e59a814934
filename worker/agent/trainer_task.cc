#include "worker/agent/trainer_task.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "worker/agent/job_sandbox.h"

namespace ddp {
namespace {

// How long an exited rank's pipes may stay open and silent (a grandchild holding
// them) before its exit is reported anyway. A pump that is merely behind (bytes wait
// in the pipe) is waited for, however long: the exit's `error` event is in there.
constexpr absl::Duration kDrainTimeout = absl::Seconds(2);

absl::Status CheckTaskPaths(const v1::Task& task, const std::string& cwd,
                            const TrainerTaskOptions& options) {
  if (options.allowed_roots.empty()) return absl::OkStatus();
  auto spec = ParseJobSpec(task.spec_yaml(), "job.yaml");
  if (!spec.ok()) return spec.status();
  const std::string own = (std::filesystem::path(options.work_dir) / task.job_id()).string();
  return CheckJobPaths(*spec, cwd, task.job_id(), own, options.allowed_roots);
}

}  // namespace

bool ProcessStopped(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the state is
  // the field after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'T' || state == 't';
}

std::unique_ptr<TrainerTask> TrainerTask::Start(const v1::Task& task,
                                                const TrainerTaskOptions& options,
                                                OutputPump* pump) {
  std::unique_ptr<TrainerTask> t(new TrainerTask(task, pump));
  t->options_ = options;
  if (task.ranks().empty()) {
    t->error_ = absl::StrCat("task ", task.job_id(), " attempt ", task.attempt(),
                             " has no ranks for this worker");
    return t;
  }
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(options.work_dir) / task.job_id() / absl::StrCat("attempt-", task.attempt());
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string spec_path = (dir / "job.yaml").string();
  // From here on every error is this node's: its disk, its directories, its binary.
  t->node_fault_ = true;
  if (ec) {
    t->error_ = absl::StrCat("cannot create ", dir.string(), ": ", ec.message());
    return t;
  }
  std::ofstream spec(spec_path, std::ios::trunc);
  spec << task.spec_yaml();
  spec.close();
  if (!spec) {  // Not opened, or a short write (disk full): the trainer would misread it.
    t->error_ = absl::StrCat("cannot write ", spec_path, " (disk full? permissions?)");
    return t;
  }
  const std::string cwd = task.workdir().empty() ? (fs::path(options.work_dir) / task.job_id()).string()
                                                 : task.workdir();
  if (!fs::is_directory(cwd)) {
    t->error_ = absl::StrCat("workdir ", cwd, " does not exist on this node (relative paths in "
                             "the job resolve there; submit from a directory every node has)");
    return t;
  }
  // Before any trainer starts: the job's paths must lie in the allowed roots. A path
  // outside them is the job's doing, not this node's: permanent.
  if (absl::Status st = CheckTaskPaths(task, cwd, options); !st.ok()) {
    t->node_fault_ = false;
    t->error_ = std::string(st.message());
    return t;
  }
  const int local_world = task.ranks_size();
  if (task.gpu_uuids_size() != 0 && task.gpu_uuids_size() != local_world) {
    t->error_ = absl::StrCat("task ", task.job_id(), " attempt ", task.attempt(), " names ",
                             task.gpu_uuids_size(), " GPU(s) for ", local_world,
                             " local rank(s): a coordinator bug");
    return t;
  }
  for (int local = 0; local < local_world; ++local) {
    SpawnOptions o;
    o.argv = {options.trainer_path, "--spec", spec_path};
    o.cwd = cwd;
    o.inherit_env = false;  // An explicit environment: see job_sandbox.h.
    o.env = options.base_env;
    o.env["OMP_NUM_THREADS"] = std::to_string(options.threads_per_rank);
    o.env["OPENBLAS_NUM_THREADS"] = std::to_string(options.threads_per_rank);
    for (const auto& [k, v] : task.env()) o.env[k] = v;  // The job's own choices win.
    o.env["RANK"] = std::to_string(task.ranks(local));
    o.env["LOCAL_RANK"] = std::to_string(local);
    o.env["WORLD_SIZE"] = std::to_string(task.world_size());
    o.env["LOCAL_WORLD_SIZE"] = std::to_string(local_world);
    o.env["GROUP_RANK"] = std::to_string(task.group_rank());
    o.env["MASTER_ADDR"] = task.master_addr();
    o.env["MASTER_PORT"] = std::to_string(task.master_port());
    o.env["DDP_EVENTS_FD"] = "3";
    o.env["DDP_JOB_ID"] = task.job_id();
    o.env["DDP_ATTEMPT"] = std::to_string(task.attempt());
    if (!options.node.empty()) o.env["DDP_NODE"] = options.node;
    // Exactly the rank's own GPU (by UUID, stable across reboots and PCI order), which
    // it then sees as cuda:0; none for a CPU rank on a GPU node. Set after the job's
    // env: a job cannot reach a GPU it was not given.
    if (task.gpu_uuids_size() > 0) {
      o.env["CUDA_VISIBLE_DEVICES"] = task.gpu_uuids(local);
    } else if (options.node_has_gpus) {
      o.env["CUDA_VISIBLE_DEVICES"] = "";
    }
    o.events_fd = 3;
    o.capture_stdout = true;
    o.capture_stderr = true;
    auto proc = Subprocess::Spawn(o);
    if (!proc.ok()) {
      t->error_ = std::string(proc.status().message());
      t->Stop(absl::Now());
      return t;
    }
    Rank r;
    r.rank = task.ranks(local);
    r.pid = (*proc)->pid();
    pump->Add(t->SourceOf(r), (*proc)->ReleaseEvents(), (*proc)->ReleaseStdout(),
              (*proc)->ReleaseStderr());
    r.proc = std::move(*proc);
    t->ranks_.push_back(std::move(r));
  }
  DDP_LOG(INFO) << "started " << local_world << " trainer(s) for " << task.job_id()
                << " attempt " << task.attempt() << " (ranks " << task.ranks(0) << ".."
                << task.ranks(local_world - 1) << " of " << task.world_size() << ")";
  return t;
}

TrainerTask::~TrainerTask() {
  for (Rank& r : ranks_) {
    if (r.proc) r.proc->Signal(SIGKILL);  // ~Subprocess reaps.
    pump_->Forget(SourceOf(r));
  }
}

bool TrainerTask::Poll(absl::Time now) {
  bool changed = false;
  for (Rank& r : ranks_) {
    if (!r.exit.has_value()) {
      r.exit = r.proc->TryWait();
      if (r.exit.has_value()) {
        r.reaped_at = now;
        DDP_LOG(INFO) << task_.job_id() << " rank " << r.rank << " (pid " << r.pid << ") "
                      << r.exit->ToString();
      }
    }
    if (r.exit.has_value() && !r.reported_exit &&
        (pump_->Drained(SourceOf(r)) ||
         (now - r.reaped_at >= kDrainTimeout && !pump_->Unread(SourceOf(r))))) {
      r.reported_exit = true;
      changed = true;
    }
  }
  if (kill_at_.has_value() && !killed_ && now >= *kill_at_) {
    killed_ = true;
    for (Rank& r : ranks_) {
      if (!r.exit.has_value()) {
        DDP_LOG(WARNING) << task_.job_id() << " rank " << r.rank << " ignored SIGTERM for "
                         << options_.stop_grace << "; sending SIGKILL";
        r.proc->Signal(SIGKILL);
      }
    }
  }
  return changed;
}

void TrainerTask::Stop(absl::Time now) {
  if (kill_at_.has_value()) return;
  kill_at_ = now + options_.stop_grace;
  for (Rank& r : ranks_) {
    if (r.exit.has_value()) continue;
    // A stopped process cannot run its SIGTERM handler: the grace would only delay
    // the attempt's restart (its slot stays busy until it is gone).
    if (ProcessStopped(r.pid)) {
      DDP_LOG(WARNING) << task_.job_id() << " rank " << r.rank << " (pid " << r.pid
                       << ") is stopped; sending SIGKILL at once";
      r.proc->Signal(SIGKILL);
    } else {
      r.proc->Signal(SIGTERM);
    }
  }
}

void TrainerTask::StampExits(int64_t pushed) {
  for (Rank& r : ranks_) {
    if (r.reported_exit && r.exit_mark < 0) r.exit_mark = pushed;
  }
}

bool TrainerTask::HoldsExits(int64_t delivered) const {
  for (const Rank& r : ranks_) {
    if (r.reported_exit && r.exit_mark > delivered) return true;
  }
  return false;
}

bool TrainerTask::Finished() const {
  for (const Rank& r : ranks_) {
    if (!r.reported_exit) return false;
  }
  return true;
}

int TrainerTask::running() const {
  int n = 0;
  for (const Rank& r : ranks_) n += r.pid > 0 && !r.exit.has_value() ? 1 : 0;
  return n;
}

v1::TaskStatus TrainerTask::Status(int64_t delivered) const {
  v1::TaskStatus s;
  s.set_job_id(task_.job_id());
  s.set_attempt(task_.attempt());
  s.set_error(error_);
  s.set_node_fault(!error_.empty() && node_fault_);
  for (const Rank& r : ranks_) {
    v1::LocalRankStatus* rs = s.add_ranks();
    rs->set_rank(r.rank);
    rs->set_pid(r.pid);
    if (!r.exit.has_value() && ProcessStopped(r.pid)) rs->set_stopped(true);
    if (r.reported_exit && r.exit_mark <= delivered) {
      rs->set_exited(true);
      rs->set_exit_code(r.exit->exit_code);
      rs->set_signal(r.exit->signal);
    }
  }
  return s;
}

}  // namespace ddp
