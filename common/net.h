// Host:port parsing and port probing shared by the daemons, ddpctl and tests.
#ifndef DDP_COMMON_NET_H_
#define DDP_COMMON_NET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ddp {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "[::1]:80" for IPv6 literals.
};

// Parses "host:port", "[v6]:port" or ":port" (host empty). Port 0 is allowed
// ("pick one"). Errors name the input: INVALID_ARGUMENT.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text);

// Asks the kernel for a currently free TCP port on `host` (bind to port 0, read it,
// close). Another process may take it before it is used, exactly as with torchrun's
// free-port probe; users of the port must treat a bind failure as retryable.
absl::StatusOr<int> PickFreePort(const std::string& host = "127.0.0.1");

// A range of ports, "LO-HI" (inclusive) or one port "P", as ddp-worker's --store-ports
// takes it: 1 <= LO <= HI <= 65535. Errors name the input: INVALID_ARGUMENT.
struct PortRange {
  int first = 0;
  int last = 0;  // Inclusive.
  int size() const { return last - first + 1; }
};
absl::StatusOr<PortRange> ParsePortRange(const std::string& text);

// Whether a TCP socket can bind `port` right now on `ipv4` (host byte order; 0, the
// default, is every interface: 0.0.0.0).
bool PortIsBindable(int port, uint32_t ipv4 = 0);

// Whether `host` (as ParseHostPort returns it) names only this machine: "localhost",
// 127.0.0.0/8 or ::1. Empty, "0.0.0.0", "::" and every other name are not: they
// listen on (or reach) other machines' networks too.
bool IsLoopbackHost(const std::string& host);

// The machine's host name, for worker registration defaults.
std::string LocalHostname();

// The name of this machine's network interface that holds the address `ip` (an IPv4
// or IPv6 literal: "10.0.0.2" -> "eth0", "127.0.0.1" -> "lo"); empty when no interface
// holds it or `ip` is not an address literal.
std::string InterfaceOfAddress(const std::string& ip);

}  // namespace ddp

#endif  // DDP_COMMON_NET_H_
