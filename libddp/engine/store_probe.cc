#include "libddp/engine/store_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// One non-blocking connect attempt to `addr`, bounded by `limit`.
bool TryConnect(const addrinfo& addr, absl::Duration limit) {
  const int fd = ::socket(addr.ai_family, addr.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          addr.ai_protocol);
  if (fd < 0) return false;
  bool ok = ::connect(fd, addr.ai_addr, addr.ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(limit)) + 1) == 1) {
      int err = 0;
      socklen_t len = sizeof(err);
      ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

absl::Status WaitForTcpListener(const std::string& host, int port, absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int err = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(err)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(2);
  absl::Status status = absl::OkStatus();
  while (true) {
    bool connected = false;
    for (addrinfo* a = found; a != nullptr && !connected; a = a->ai_next) {
      connected = TryConnect(*a, std::min(absl::Seconds(1), deadline - absl::Now()));
    }
    if (connected) break;
    if (absl::Now() + backoff > deadline) {
      status = absl::DeadlineExceededError(
          absl::StrCat("nothing listens on ", host, ":", port, " after ",
                       absl::FormatDuration(timeout)));
      break;
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
  ::freeaddrinfo(found);
  return status;
}

}  // namespace ddp
