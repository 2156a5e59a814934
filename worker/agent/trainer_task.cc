#include "worker/agent/trainer_task.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/contract/flight_recorder.h"
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
  // A capture asked for before this task started here (a replacement rank's spare)
  // is not this task's to answer.
  t->wanted_seq_ = t->capture_seq_ = task.stacks_seq();
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
  t->plan_ = *std::move(plan);
  t->spec_ = *std::move(spec);
  // The job may ask for less than the worker's grace, never more.
  if (t->spec_.stop_grace_s > 0) {
    t->options_.stop_grace =
        std::min(options.stop_grace, absl::Seconds(t->spec_.stop_grace_s));
  }
  t->env_options_ = std::move(eo);
  t->cwd_ = cwd;
  t->generation_file_ = (dir / "generation").string();
  t->notice_file_ = (dir / "notice").string();
  t->dir_ = dir.string();
  absl::Status written = t->AnnounceGeneration();
  if (written.ok()) written = t->WriteNotice();
  if (absl::Status st = written; !st.ok()) {
    t->error_ = std::string(st.message());
    return t;
  }
  for (int local = 0; local < local_world; ++local) {
    if (absl::Status st = t->SpawnRank(local); !st.ok()) {
      // A user's program that cannot be executed (a bad #! line) is the job's fault;
      // fork and pipe failures (INTERNAL) and a missing ddp-trainer are this node's.
      if (t->plan_.command && st.code() != absl::StatusCode::kInternal) t->node_fault_ = false;
      t->error_ = std::string(st.message());
      t->Stop(absl::Now());
      return t;
    }
  }
  DDP_LOG(INFO) << "started " << local_world << (t->plan_.command ? " process(es) of " : " trainer(s) for ")
                << task.job_id()
                << " attempt " << task.attempt() << " (ranks " << task.ranks(0) << ".."
                << task.ranks(local_world - 1) << " of " << task.world_size() << ")";
  return t;
}

namespace {

// Replaces `path` with `line` atomically (a reader never sees half of it).
absl::Status ReplaceFile(const std::string& path, const std::string& line) {
  const std::string tmp = path + ".tmp";
  std::ofstream file(tmp, std::ios::trunc);
  file << line << "\n";
  file.close();
  std::error_code ec;
  if (file) std::filesystem::rename(tmp, path, ec);
  if (!file || ec) {
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ec ? ": " + ec.message() : " (disk full?)"));
  }
  return absl::OkStatus();
}

// What the flight recorder of the rank `pid` says (decision 193), into `rs`: nothing
// when the rank keeps none (a command job's own program), has not made it yet, or the
// file is a predecessor's (another pid: a replacement that has not started its own).
void ReadFlight(const std::string& path, int pid, v1::LocalRankStatus* rs) {
  absl::StatusOr<flight::Snapshot> s = flight::ReadFile(path);
  if (!s.ok() || s->pid != pid) return;
  const int64_t now = flight::NowNs();
  v1::FlightState* f = rs->mutable_flight();
  f->set_phase(flight::PhaseLabel(s->phase));
  f->set_phase_ms(std::max<int64_t>(0, (now - s->phase_since_ns) / 1000000));
  f->set_entered(s->entered);
  f->set_completed(s->completed);
  f->set_global_step(s->global_step);
  const flight::Collective* c = s->OldestInFlight();
  if (c != nullptr) {
    f->set_waiting_ms(std::max<int64_t>(0, (now - c->start_ns) / 1000000));
  } else {
    c = s->Last();
  }
  if (c != nullptr) f->set_collective(flight::Describe(*c));
}

// "rank 1's flight recorder when stopped: in data loading for 4.6s (step 30); ..., the
// last collectives first": the rank's recorder in one line. Only for a rank that looks
// stuck, a collective in flight or its phase unchanged for a second or more (a healthy
// rank's change every few milliseconds, so a cancel or a preemption of a healthy job
// logs nothing); "" for the others and for a rank that keeps no recorder.
std::string FlightDump(const std::string& path, int pid) {
  absl::StatusOr<flight::Snapshot> s = flight::ReadFile(path);
  if (!s.ok() || s->pid != pid) return "";
  const int64_t now = flight::NowNs();
  constexpr int64_t kStuckNs = 1000000000;
  const flight::Collective* waiting = s->OldestInFlight();
  const bool stuck = (waiting != nullptr && now - waiting->start_ns >= kStuckNs) ||
                     (s->phase != flight::Phase::kDone && now - s->phase_since_ns >= kStuckNs);
  if (!stuck) return "";
  auto ms = [](int64_t ns) { return absl::StrFormat("%.1f ms", static_cast<double>(ns) / 1e6); };
  std::string out = absl::StrFormat(
      "rank %d's flight recorder when stopped: in %s for %.1fs", s->rank,
      flight::PhaseName(s->phase), static_cast<double>(now - s->phase_since_ns) / 1e9);
  if (s->global_step >= 0) absl::StrAppend(&out, " (step ", s->global_step, ")");
  absl::StrAppend(&out, "; collectives entered ", s->entered, ", completed ", s->completed);
  constexpr size_t kShown = 8;
  if (!s->recent.empty()) absl::StrAppend(&out, "; the last, newest first:");
  size_t shown = 0;
  for (auto it = s->recent.rbegin(); it != s->recent.rend() && shown < kShown; ++it, ++shown) {
    absl::StrAppend(&out, shown == 0 ? " " : ", ", flight::Describe(*it), " ",
                    it->end_ns == 0 ? absl::StrCat("in flight for ", ms(now - it->start_ns))
                                    : ms(it->end_ns - it->start_ns));
  }
  return out;
}

}  // namespace

std::string TrainerTask::FlightPath(int rank) const {
  return absl::StrCat(dir_, "/flight.", rank);
}

absl::Status TrainerTask::AnnounceGeneration() {
  return ReplaceFile(generation_file_, absl::StrCat(task_.generation(), " ", task_.master_addr(),
                                                    " ", task_.master_port()));
}

absl::Status TrainerTask::WriteNotice() {
  std::string why = task_.notice();
  for (char& c : why) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return ReplaceFile(notice_file_, absl::StrCat(task_.notice_seq(), " ",
                                                task_.notice_deadline_ms(), " ", why));
}

void TrainerTask::Notice(const v1::Task& task) {
  if (task.notice_seq() <= task_.notice_seq() || notice_file_.empty()) return;
  task_.set_notice_seq(task.notice_seq());
  task_.set_notice(task.notice());
  task_.set_notice_deadline_ms(task.notice_deadline_ms());
  if (absl::Status st = WriteNotice(); !st.ok()) {
    DDP_LOG(ERROR) << task_.job_id() << ": " << st.message();
    return;
  }
  DDP_LOG(INFO) << task_.job_id() << " attempt " << task_.attempt() << ": checkpoint-now notice "
                << task_.notice_seq() << " (" << task_.notice() << ")";
  if (spec_.notice_signal == 0) return;
  for (Rank& r : ranks_) {  // The program's own process; what it started is its own.
    if (!r.exit.has_value() && r.pid > 0) ::kill(r.pid, spec_.notice_signal);
  }
}

absl::Status TrainerTask::SpawnRank(int local) {
  SpawnOptions o;
  o.argv = plan_.argv;
  o.program = plan_.executable;
  o.cwd = cwd_;
  o.inherit_env = false;  // An explicit environment: see job_sandbox.h.
  o.env = RankEnvironment(task_, local, spec_, plan_.command, env_options_);
  o.env[env::kGeneration] = std::to_string(task_.generation());
  o.env[env::kGenerationFile] = generation_file_;
  o.env[env::kNoticeFile] = notice_file_;
  o.env[env::kFlightRecorder] = FlightPath(task_.ranks(local));
  o.env[env::kStopGrace] = absl::StrCat(absl::ToDoubleSeconds(options_.stop_grace));
  o.events_fd = env::kEventsFdNumber;
  o.capture_stdout = true;
  o.capture_stderr = true;
  o.traceable_by_parent = true;  // Its stacks (stack_capture.h).
  auto proc = Subprocess::Spawn(o);
  if (!proc.ok()) return proc.status();
  Rank r;
  r.rank = task_.ranks(local);
  r.pid = (*proc)->pid();
  r.generation = task_.generation();
  if (options_.ledger != nullptr) {
    options_.ledger->Add({r.pid, ProcessStartTicks(r.pid), task_.job_id(), task_.attempt(), r.rank});
  }
  pump_->Add(SourceOf(r), (*proc)->ReleaseEvents(), (*proc)->ReleaseStdout(),
             (*proc)->ReleaseStderr(), plan_.command ? EventCheck::kLenient : EventCheck::kStrict);
  r.proc = std::move(*proc);
  if (static_cast<size_t>(local) < ranks_.size()) {
    Rank& old = ranks_[local];
    old.proc.reset();  // Reaped already: releases what is left of its group.
    if (options_.ledger != nullptr) options_.ledger->Remove(old.pid);
    old = std::move(r);
  } else {
    ranks_.push_back(std::move(r));
  }
  return absl::OkStatus();
}

bool TrainerTask::Recover(const v1::Task& task) {
  if (task.generation() <= task_.generation() || stopping() || !error_.empty()) return false;
  if (task.ranks_size() != task_.ranks_size()) {
    DDP_LOG(ERROR) << task_.job_id() << " attempt " << task_.attempt()
                   << ": a recovery that changes this node's ranks is not supported";
    return false;
  }
  const v1::Task before = task_;
  task_ = task;
  // Its notice is Notice()'s to write (and log).
  task_.set_notice_seq(before.notice_seq());
  task_.set_notice(before.notice());
  task_.set_notice_deadline_ms(before.notice_deadline_ms());
  task_.set_stacks_seq(before.stacks_seq());
  if (absl::Status st = AnnounceGeneration(); !st.ok()) {
    DDP_LOG(ERROR) << task_.job_id() << ": " << st.message();
  }
  bool changed = false;
  for (size_t local = 0; local < ranks_.size(); ++local) {
    const Rank& r = ranks_[local];
    if (!r.reported_exit || r.generation >= task_.generation()) continue;
    const int pid = r.pid;
    if (absl::Status st = SpawnRank(static_cast<int>(local)); !st.ok()) {
      DDP_LOG(ERROR) << task_.job_id() << " rank " << r.rank << ": cannot start its "
                     << "replacement: " << st.message();
      continue;
    }
    changed = true;
    DDP_LOG(INFO) << task_.job_id() << " attempt " << task_.attempt() << " generation "
                  << task_.generation() << ": rank " << ranks_[local].rank << " replaced (pid "
                  << pid << " -> " << ranks_[local].pid << "), store " << task_.master_addr()
                  << ":" << task_.master_port();
  }
  return changed;
}

TrainerTask::~TrainerTask() {
  for (Rank& r : ranks_) {
    if (r.proc) r.proc->Signal(SIGKILL);
  }
  // A capture ends soon once its ranks are gone (its tools are bounded anyway).
  if (capture_.joinable()) capture_.join();
  for (Rank& r : ranks_) {
    // ~Subprocess reaps the rank, and reaping kills what is left in its group
    // (common/process.h): the group is gone, the next incarnation need not look.
    r.proc.reset();
    if (options_.ledger != nullptr) options_.ledger->Remove(r.pid);
    pump_->Forget(SourceOf(r));
  }
}

void TrainerTask::Stacks(const v1::Task& task) {
  if (task.stacks_seq() <= wanted_seq_) return;
  wanted_seq_ = task.stacks_seq();
  StartCapture();
}

void TrainerTask::StartCapture() {
  if (capture_.joinable()) {
    if (!capture_done_.load()) return;  // Poll() starts the next one when it ends.
    capture_.join();
  }
  if (wanted_seq_ <= capture_seq_) return;
  capture_seq_ = wanted_seq_;
  std::vector<std::pair<int, int>> targets;  // (rank, pid)
  for (const Rank& r : ranks_) {
    if (r.pid > 0 && !r.exit.has_value()) targets.emplace_back(r.rank, r.pid);
  }
  capture_done_ = false;
  const StackTools tools = options_.stacks;
  const int seq = capture_seq_;
  const std::string job = task_.job_id();
  const int attempt = task_.attempt();
  DDP_LOG(INFO) << job << " attempt " << attempt << ": taking the stacks of "
                << targets.size() << " rank(s) (capture " << seq << ")";
  capture_ = std::thread([this, targets, tools, seq, job, attempt] {
    std::vector<std::thread> each;
    for (const auto& [rank, pid] : targets) {
      each.emplace_back([this, rank = rank, pid = pid, &tools, seq, job, attempt] {
        const absl::Time start = absl::Now();
        RankStacks s = TakeStacks(pid, tools);
        const absl::Duration took = absl::Now() - start;
        s.summary.set_seq(seq);
        s.summary.set_taken_ms(absl::ToUnixMillis(start));
        std::string line = absl::StrFormat(
            "rank %d's stacks (capture %d, pid %d, %s, %.2fs)", rank, seq, pid,
            s.summary.tools().empty() ? "no tool" : s.summary.tools(),
            absl::ToDoubleSeconds(took));
        if (!s.summary.where().empty()) {
          absl::StrAppend(&line, s.summary.in_collective() ? " in a collective: "
                                                           : " outside any collective: ",
                          s.summary.where());
        }
        if (!s.summary.error().empty()) absl::StrAppend(&line, "; ", s.summary.error());
        if (!s.text.empty()) absl::StrAppend(&line, "\n", s.text);
        pump_->Say(OutputSource{job, attempt, rank}, std::move(line));
        absl::MutexLock lock(&stacks_mu_);
        stacks_[rank] = std::move(s.summary);
      });
    }
    for (std::thread& t : each) t.join();
    capture_done_ = true;
  });
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
  if (capture_.joinable() && capture_done_.load()) {
    StartCapture();  // Joins it, and takes a request that came meanwhile.
    changed = true;  // The summaries, at the next heartbeat.
  }
  return changed;
}

void TrainerTask::Stop(absl::Time now) { Stop(now, options_.stop_grace); }

void TrainerTask::Stop(absl::Time now, absl::Duration grace) {
  if (kill_at_.has_value()) return;
  kill_at_ = now + grace;
  for (Rank& r : ranks_) {
    if (r.exit.has_value()) continue;
    // Where it was when it was stopped, in the job's log (ddpctl logs): the last
    // collectives of its flight recorder, read before the signal changes anything.
    if (r.pid > 0) {
      std::string dump = FlightDump(FlightPath(r.rank), r.pid);
      if (!dump.empty()) pump_->Say(SourceOf(r), std::move(dump));
    }
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
    rs->set_generation(r.generation);
    if (!r.exit.has_value() && ProcessStopped(r.pid)) rs->set_stopped(true);
    if (!r.exit.has_value() && r.pid > 0) ReadFlight(FlightPath(r.rank), r.pid, rs);
    {
      absl::MutexLock lock(&stacks_mu_);
      if (auto it = stacks_.find(r.rank); it != stacks_.end()) *rs->mutable_stack() = it->second;
    }
    if (r.reported_exit && r.exit_mark <= delivered) {
      rs->set_exited(true);
      rs->set_exit_code(r.exit->exit_code);
      rs->set_signal(r.exit->signal);
    }
  }
  return s;
}

}  // namespace ddp
