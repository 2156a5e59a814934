// Child processes with captured output, as the worker agent spawns ddp-trainer and as
// tests spawn the daemons.
//
// Lifecycle: Spawn() forks and execs; the caller reads the pipes it asked for, sends
// signals, and reaps the child with TryWait()/Wait(). Destroying a Subprocess whose
// child still runs kills its process group with SIGKILL and reaps it, so no child
// outlives its owner by accident.
//
// Orphan protection: with `die_with_parent` the child gets PR_SET_PDEATHSIG(SIGKILL).
// Linux ties that signal to the *thread* that forked, so spawn from a thread that lives
// as long as the children should (the agent's main loop, a test's main thread).
#ifndef DDP_COMMON_PROCESS_H_
#define DDP_COMMON_PROCESS_H_

#include <sys/types.h>

#include <cstdint>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the program path, unless `program` is set.
  // The file to execute, when it is not argv[0] (argv[0] is then only the name the
  // program sees).
  std::string program;
  // The child's environment: the parent's (when inherit_env) with these set on top.
  bool inherit_env = true;
  std::map<std::string, std::string> env;
  std::vector<std::string> unset_env;
  std::string cwd;  // Empty: the parent's.
  bool capture_stdout = false;
  bool capture_stderr = false;
  // Creates a pipe whose write end is the child's file descriptor `events_fd`
  // (e.g. 3, announced to the trainer as DDP_EVENTS_FD=3).
  int events_fd = -1;
  // The child leads a new process group so signals reach everything it starts.
  bool new_process_group = true;
  bool die_with_parent = true;
  // The parent and its descendants may ptrace the child where Yama restricts ptrace
  // to ancestors (PR_SET_PTRACER): the worker's stack tools attach to its ranks.
  bool traceable_by_parent = false;
};

struct ExitStatus {
  int exit_code = -1;  // Valid when signal == 0.
  int signal = 0;      // Signal that killed the child, 0 if it exited.
  bool ok() const { return signal == 0 && exit_code == 0; }
  // Shell convention: the exit code, or 128 + signal.
  int ShellCode() const { return signal ? 128 + signal : exit_code; }
  std::string ToString() const;  // "exit 1" or "killed by SIGKILL"
};

// What /proc/PID/stat says of a process (any process, not only our children).
struct ProcStat {
  char state = '?';          // R, S, D, T (stopped), t (traced), Z (zombie), ...
  int pgrp = 0;              // Its process group.
  uint64_t start_ticks = 0;  // Its start time, in clock ticks since boot.
};
// nullopt when the process is gone or /proc cannot tell.
std::optional<ProcStat> ReadProcStat(pid_t pid);

class Subprocess {
 public:
  // Errors: INVALID_ARGUMENT for an empty argv, NOT_FOUND / PERMISSION_DENIED /
  // FAILED_PRECONDITION (not an executable format, ...) when the program cannot be
  // executed, INTERNAL when fork/pipe fail.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const SpawnOptions& options);

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Read ends of the captured pipes (-1 when not captured). Owned by this object;
  // Release*() hands ownership to the caller.
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  int events_fd() const { return events_fd_; }
  int ReleaseStdout();
  int ReleaseStderr();
  int ReleaseEvents();

  // Sends `sig` to the child's process group (or the child alone without one).
  // No-op once the child has been reaped.
  void Signal(int sig);
  // Non-blocking reap. Returns the status once the child has exited.
  std::optional<ExitStatus> TryWait();
  // Blocks until the child exits.
  ExitStatus Wait();
  // Waits up to `timeout`; nullopt if still running.
  std::optional<ExitStatus> WaitFor(absl::Duration timeout);
  // SIGTERM, then SIGKILL after `grace` if it has not exited; returns its status.
  ExitStatus Terminate(absl::Duration grace);

 private:
  Subprocess() = default;
  // Reaps the child (blocking or not); kills what is left of its process group first.
  std::optional<ExitStatus> Reap(bool block);

  pid_t pid_ = -1;
  bool process_group_ = false;
  std::optional<ExitStatus> status_;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  int events_fd_ = -1;
};

// Splits a byte stream into lines. Feed() appends raw bytes; complete lines come out
// of the callback without their '\n'. Lines longer than `max_line` are cut in pieces
// so a child that never prints a newline cannot grow memory without bound.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  template <typename Fn>
  void Feed(const char* data, size_t n, Fn&& on_line) {
    for (size_t i = 0; i < n; ++i) {
      if (data[i] == '\n') {
        on_line(pending_);
        pending_.clear();
      } else {
        pending_ += data[i];
        if (pending_.size() >= max_line_) {
          on_line(pending_);
          pending_.clear();
        }
      }
    }
  }
  // Emits a final unterminated line, if any.
  template <typename Fn>
  void Flush(Fn&& on_line) {
    if (!pending_.empty()) on_line(pending_);
    pending_.clear();
  }

 private:
  size_t max_line_;
  std::string pending_;
};

}  // namespace ddp

#endif  // DDP_COMMON_PROCESS_H_
