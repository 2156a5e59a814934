// How a rank's Comm waits for its collectives (libddp/engine/comm.h, Comm::Wait):
// under ddp-worker, a collective that a silent peer never joins ends as soon as the
// attempt's next generation is announced in the generation file, not at the collective
// timeout, and dropping the group that still holds it does not wait for it; without an
// announcement the collective timeout still bounds the wait. Ranks are processes
// (fork), each with its own Gloo group on loopback; the "silent" peer lives on with
// its sockets open and simply never enters the collective, as a rank on a host cut off
// from the network looks to the others.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libddp/engine/comm.h"
#include "tests/common/ports.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The worker replaces the generation file atomically; so does the test.
void WriteFileAtomically(const std::string& path, const std::string& text) {
  testing::WriteFile(path + ".tmp", text);
  ASSERT_EQ(std::rename((path + ".tmp").c_str(), path.c_str()), 0);
}

bool WaitForFile(const std::string& path, double seconds) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < seconds) {
    if (access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Rank 0's report: the seconds its second all-reduce waited, the seconds dropping the
// group took, and the wait's status.
struct Report {
  double waited = -1, dropped = -1;
  std::string status;
};

class CommWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("comm-wait");  // Removed when the test process exits.
    absl::StatusOr<int> port = testing::ClaimPort();
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }
  void TearDown() override {
    for (pid_t pid : {silent_, waiter_}) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Rank `rank` of two: one all-reduce both ranks join (its sum checked), then rank 1
  // goes silent and rank 0 starts a second all-reduce; rank 0 writes what that wait
  // returned, its seconds, and how long dropping the group took into `result`.
  pid_t StartRank(int rank, bool generation_file, std::chrono::milliseconds timeout) {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    Environment env;
    env.rank = env.local_rank = env.group_rank = rank;
    env.world_size = 2;
    env.local_world_size = 1;
    env.master_addr = "127.0.0.1";
    env.master_port = port_;
    env.job_id = "comm-wait-test";
    if (generation_file) env.generation_file = Path("generation");
    CommOptions options;
    options.collective_timeout = timeout;
    options.intra_node = CommOptions::IntraNode::kGloo;
    absl::StatusOr<Comm> comm = Comm::Connect(env, DeviceChoice{at::kCPU, "gloo"}, options);
    if (!comm.ok()) {
      std::ofstream(Path(absl::StrCat("result", rank))) << "connect: " << comm.status();
      _exit(1);
    }
    at::Tensor t = at::full({1000}, static_cast<double>(rank + 1), at::kDouble);
    absl::Status first = comm->AllReduceSum(t);
    if (!first.ok() || t[999].item<double>() != 3.0) {
      std::ofstream(Path(absl::StrCat("result", rank)))
          << "first all-reduce: " << first << " sum " << t[999].item<double>();
      _exit(1);
    }
    if (rank == 1) {
      std::ofstream(Path("silent")) << "1";
      pause();  // Silent: alive, sockets open, never in the collective.
      _exit(0);
    }
    std::ofstream(Path("waiting")) << "1";
    const auto t0 = Clock::now();
    absl::Status second = comm->AllReduceSum(t);
    const double waited = SecondsSince(t0);
    const auto t1 = Clock::now();
    { Comm dropped = *std::move(comm); }  // As a survivor drops its group to recover.
    std::ofstream(Path("result0")) << waited << " " << SecondsSince(t1) << " " << second;
    _exit(0);
  }

  // Starts both ranks and waits until rank 0 is in its second all-reduce.
  void StartBoth(bool generation_file, std::chrono::milliseconds timeout) {
    silent_ = StartRank(1, generation_file, timeout);
    waiter_ = StartRank(0, generation_file, timeout);
    ASSERT_TRUE(WaitForFile(Path("waiting"), 60) && WaitForFile(Path("silent"), 10))
        << "rank 0: " << testing::ReadFile(Path("result0")) << "; rank 1: " << testing::ReadFile(Path("result1"));
  }

  Report AwaitRank0(double seconds) {
    Report r;
    const auto t0 = Clock::now();
    int wstatus = 0;
    while (SecondsSince(t0) < seconds) {
      if (waitpid(waiter_, &wstatus, WNOHANG) == waiter_) {
        waiter_ = -1;
        std::istringstream in(testing::ReadFile(Path("result0")));
        in >> r.waited >> r.dropped;
        std::getline(in, r.status);
        return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    r.status = absl::StrCat("rank 0 still waiting after ", seconds, " s");
    return r;
  }

  std::string dir_;
  int port_ = 0;
  pid_t silent_ = -1, waiter_ = -1;
};

TEST_F(CommWaitTest, ANewGenerationEndsAWaitForASilentPeerAtOnce) {
  StartBoth(/*generation_file=*/true, std::chrono::seconds(60));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // Mid-poll.
  const auto announced = Clock::now();
  WriteFileAtomically(Path("generation"), absl::StrCat("1 127.0.0.1 ", port_ + 1, "\n"));
  const Report r = AwaitRank0(20);
  const double after = SecondsSince(announced);
  std::printf("rank 0 left its all-reduce %.3f s after the announcement (%.3f s in it); "
              "dropping the group took %.3f s\n", after, r.waited, r.dropped);
  EXPECT_TRUE(absl::StrContains(r.status, "UNAVAILABLE") &&
              absl::StrContains(r.status, "all-reduce abandoned: generation 1 was announced"))
      << r.status;
  // The poll is every 250 ms; the collective timeout (60 s) is far away.
  EXPECT_LT(after, 3.0) << "rank 0 returned " << after << " s after the announcement";
  EXPECT_GE(r.waited, 0.9) << "the wait ended before the announcement: " << r.status;
  EXPECT_LT(r.dropped, 1.0) << "dropping the group waited for the abandoned collective";
}

// The wait of a group whose collective timeout is 2 s ended by that timeout.
void ExpectEndedByTheCollectiveTimeout(const Report& r) {
  EXPECT_TRUE(absl::StrContains(r.status, "UNAVAILABLE") &&
              absl::StrContains(r.status, "past train.collective_timeout_s"))
      << r.status;
  EXPECT_GE(r.waited, 1.9) << r.status;
  EXPECT_LT(r.waited, 10.0) << r.status;
}

TEST_F(CommWaitTest, AnOlderGenerationLeavesTheWaitToTheCollectiveTimeout) {
  // The worker's file names the generation this rank is in already: nothing new.
  WriteFileAtomically(Path("generation"), absl::StrCat("0 127.0.0.1 ", port_, "\n"));
  StartBoth(/*generation_file=*/true, std::chrono::milliseconds(2000));
  ExpectEndedByTheCollectiveTimeout(AwaitRank0(30));
}

TEST_F(CommWaitTest, WithoutAGenerationFileTheCollectiveTimeoutBoundsTheWait) {
  StartBoth(/*generation_file=*/false, std::chrono::milliseconds(2000));
  ExpectEndedByTheCollectiveTimeout(AwaitRank0(30));
}

}  // namespace
}  // namespace ddp
