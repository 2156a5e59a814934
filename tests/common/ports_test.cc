#include "tests/common/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp::testing {
namespace {

std::pair<int, int> EphemeralRange() {
  int lo = 32768, hi = 60999;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  in >> lo >> hi;
  return {lo, hi};
}

TEST(PortsTest, PortsAreOutsideTheEphemeralRangeAndNeverHandedOutTwice) {
  const auto [lo, hi] = EphemeralRange();
  std::set<int> seen;
  for (int i = 0; i < 3 * kPortBlockSize; ++i) {  // Across blocks.
    DDP_ASSERT_OK_AND_ASSIGN(int port, ClaimPort());
    EXPECT_TRUE(port < lo || port > hi) << port << " is in " << lo << "-" << hi;
    EXPECT_TRUE(seen.insert(port).second) << port << " handed out twice";
  }
}

TEST(PortsTest, APortAServerHoldsIsSkippedAndABlockGivenAwayIsNotUsed) {
  DDP_ASSERT_OK_AND_ASSIGN(int port, ClaimPort());
  // Something that does not claim its ports listens on the next one.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port + 1));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  DDP_ASSERT_OK_AND_ASSIGN(PortRange block, ClaimPortBlock());
  EXPECT_EQ(block.size(), kPortBlockSize);
  for (int i = 0; i < 2 * kPortBlockSize; ++i) {
    DDP_ASSERT_OK_AND_ASSIGN(int next, ClaimPort());
    EXPECT_NE(next, port + 1) << "a port a server holds";
    EXPECT_TRUE(next < block.first || next > block.last)
        << next << " is of a block ClaimPortBlock gave away";
  }
  ::close(fd);
}

TEST(PortsTest, ABlockAnotherProcessHoldsIsNotClaimed) {
  // Python's half (ddp_test_ports.py, the same lock files) claims a block and holds it
  // while it sleeps; a claim from that block on goes to the next one, and once the
  // other process is gone its block can be claimed again.
  SpawnOptions o;
  o.argv = {DDP_PYTHON3, "-c",
            absl::StrCat("import sys, time; sys.path.insert(0, '", DDP_SOURCE_DIR,
                         "/tests/common'); from ddp_test_ports import claim_port_block; "
                         "print(claim_port_block()[0], flush=True); time.sleep(60)")};
  o.capture_stdout = true;
  DDP_ASSERT_OK_AND_ASSIGN(auto child, Subprocess::Spawn(o));
  std::string line;
  char c;
  while (::read(child->stdout_fd(), &c, 1) == 1 && c != '\n') line += c;
  int theirs = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &theirs)) << line;
  DDP_ASSERT_OK_AND_ASSIGN(PortRange next, ClaimPortBlock(theirs));
  EXPECT_NE(next.first, theirs) << "the block the other process holds";
  child->Signal(SIGKILL);
  child->Wait();
  DDP_ASSERT_OK_AND_ASSIGN(PortRange again, ClaimPortBlock(theirs));
  EXPECT_EQ(again.first, theirs) << "its lock went with the process";
}

}  // namespace
}  // namespace ddp::testing
