#include "tests/common/run_captured.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "absl/time/clock.h"

namespace ddp::testing {

absl::StatusOr<CapturedRun> RunCaptured(SpawnOptions options, absl::Duration timeout) {
  options.capture_stdout = true;
  options.capture_stderr = true;
  auto proc = Subprocess::Spawn(options);
  if (!proc.ok()) return proc.status();
  CapturedRun r;
  const absl::Time deadline = absl::Now() + timeout;
  int fds[2] = {(*proc)->stdout_fd(), (*proc)->stderr_fd()};
  std::string* sinks[2] = {&r.out, &r.err};
  int open = 2;
  while (open > 0) {
    pollfd p[2];
    int which[2];
    int n = 0;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0) continue;
      p[n] = {fds[i], POLLIN, 0};
      which[n++] = i;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      r.timed_out = true;
      (*proc)->Signal(SIGKILL);
      break;
    }
    if (::poll(p, static_cast<nfds_t>(n), static_cast<int>(std::min<int64_t>(left, 1000))) < 0) {
      continue;  // EINTR
    }
    for (int k = 0; k < n; ++k) {
      if (p[k].revents == 0) continue;
      char buf[8192];
      const ssize_t got = ::read(p[k].fd, buf, sizeof(buf));
      if (got > 0) {
        sinks[which[k]]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        fds[which[k]] = -1;
        --open;
      }
    }
  }
  r.exit = (*proc)->Wait();
  return r;
}

}  // namespace ddp::testing
