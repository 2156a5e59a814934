// The trainer's wait for the rendezvous store's listener (store_probe.h).
#include "libddp/engine/store_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;

// A listening socket on 127.0.0.1 and a kernel-chosen port.
struct Listener {
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  int fd = -1;
  int port = 0;
};

TEST(StoreProbeTest, ReturnsOnceSomethingListens) {
  Listener listener;
  EXPECT_TRUE(WaitForTcpListener("127.0.0.1", listener.port, absl::Seconds(30)).ok());
  EXPECT_TRUE(WaitForTcpListener("localhost", listener.port, absl::Seconds(30)).ok());
}

TEST(StoreProbeTest, GivesUpAfterItsTimeoutWhenNothingListens) {
  int port = 0;
  {
    Listener gone;  // Closed again: nothing listens on its port now.
    port = gone.port;
  }
  EXPECT_THAT(WaitForTcpListener("127.0.0.1", port, absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(StoreProbeTest, AnUnknownHostIsAnError) {
  EXPECT_THAT(WaitForTcpListener("no-such-host.invalid", 1, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ddp
