#include "tests/common/probes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/health_client.h"

namespace ddp::testing {

absl::StatusOr<std::string> HttpGet(int port, const std::string& target,
                                    absl::Duration timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval tv = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string request =
      absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return absl::UnavailableError("send");
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("no HTTP answer from port ", port));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200")) {
    return absl::UnavailableError(absl::StrCat(status_line, ": ", response.substr(header_end + 4)));
  }
  return response.substr(header_end + 4);
}

absl::StatusOr<bool> HealthCheck(int port, const std::string& service) {
  return CheckHealth(absl::StrCat("127.0.0.1:", port), service, absl::Seconds(5));
}

absl::Status WaitForHealth(int port, const std::string& service, bool serving,
                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    absl::StatusOr<bool> got = HealthCheck(port, service);
    if (got.ok() && *got == serving) return absl::OkStatus();
    last = got.ok() ? (*got ? "SERVING" : "NOT_SERVING") : std::string(got.status().message());
    // The state lives in another thread or process: ask again shortly.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("health \"", service, "\" on port ", port,
                                                  " did not turn ",
                                                  serving ? "SERVING" : "NOT_SERVING", ": ", last));
}

}  // namespace ddp::testing
