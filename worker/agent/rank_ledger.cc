#include "worker/agent/rank_ledger.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/process.h"

namespace ddp {
namespace {

// This boot, and this PID namespace: pids recorded under another boot, or in another
// container's namespace (a worker pod restarted in a new one), name other processes.
std::string PidSpace() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  std::error_code ec;
  const std::string ns = std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
  return absl::StrCat(boot, " ", ns);
}

}  // namespace

uint64_t ProcessStartTicks(int pid) {
  const std::optional<ProcStat> s = ReadProcStat(pid);
  return s.has_value() ? s->start_ticks : 0;
}

std::vector<int> EndProcessGroup(const LedgerEntry& entry) {
  std::vector<int> ended;
  if (entry.pgid <= 1 || entry.start_ticks == 0) return ended;  // Nothing known to match.
  if (const std::optional<ProcStat> leader = ReadProcStat(entry.pgid);
      leader.has_value() && leader->start_ticks != entry.start_ticks) {
    return ended;  // The number now belongs to another process, and so does the group.
  }
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return ended;
  while (const dirent* d = ::readdir(proc)) {
    int pid;
    if (!absl::SimpleAtoi(d->d_name, &pid) || pid <= 1 || pid == ::getpid()) continue;
    const std::optional<ProcStat> s = ReadProcStat(pid);
    if (!s.has_value() || s->pgrp != entry.pgid || s->state == 'Z') continue;
    if (s->start_ticks < entry.start_ticks) continue;  // Older than the group: not its member.
    if (::kill(pid, SIGKILL) == 0) ended.push_back(pid);
  }
  ::closedir(proc);
  return ended;
}

absl::StatusOr<std::unique_ptr<RankLedger>> RankLedger::Open(const std::string& dir,
                                                            const std::string& worker_name) {
  std::unique_ptr<RankLedger> ledger(new RankLedger());
  ledger->path_ = absl::StrCat(dir, "/ddp-worker-", worker_name, ".ranks");
  ledger->pid_space_ = PidSpace();
  ledger->lock_fd_ = ::open(ledger->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (ledger->lock_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", ledger->path_, ": ",
                                               std::strerror(errno)));
  }
  if (::flock(ledger->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "work dir ", dir, " is in use by another ddp-worker named ", worker_name,
          " (it holds ", ledger->path_, "): stop it, or give this one another --name or "
          "--work-dir"));
    }
    return absl::UnavailableError(absl::StrCat("cannot lock ", ledger->path_, ": ",
                                               std::strerror(errno)));
  }
  // What the previous incarnation wrote last; then this one's (empty) list.
  std::ifstream in(ledger->path_);
  std::string line;
  bool same_space = false;
  while (std::getline(in, line)) {
    if (absl::string_view boot = line; absl::ConsumePrefix(&boot, "boot ")) {
      same_space = boot == ledger->pid_space_;
      continue;
    }
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 4));
    LedgerEntry e;
    if (!same_space || f.size() != 5 || !absl::SimpleAtoi(f[0], &e.pgid) ||
        !absl::SimpleAtoi(f[1], &e.start_ticks) || !absl::SimpleAtoi(f[2], &e.attempt) ||
        !absl::SimpleAtoi(f[3], &e.rank)) {
      continue;
    }
    e.job_id = f[4];
    ledger->previous_.push_back(std::move(e));
  }
  absl::MutexLock lock(&ledger->mu_);
  ledger->WriteLocked();
  return ledger;
}

RankLedger::~RankLedger() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // Releases the lock; the file stays for the next.
}

void RankLedger::Add(LedgerEntry entry) {
  absl::MutexLock lock(&mu_);
  current_.push_back(std::move(entry));
  WriteLocked();
}

void RankLedger::Remove(int pid) {
  absl::MutexLock lock(&mu_);
  for (auto it = current_.begin(); it != current_.end(); ++it) {
    if (it->pgid == pid) {
      current_.erase(it);
      WriteLocked();
      return;
    }
  }
}

void RankLedger::WriteLocked() {
  // Written in place under the lock we hold (a rename would leave the lock on the
  // old inode): truncate, write. A torn write loses at most the entries of this
  // moment, never the lock. Not synced: the next incarnation reads it after this one
  // died (the page cache outlives a kill -9 or an OOM kill), and after a reboot its
  // entries are void anyway. An fdatasync here, on the agent's loop at every rank's
  // start and end, stalled heartbeats for seconds on a busy disk: all three workers
  // of a test were declared lost at once.
  std::ostringstream out;
  out << "boot " << pid_space_ << "\n";
  for (const LedgerEntry& e : current_) {
    out << e.pgid << " " << e.start_ticks << " " << e.attempt << " " << e.rank << " "
        << e.job_id << "\n";
  }
  const std::string text = out.str();
  bool ok = ::ftruncate(lock_fd_, 0) == 0 && ::lseek(lock_fd_, 0, SEEK_SET) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(lock_fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  if (!ok) {
    DDP_LOG(WARNING) << "cannot write " << path_ << " (" << std::strerror(errno)
                     << "): a restarted worker may not find this one's ranks";
  }
}

}  // namespace ddp
