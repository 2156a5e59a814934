#include "tests/common/ports.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ddp::testing {
namespace {

constexpr char kLockDir[] = "/tmp/ddp-test-ports";
constexpr int kLowest = 20000;

// The starts of the blocks this machine allows: below the kernel's ephemeral range
// (from 20000) and above it, never inside it.
std::vector<int> BlockStarts() {
  int eph_lo = 32768, eph_hi = 60999;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(in >> eph_lo >> eph_hi)) {
    eph_lo = 32768;
    eph_hi = 60999;
  }
  std::vector<int> starts;
  for (int p = kLowest; p + kPortBlockSize <= eph_lo; p += kPortBlockSize) starts.push_back(p);
  for (int p = std::max(eph_hi + 1, kLowest); p + kPortBlockSize <= 65536; p += kPortBlockSize) {
    starts.push_back(p);
  }
  return starts;
}

bool Free(int port) {
  return ddp::PortIsBindable(port) && ddp::PortIsBindable(port, INADDR_LOOPBACK);
}

class PortBook {
 public:
  absl::StatusOr<int> Port() {
    absl::MutexLock lock(&mu_);
    for (int tries = 0; tries < 64; ++tries) {
      while (next_ < end_) {
        const int port = next_++;
        if (Free(port)) return port;
      }
      absl::StatusOr<ddp::PortRange> block = ClaimLocked();
      if (!block.ok()) return block.status();
      next_ = block->first;
      end_ = block->last + 1;
    }
    return absl::UnavailableError("no free port in 64 claimed blocks of test ports");
  }

  absl::StatusOr<ddp::PortRange> Block(int from) {
    absl::MutexLock lock(&mu_);
    if (from > 0) {
      Init();
      for (size_t i = 0; i < starts_.size(); ++i) {
        if (starts_[i] <= from && from < starts_[i] + kPortBlockSize) cursor_ = i;
      }
    }
    return ClaimLocked();
  }

 private:
  // Takes the lock of a block no other process holds (kept until this process ends).
  void Init() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!starts_.empty()) return;
    starts_ = BlockStarts();
    if (starts_.empty()) return;
    std::random_device rd;
    cursor_ = std::uniform_int_distribution<size_t>(0, starts_.size() - 1)(rd);
    ::mkdir(kLockDir, 01777);
    ::chmod(kLockDir, 01777);  // Past the umask: every user's tests share the claims.
  }

  absl::StatusOr<ddp::PortRange> ClaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Init();
    if (starts_.empty()) {
      return absl::UnavailableError(
          "no ports for tests outside the kernel's ephemeral range "
          "(/proc/sys/net/ipv4/ip_local_port_range): leave 20000-32767 or the ports above "
          "it out of that range");
    }
    for (size_t n = 0; n < starts_.size(); ++n) {
      const int start = starts_[cursor_];
      cursor_ = (cursor_ + 1) % starts_.size();
      const std::string path = absl::StrCat(kLockDir, "/block-", start, ".lock");
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        ::fchmod(fd, 0666);
        return ddp::PortRange{start, start + kPortBlockSize - 1};  // fd stays open: the claim.
      }
      ::close(fd);
    }
    return absl::UnavailableError(absl::StrCat("every block of test ports in ", kLockDir,
                                               " is claimed by another process"));
  }

  absl::Mutex mu_;
  std::vector<int> starts_ ABSL_GUARDED_BY(mu_);
  size_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  int end_ ABSL_GUARDED_BY(mu_) = 0;
};

PortBook& Book() {
  static PortBook* book = new PortBook();
  return *book;
}

}  // namespace

absl::StatusOr<int> ClaimPort() { return Book().Port(); }

absl::StatusOr<ddp::PortRange> ClaimPortBlock(int from) { return Book().Block(from); }

}  // namespace ddp::testing
