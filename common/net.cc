#include "common/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ddp {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& text) {
  HostPort hp;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "' is not HOST:PORT (expected [v6-address]:port)"));
    }
    hp.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "' is not HOST:PORT (for example 127.0.0.1:29400)"));
    }
    hp.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port_text, &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': port must be a number in 0..65535"));
  }
  return hp;
}

absl::StatusOr<int> PickFreePort(const std::string& host) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address to bind");
  for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      struct sockaddr_storage addr;
      socklen_t len = sizeof(addr);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        int port = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
        ::close(fd);
        ::freeaddrinfo(res);
        return port;
      }
    }
    last = absl::UnavailableError(
        absl::StrCat("cannot bind a port on '", host, "': ", std::strerror(errno)));
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return last;
}

absl::StatusOr<PortRange> ParsePortRange(const std::string& text) {
  const size_t dash = text.find('-');
  const std::string lo = dash == std::string::npos ? text : text.substr(0, dash);
  const std::string hi = dash == std::string::npos ? text : text.substr(dash + 1);
  PortRange r;
  if (!absl::SimpleAtoi(lo, &r.first) || !absl::SimpleAtoi(hi, &r.last)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a port range LO-HI (for example 29500-29599)"));
  }
  if (r.first < 1 || r.last > 65535 || r.first > r.last) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "': the ports must be 1..65535, the first not above the last"));
  }
  return r;
}

bool PortIsBindable(int port, uint32_t ipv4) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(ipv4);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

std::string LocalHostname() {
  char buf[256];
  if (::gethostname(buf, sizeof(buf)) != 0) return "localhost";
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

std::string InterfaceOfAddress(const std::string& ip) {
  in_addr v4{};
  in6_addr v6{};
  const bool is4 = inet_pton(AF_INET, ip.c_str(), &v4) == 1;
  const bool is6 = !is4 && inet_pton(AF_INET6, ip.c_str(), &v6) == 1;
  if (!is4 && !is6) return "";
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  std::string name;
  for (ifaddrs* a = all; a != nullptr && name.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (is4 && a->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr) {
      name = a->ifa_name;
    } else if (is6 && a->ifa_addr->sa_family == AF_INET6 &&
               std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6,
                           sizeof(v6)) == 0) {
      name = a->ifa_name;
    }
  }
  freeifaddrs(all);
  return name;
}

}  // namespace ddp
