// The process groups that one incarnation of ddp-worker started, in a file of its work
// dir, so that the next incarnation (after kill -9, a crash or an OOM kill of the
// agent) ends what is left of them.
//
// Every rank process leads a process group of its own (common/process.h), and dies
// with the agent (PR_SET_PDEATHSIG). What it started itself (a data-loader process, a
// shell's child) stays in its group but does not die with it: after a kill -9 of the
// agent it would live on with PPID 1, holding memory, GPUs and ports. The ledger
// records each group as it is made and forgets it once the task is gone; a restarted
// worker (same --name, same --work-dir) reads what its predecessor left and ends it
// before it registers.
//
// Lifecycle: Open() takes an exclusive lock on <dir>/ddp-worker-<name>.ranks for the
// life of the object (a second live agent of that name and dir is refused, so it can
// never end the first one's ranks), reads the previous incarnation's entries
// (previous()) and starts a new file. Add()/Remove() rewrite it in place. Entries of
// another boot, or of another PID namespace (a worker container restarted in a new
// one), are void: their pids name other processes, and a reboot or the container
// runtime ended theirs.
//
// What it cannot catch: a process that left its group (setsid, setpgid); the
// systemd unit (KillMode=mixed) and the pod's cgroup are the backstop for those.
#ifndef DDP_WORKER_AGENT_RANK_LEDGER_H_
#define DDP_WORKER_AGENT_RANK_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ddp {

struct LedgerEntry {
  int pgid = 0;               // The rank process's pid, which leads its group.
  uint64_t start_ticks = 0;   // Its start time (/proc/PID/stat field 22).
  std::string job_id;
  int attempt = 0;
  int rank = 0;
};

class RankLedger {
 public:
  // FAILED_PRECONDITION when another live process holds the ledger (another
  // ddp-worker with this name and work dir); UNAVAILABLE when the file cannot be
  // created or locked.
  static absl::StatusOr<std::unique_ptr<RankLedger>> Open(const std::string& dir,
                                                          const std::string& worker_name);
  ~RankLedger();
  RankLedger(const RankLedger&) = delete;
  RankLedger& operator=(const RankLedger&) = delete;

  // The previous incarnation's groups, as it left them (this boot's and PID
  // namespace's only).
  const std::vector<LedgerEntry>& previous() const { return previous_; }
  const std::string& path() const { return path_; }

  // Records a group. Thread-safe; a write error is logged, never fatal: the ledger is
  // a backstop, not a condition of running.
  void Add(LedgerEntry entry);
  // Forgets the group led by `pid`.
  void Remove(int pid);

 private:
  RankLedger() = default;
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string path_;
  std::string pid_space_;  // Boot id and PID namespace: where the pids mean something.
  int lock_fd_ = -1;
  std::vector<LedgerEntry> previous_;
  absl::Mutex mu_;
  std::vector<LedgerEntry> current_ ABSL_GUARDED_BY(mu_);
};

// The start time of process `pid` in clock ticks since boot, 0 if it is gone.
uint64_t ProcessStartTicks(int pid);

// Sends SIGKILL to every process still in `entry`'s group that belongs to it: its
// pgrp is entry.pgid and it started no earlier than the group's leader did (a pid is
// not reused while a group holds it, so members that old are the leader's). The
// leader itself is ended only if it is the same process (same start time); zombies
// are skipped (already dead). Returns
// the pids signalled. Nothing, for an entry without a start time.
std::vector<int> EndProcessGroup(const LedgerEntry& entry);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_RANK_LEDGER_H_
