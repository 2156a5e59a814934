#include "common/process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace ddp {
namespace {

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

absl::Status PipeCloexec(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

ExitStatus FromWaitStatus(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) {
    s.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  }
  return s;
}

// Everything the child needs is prepared before fork(): after it, only
// async-signal-safe calls are allowed.
struct ChildPlan {
  std::string program;  // What execve runs.
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

ChildPlan MakePlan(const SpawnOptions& o) {
  ChildPlan plan;
  plan.argv_storage = o.argv;
  plan.program = o.program.empty() ? o.argv[0] : o.program;
  std::map<std::string, std::string> env;
  if (o.inherit_env) {
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      size_t eq = kv.find('=');
      if (eq == std::string::npos) continue;
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  for (const auto& name : o.unset_env) env.erase(name);
  for (const auto& [k, v] : o.env) env[k] = v;
  for (const auto& [k, v] : env) plan.env_storage.push_back(k + "=" + v);
  for (auto& s : plan.argv_storage) plan.argv.push_back(s.data());
  plan.argv.push_back(nullptr);
  for (auto& s : plan.env_storage) plan.envp.push_back(s.data());
  plan.envp.push_back(nullptr);
  return plan;
}

}  // namespace

std::optional<ProcStat> ReadProcStat(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so the
  // fields are counted from the last ')'. Field 3 is the state, 5 the group, 22 the
  // start time.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return std::nullopt;
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
  ProcStat s;
  if (f.size() < 20 || f[0].size() != 1 || !absl::SimpleAtoi(f[2], &s.pgrp) ||
      !absl::SimpleAtoi(f[19], &s.start_ticks)) {
    return std::nullopt;
  }
  s.state = f[0][0];
  return s;
}

std::string ExitStatus::ToString() const {
  if (signal != 0) {
    const char* name = sigabbrev_np(signal);
    return absl::StrCat("killed by SIG", name ? name : std::to_string(signal));
  }
  return absl::StrCat("exit ", exit_code);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  ChildPlan plan = MakePlan(o);

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, ev_pipe[2] = {-1, -1};
  int exec_pipe[2] = {-1, -1};  // Child reports exec failure's errno through this.
  auto close_all = [&] {
    for (int* p : {out_pipe, err_pipe, ev_pipe, exec_pipe}) {
      CloseFd(&p[0]);
      CloseFd(&p[1]);
    }
  };
  absl::Status st = PipeCloexec(exec_pipe);
  if (st.ok() && o.capture_stdout) st = PipeCloexec(out_pipe);
  if (st.ok() && o.capture_stderr) st = PipeCloexec(err_pipe);
  if (st.ok() && o.events_fd >= 0) st = PipeCloexec(ev_pipe);
  if (!st.ok()) {
    close_all();
    return st;
  }

  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    close_all();
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(e)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    if (o.new_process_group) ::setpgid(0, 0);
    if (o.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // Parent already gone.
    }
    // Yama's ptrace_scope 1 lets only ancestors attach; this names the parent (and so
    // the tools it starts) too. EINVAL without Yama: nothing to allow.
    if (o.traceable_by_parent) ::prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    // Restore default signal handling the parent may have changed.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    if (out_pipe[1] >= 0) ::dup2(out_pipe[1], STDOUT_FILENO);
    if (err_pipe[1] >= 0) ::dup2(err_pipe[1], STDERR_FILENO);
    if (ev_pipe[1] >= 0) ::dup2(ev_pipe[1], o.events_fd);  // dup2 clears CLOEXEC.
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) {
      int e = errno;
      (void)!::write(exec_pipe[1], &e, sizeof(e));
      ::_exit(127);
    }
    ::execve(plan.program.c_str(), plan.argv.data(), plan.envp.data());
    int e = errno;
    (void)!::write(exec_pipe[1], &e, sizeof(e));
    ::_exit(127);
  }

  // Parent.
  CloseFd(&exec_pipe[1]);
  CloseFd(&out_pipe[1]);
  CloseFd(&err_pipe[1]);
  CloseFd(&ev_pipe[1]);
  if (o.new_process_group) ::setpgid(pid, pid);  // Also done in the child: no race.
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  CloseFd(&exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status;
    ::waitpid(pid, &status, 0);
    close_all();
    std::string what = absl::StrCat("cannot run ", o.argv[0],
                                    o.cwd.empty() ? "" : absl::StrCat(" in ", o.cwd), ": ",
                                    std::strerror(child_errno));
    if (child_errno == ENOENT || child_errno == ENOTDIR) return absl::NotFoundError(what);
    if (child_errno == EACCES) return absl::PermissionDeniedError(what);
    // The program itself cannot be run (ENOEXEC: no #! line, another architecture;
    // ELOOP, E2BIG...): not a failure of this process's resources.
    return absl::FailedPreconditionError(what);
  }

  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  p->process_group_ = o.new_process_group;
  p->stdout_fd_ = out_pipe[0];
  p->stderr_fd_ = err_pipe[0];
  p->events_fd_ = ev_pipe[0];
  return p;
}

Subprocess::~Subprocess() {
  if (!status_.has_value()) {
    Signal(SIGKILL);
    Wait();
  }
  CloseFd(&stdout_fd_);
  CloseFd(&stderr_fd_);
  CloseFd(&events_fd_);
}

int Subprocess::ReleaseStdout() { return std::exchange(stdout_fd_, -1); }
int Subprocess::ReleaseStderr() { return std::exchange(stderr_fd_, -1); }
int Subprocess::ReleaseEvents() { return std::exchange(events_fd_, -1); }

void Subprocess::Signal(int sig) {
  if (status_.has_value() || pid_ <= 0) return;
  if (process_group_) {
    // The leader is unreaped, so its pid (the group id) cannot have been recycled.
    ::kill(-pid_, sig);
  } else {
    ::kill(pid_, sig);
  }
}

std::optional<ExitStatus> Subprocess::TryWait() { return Reap(/*block=*/false); }

ExitStatus Subprocess::Wait() { return *Reap(/*block=*/true); }

std::optional<ExitStatus> Subprocess::Reap(bool block) {
  if (status_.has_value()) return status_;
  // Observe the exit without reaping first: while the leader is a zombie its pid (the
  // group id) cannot be recycled, so stragglers left in its group can be killed safely.
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  int r;
  do {
    r = ::waitid(P_PID, pid_, &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    status_ = ExitStatus{};  // ECHILD: reaped elsewhere; nothing more to learn.
    return status_;
  }
  if (info.si_pid != pid_) return std::nullopt;  // WNOHANG and still running.
  if (process_group_) ::kill(-pid_, SIGKILL);
  int status;
  pid_t w;
  do {
    w = ::waitpid(pid_, &status, 0);
  } while (w < 0 && errno == EINTR);
  status_ = w == pid_ ? FromWaitStatus(status) : ExitStatus{};
  return status_;
}

std::optional<ExitStatus> Subprocess::WaitFor(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    if (auto s = TryWait()) return s;
    if (absl::Now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

ExitStatus Subprocess::Terminate(absl::Duration grace) {
  Signal(SIGTERM);
  if (auto s = WaitFor(grace)) return *s;
  Signal(SIGKILL);
  return Wait();
}

}  // namespace ddp
