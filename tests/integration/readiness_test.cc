// The daemons as systemd runs them (Type=notify): a real ddp-coordinator and
// ddp-worker started with NOTIFY_SOCKET pointing at a datagram socket of this test,
// which plays systemd's part. Also: --version on every binary.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// systemd's end of sd_notify: a bound AF_UNIX datagram socket in a scratch directory.
class NotifySocket {
 public:
  NotifySocket() {
    char tmpl[] = "/tmp/ddp-notify-XXXXXX";  // Short: sun_path holds 108 bytes.
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/notify";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    close(fd_);
    std::filesystem::remove_all(dir_);
  }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }

  // Reads messages until one contains `needle` (returns it) or `timeout` passes ("").
  std::string WaitFor(const std::string& needle, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      pollfd p = {fd_, POLLIN, 0};
      const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
      if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      std::string msg(buf, static_cast<size_t>(n));
      received_ += msg + "\n";
      if (absl::StrContains(msg, needle)) return msg;
    }
    return "";
  }
  const std::string& received() const { return received_; }

 private:
  std::string dir_, path_, received_;
  int fd_ = -1;
  bool bound_ = false;
};

bool Connectable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

TEST(ReadinessTest, CoordinatorIsReadyOnceServingAndWorkerOnceRegistered) {
  NotifySocket notify;
  ASSERT_TRUE(notify.bound());
  const std::string dir = ::ddp::testing::MakeTempDir("readiness");
  auto port = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(port.ok());
  const std::string bin = ::ddp::testing::BinDir();

  SpawnOptions co;
  co.argv = {bin + "/ddp-coordinator", "--listen", absl::StrCat("127.0.0.1:", *port),
             "--state-dir", dir + "/state"};
  co.env["NOTIFY_SOCKET"] = notify.path();
  auto coordinator = Subprocess::Spawn(co);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string ready = notify.WaitFor("READY=1", absl::Minutes(1));
  ASSERT_FALSE(ready.empty()) << "got: " << notify.received();
  EXPECT_THAT(ready, HasSubstr(absl::StrCat("STATUS=serving on port ", *port)));
  EXPECT_TRUE(Connectable(*port)) << "READY=1 came before the port was open";

  SpawnOptions wo;
  wo.argv = {bin + "/ddp-worker", "--coordinator", absl::StrCat("127.0.0.1:", *port), "--name",
             "ready-w1", "--slots", "1", "--work-dir", dir + "/w1"};
  wo.env["NOTIFY_SOCKET"] = notify.path();
  auto worker = Subprocess::Spawn(wo);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string registered = notify.WaitFor("READY=1", absl::Minutes(1));
  ASSERT_FALSE(registered.empty()) << "got: " << notify.received();
  EXPECT_THAT(registered, HasSubstr("STATUS=registered with 127.0.0.1:"));

  // On SIGTERM each says it is stopping before it exits 0.
  (*worker)->Signal(SIGTERM);
  EXPECT_FALSE(notify.WaitFor("STOPPING=1", absl::Minutes(1)).empty());
  EXPECT_TRUE((*worker)->Wait().ok());
  (*coordinator)->Signal(SIGTERM);
  EXPECT_FALSE(notify.WaitFor("STOPPING=1", absl::Minutes(1)).empty());
  EXPECT_TRUE((*coordinator)->Wait().ok());
  std::filesystem::remove_all(dir);
}

TEST(VersionFlagTest, EveryBinaryPrintsTheProjectVersionAndCommit) {
  for (const char* name : {"ddp-coordinator", "ddp-worker", "ddp-trainer", "ddpctl"}) {
    auto r = ::ddp::testing::RunCapture({::ddp::testing::BinDir() + "/" + name, "--version"},
                                        absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_EQ(r.out, absl::StrCat(name, " ", VersionString(), "\n"));
    EXPECT_THAT(r.out, HasSubstr(kVersion));
  }
}

}  // namespace
}  // namespace ddp
