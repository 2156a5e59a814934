// Ports for tests that run side by side (`ctest -j`, docs/testing.md).
//
// A port picked by binding to 0 and closing the socket ("a free port") can be taken
// before the server that is given it binds it: by another test's server, or by any
// outgoing connection, whose local port the kernel draws from the same ephemeral range.
// So tests take their ports from blocks below the ephemeral range, one block at a time,
// each claimed by the test process for as long as it lives: an flock()ed file per block
// under /tmp/ddp-test-ports/ (the lock goes with the process however it ends, SIGKILL
// included). No outgoing connection is given a port there, and no other test that
// claims its ports this way (C++ here, Python in tests/common/ddp_test_ports.py: the
// same files) is given one of this process's. A port is also handed out at most once
// per process, so a server restarted on "its" port never meets another's.
#ifndef DDP_TESTS_COMMON_PORTS_H_
#define DDP_TESTS_COMMON_PORTS_H_

#include "absl/status/statusor.h"
#include "common/net.h"

namespace ddp::testing {

// Ports per block.
inline constexpr int kPortBlockSize = 16;

// A port of this process's blocks that nothing binds now and that this process has not
// handed out before (on 127.0.0.1 and on 0.0.0.0). UNAVAILABLE when no block can be
// claimed (the range below the ephemeral one is too small, or every block is taken).
absl::StatusOr<int> ClaimPort();

// A whole block of its own, for a program that picks its ports itself (ddp-worker's
// --store-ports): none of its ports is handed out by ClaimPort. With `from`, the first
// block not claimed already at or after the one that holds port `from` (its tests').
absl::StatusOr<ddp::PortRange> ClaimPortBlock(int from = 0);

}  // namespace ddp::testing

#endif  // DDP_TESTS_COMMON_PORTS_H_
