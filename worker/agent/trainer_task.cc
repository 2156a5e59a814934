#include "worker/agent/trainer_task.h"

#include <signal.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/contract/launch_env.h"
#include "common/jobspec/job_spec.h"
#include "common/logging.h"
#include "worker/agent/job_sandbox.h"

namespace ddp {
namespace {

// How long an exited rank's pipes may stay open and silent (a grandchild holding
// them) before its exit is reported anyway. A pump that is merely behind (bytes wait
// in the pipe) is waited for, however long: the exit's `error` event is in there.
constexpr absl::Duration kDrainTimeout = absl::Seconds(2);

}  // namespace

bool ProcessStopped(int pid) {
  const std::optional<ProcStat> s = ReadProcStat(pid);
  return s.has_value() && (s->state == 'T' || s->state == 't');
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
  std::ofstream file(spec_path, std::ios::trunc);
  file << task.spec_yaml();
  file.close();
  if (!file) {  // Not opened, or a short write (disk full): the trainer would misread it.
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
  // Before any rank starts: the job's paths must lie in the allowed roots, and its
  // program must be there and allowed. Failures here are the job's doing, not this
  // node's: permanent.
  auto spec = ParseJobSpec(task.spec_yaml(), "job.yaml");
  if (!spec.ok()) {
    t->node_fault_ = false;
    t->error_ = std::string(spec.status().message());
    return t;
  }
  t->command_ = spec->is_command();
  const std::string own = (fs::path(options.work_dir) / task.job_id()).string();
  if (absl::Status st = CheckJobPaths(*spec, cwd, task.job_id(), own, options.allowed_roots);
      !st.ok()) {
    t->node_fault_ = false;
    t->error_ = std::string(st.message());
    return t;
  }
  LaunchOptions lo;
  lo.trainer_path = options.trainer_path;
  lo.spec_path = spec_path;
  lo.cwd = cwd;
  auto path_var = options.base_env.find("PATH");
  lo.path_var = path_var == options.base_env.end() ? "" : path_var->second;
  lo.worker = options.node;
  lo.exec = options.exec;
  auto plan = PlanLaunch(*spec, lo);
  if (!plan.ok()) {
    t->node_fault_ = false;
    t->error_ = std::string(plan.status().message());
    return t;
  }
  const int local_world = task.ranks_size();
  if (task.gpu_uuids_size() != 0 && task.gpu_uuids_size() != local_world) {
    t->error_ = absl::StrCat("task ", task.job_id(), " attempt ", task.attempt(), " names ",
                             task.gpu_uuids_size(), " GPU(s) for ", local_world,
                             " local rank(s): a coordinator bug");
    return t;
  }
  RankEnvOptions eo;
  eo.base_env = options.base_env;
  eo.node = options.node;
  eo.threads_per_rank = options.threads_per_rank;
  eo.node_has_gpus = options.node_has_gpus;
  eo.python_path = options.python_path;
  eo.gloo_socket_ifname = options.gloo_socket_ifname;
  for (int local = 0; local < local_world; ++local) {
    SpawnOptions o;
    o.argv = plan->argv;
    o.program = plan->executable;
    o.cwd = cwd;
    o.inherit_env = false;  // An explicit environment: see job_sandbox.h.
    o.env = RankEnvironment(task, local, *spec, plan->command, eo);
    o.events_fd = env::kEventsFdNumber;
    o.capture_stdout = true;
    o.capture_stderr = true;
    auto proc = Subprocess::Spawn(o);
    if (!proc.ok()) {
      // A user's program that cannot be executed (a bad #! line) is the job's fault;
      // fork and pipe failures (INTERNAL) and a missing ddp-trainer are this node's.
      if (plan->command && proc.status().code() != absl::StatusCode::kInternal) {
        t->node_fault_ = false;
      }
      t->error_ = std::string(proc.status().message());
      t->Stop(absl::Now());
      return t;
    }
    Rank r;
    r.rank = task.ranks(local);
    r.pid = (*proc)->pid();
    if (options.ledger != nullptr) {
      options.ledger->Add({r.pid, ProcessStartTicks(r.pid), task.job_id(), task.attempt(), r.rank});
    }
    pump->Add(t->SourceOf(r), (*proc)->ReleaseEvents(), (*proc)->ReleaseStdout(),
              (*proc)->ReleaseStderr(), plan->command ? EventCheck::kLenient : EventCheck::kStrict);
    r.proc = std::move(*proc);
    t->ranks_.push_back(std::move(r));
  }
  DDP_LOG(INFO) << "started " << local_world << (plan->command ? " process(es) of " : " trainer(s) for ")
                << task.job_id()
                << " attempt " << task.attempt() << " (ranks " << task.ranks(0) << ".."
                << task.ranks(local_world - 1) << " of " << task.world_size() << ")";
  return t;
}

TrainerTask::~TrainerTask() {
  for (Rank& r : ranks_) {
    if (r.proc) r.proc->Signal(SIGKILL);
    // ~Subprocess reaps the rank, and reaping kills what is left in its group
    // (common/process.h): the group is gone, the next incarnation need not look.
    r.proc.reset();
    if (options_.ledger != nullptr) options_.ledger->Remove(r.pid);
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

void TrainerTask::Kill() {
  killed_ = true;
  for (Rank& r : ranks_) {
    if (!r.exit.has_value()) r.proc->Signal(SIGKILL);
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
