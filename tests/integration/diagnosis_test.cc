// A stall explained (decision 193): a real cluster (coordinator, three ddp-worker
// processes, real ranks over Gloo on loopback) where one rank hangs in its data path,
// reading a FIFO the test holds open without writing, while the others wait for it in
// the step's all-reduce. The attempt's reason must name the rank, the collective the
// others wait in and for how long, and that the rank is in data loading: read from the
// ranks' flight recorders by their workers, not guessed from silence. The workers take
// the ranks' stacks before the attempt ends (decision 194): the reason adds where the
// hung rank's main thread is, and `ddpctl diagnose` shows the stacks. A PyTorch program,
// which keeps no recorder, is told from its ranks' Python stacks alone (py-spy): the
// rank blocked in a function of its own while the others wait in all_reduce.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr double kStallTimeoutS = 4;

std::string SubmitOk(LocalCluster& c, const std::string& spec) {
  CtlResult r = c.Ctl({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::string(absl::StripAsciiWhitespace(r.out));
}

// The test's end of the FIFO a rank reads in its data path: Open() blocks until that
// rank opens it for reading (so it returns when the rank starts to hang), and the FIFO
// is then held open without a byte written, so the rank's read blocks until Release().
class StalledSource {
 public:
  explicit StalledSource(const std::string& dir) : path_(dir + "/data.fifo") {
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0) << path_;
    opener_ = std::thread([this] {
      fd_ = ::open(path_.c_str(), O_WRONLY);  // Until the rank opens it to read.
      hung_at_ = absl::Now();
      opened_.Notify();
    });
  }
  ~StalledSource() {
    Release();
    if (!opened_.HasBeenNotified()) {
      // The rank never came: unblock our own open with a reader of our own.
      const int unblock = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK);
      opener_.join();
      if (unblock >= 0) ::close(unblock);
      Release();
    } else {
      opener_.join();
    }
  }
  const std::string& path() const { return path_; }
  // When the rank began to hang; false if it did not within `timeout`.
  bool WaitHung(absl::Duration timeout) { return opened_.WaitForNotificationWithTimeout(timeout); }
  absl::Time hung_at() const { return hung_at_; }
  // Closes the FIFO: the rank's read returns (end of file).
  void Release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
  absl::Time hung_at_;
  absl::Notification opened_;
  std::thread opener_;
};

// The row of `rank` in ddpctl diagnose's table ("" if none).
std::string Row(const std::string& table, int rank) {
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    if (absl::StartsWith(line, absl::StrCat(rank, " "))) return std::string(line);
  }
  return "";
}

// The job's first attempt, once it has failed.
absl::StatusOr<v1::Attempt> WaitFailed(LocalCluster& c, const std::string& id) {
  auto failed = c.WaitFor(id, [](const v1::Job& j) {
    return j.attempts_size() > 0 && j.attempts(0).state() == v1::FAILED;
  });
  if (!failed.ok()) return failed.status();
  return failed->attempts(0);
}

// Waits for the first attempt's failure and checks its reason explains the stall of
// rank 1 in data loading while ranks 0 and 2 wait in an all-reduce.
void ExpectExplainedStall(LocalCluster& c, const std::string& id, StalledSource& source,
                          const char* timeout_field) {
  ASSERT_TRUE(source.WaitHung(absl::Minutes(3))) << "rank 1 never reached its stalled read";
  // ddpctl diagnose while the attempt still runs (the stall timeout is not yet past):
  // rank by rank, live, as the workers read the recorders at their last heartbeats.
  absl::SleepFor(absl::Milliseconds(1500));
  CtlResult live = c.Ctl({"diagnose", id});
  EXPECT_EQ(live.exit_code, 0) << live.err;
  EXPECT_THAT(live.out, HasSubstr("attempt 1: RUNNING")) << live.out;
  EXPECT_THAT(Row(live.out, 0), ContainsRegex(" comm_wait +[0-9.]+s +[-0-9]+ +[0-9]+ +"
                                              "all-reduce #[0-9]+ \\(bucket 0, [0-9.]+ "
                                              "kB\\) +[0-9.]+s"))
      << live.out;
  EXPECT_THAT(Row(live.out, 1), ContainsRegex(" running +data +[0-9.]+s ")) << live.out;
  EXPECT_THAT(Row(live.out, 2), HasSubstr(" comm_wait ")) << live.out;
  auto failed = WaitFailed(c, id);
  ASSERT_TRUE(failed.ok()) << failed.status();
  const absl::Duration took = absl::Now() - source.hung_at();
  const v1::Attempt& a = *failed;
  const std::string& reason = a.reason();
  // Within the stall timeout plus 5 s of the moment rank 1 began to hang (the test saw
  // the attempt's failure after it, so this bounds the coordinator's own time).
  EXPECT_LE(took, absl::Seconds(kStallTimeoutS + 5)) << reason;
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("rank 1 on ", a.ranks(1).worker(), " stalled")));
  EXPECT_THAT(reason, HasSubstr(timeout_field));
  EXPECT_THAT(reason, ContainsRegex("it never entered all-reduce #[0-9]+ \\(bucket 0, "
                                    "[0-9.]+ kB\\), "
                                    "where ranks 0, 2 have waited [0-9.]+s"));
  EXPECT_THAT(reason, ContainsRegex("rank 1 is in data loading \\(for [0-9.]+s"));
  // Its native stack, taken before the attempt ended: the main thread's innermost frames.
  EXPECT_THAT(reason, ContainsRegex("; its stack: [^;]*read")) << reason;
  // The workers stop the ranks (rank 1 still in its read: the job's stop_grace_s is
  // short), and write each one's recorder into the job's log first: rank 0 in the
  // all-reduce rank 1 never entered, rank 1 in data loading. The FIFO stays shut until
  // then (the job is FAILED before its ranks are stopped).
  std::string logs;
  for (const absl::Time until = absl::Now() + absl::Minutes(1); absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(200))) {
    logs = c.Ctl({"logs", id}).out;
    if (absl::StrContains(logs, "rank 0's flight recorder when stopped") &&
        absl::StrContains(logs, "rank 1's flight recorder when stopped")) {
      break;
    }
  }
  source.Release();
  EXPECT_THAT(logs, ContainsRegex("\\[ddp-worker\\] rank 0's flight recorder when stopped: in "
                                  "a communication wait for [0-9.]+s"))
      << logs.substr(logs.size() > 4000 ? logs.size() - 4000 : 0);
  EXPECT_THAT(logs, ContainsRegex("the last, newest first: all-reduce #[0-9]+ \\(bucket 0, "
                                  "[0-9.]+ kB\\) in flight for [0-9.]+ ms"));
  EXPECT_THAT(logs, ContainsRegex("rank 1's flight recorder when stopped: in data loading"));
  // Once the attempt ended, ddpctl diagnose shows its reason and those lines.
  CtlResult after = c.Ctl({"diagnose", id});
  EXPECT_EQ(after.exit_code, 0) << after.err;
  EXPECT_THAT(after.out, HasSubstr(absl::StrCat("attempt 1: FAILED - ", reason)));
  EXPECT_THAT(after.out, HasSubstr("When their workers stopped them:\n"));
  EXPECT_THAT(after.out, ContainsRegex("\n  rank 1's flight recorder when stopped: in data "
                                       "loading for [0-9.]+s"))
      << after.out;
  EXPECT_THAT(after.out, HasSubstr("  rank 0's flight recorder when stopped: in a communication "
                                   "wait"));
  EXPECT_THAT(after.out, HasSubstr("Stacks, as their workers took them:\n"));
  EXPECT_THAT(after.out, ContainsRegex("\n  rank 1's stacks \\(capture 1, pid [0-9]+, eu-stack, "
                                       "[0-9.]+s\\) outside any collective: [^\n]*read"))
      << after.out;
  EXPECT_THAT(after.out, ContainsRegex("\n  Native \\(eu-stack\\), [0-9]+ threads:\n    "
                                       "Thread [0-9]+ \\(main\\):\n      #0 "));
}

TEST(DiagnosisTest, ALibddpRankHungInItsDataPathIsNamedWithTheCollectiveTheOthersWaitIn) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  StalledSource source(c.dir());
  const std::string spec = c.dir() + "/stall.yaml";
  testing::WriteFile(spec, absl::StrCat("name: libddp-stall\nnodes: 3\nmax_restarts: 0\n",
                                        "stop_grace_s: 2\n",
                                        "stall_timeout_s: ", kStallTimeoutS, "\ncommand: [",
                                        DDP_STALL_PROGRAM, ", \"100000\", \"1\", \"30\", \"",
                                        source.path(), "\"]\n"));
  const std::string id = SubmitOk(c, spec);
  ExpectExplainedStall(c, id, source, "stall_timeout_s");
}

TEST(DiagnosisTest, ATrainerRankHungInItsDataPathIsNamedWithTheCollectiveTheOthersWaitIn) {
  const std::string dir = testing::MakeTempDir("diagnosis-trainer");
  StalledSource source(dir);
  // ddp-trainer's test hook: rank 1 reads the FIFO in its data path at global step 30.
  // The workers pass it on (--pass-env) from their environment, inherited from ours.
  ::setenv("DDP_DEBUG_DATA_STALL", absl::StrCat("1:30:", source.path()).c_str(), 1);
  auto cluster = LocalCluster::Start(
      {.workers = 3, .worker_flags = {"--pass-env", "DDP_DEBUG_DATA_STALL"}});
  ::unsetenv("DDP_DEBUG_DATA_STALL");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  const std::string spec = c.dir() + "/stall.yaml";
  testing::WriteFile(spec, absl::StrCat(R"(name: trainer-stall
nodes: 3
max_restarts: 0
stop_grace_s: 2
model: {mlp: {hidden: [32]}}
data: {synthetic: {samples: 20000, features: 16, classes: 4}}
metrics: {every_steps: 5}
train: {epochs: 1, batch_size: 32, threads: 1, stall_timeout_s: )",
                                        kStallTimeoutS, "}\n"));
  const std::string id = SubmitOk(c, spec);
  ExpectExplainedStall(c, id, source, "train.stall_timeout_s");
}

// A PyTorch command job of three ranks where rank 1 blocks forever in block_forever(), a
// function of its own, before an all-reduce: no flight recorder, so the ranks' Python
// stacks tell it. `ddpctl diagnose --now` shows them while it hangs; the stall's reason
// names rank 1 within the stall timeout plus 5 s, with where it is and where the others
// wait.
TEST(DiagnosisTest, APyTorchRankBlockedInItsOwnFunctionIsNamedFromTheRanksPythonStacks) {
  constexpr double kTimeoutS = 8;
  auto cluster =
      LocalCluster::Start({.workers = 3, .worker_flags = {"--py-spy", DDP_PY_SPY}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  StalledSource source(c.dir());
  const std::string spec = c.dir() + "/stall.yaml";
  testing::WriteFile(spec, absl::StrCat("name: python-stall\nnodes: 3\nmax_restarts: 0\n",
                                        "stop_grace_s: 2\nstall_timeout_s: ", kTimeoutS,
                                        "\ncommand: [/usr/bin/python3, ", DDP_STALL_SCRIPT,
                                        ", \"40\", \"1\", \"20\", \"", source.path(), "\"]\n"));
  const std::string id = SubmitOk(c, spec);
  ASSERT_TRUE(source.WaitHung(absl::Minutes(3))) << "rank 1 never reached block_forever";
  // On demand, while it hangs: every rank's stacks, in a table and in full.
  absl::SleepFor(absl::Milliseconds(500));  // Ranks 0 and 2 into their all_reduce.
  const absl::Time asked = absl::Now();
  CtlResult now = c.Ctl({"diagnose", id, "--now"});
  std::cout << "ddpctl diagnose --now (" << absl::Now() - asked << "):\n" << now.out << "\n";
  EXPECT_EQ(now.exit_code, 0) << now.err;
  EXPECT_THAT(now.out, HasSubstr("attempt 1: RUNNING")) << now.out;
  EXPECT_THAT(Row(now.out, 1), ContainsRegex(" block_forever \\(stall_program.py:[0-9]+\\)$"))
      << now.out;
  EXPECT_THAT(Row(now.out, 0), ContainsRegex(" in all_reduce \\([^)]*torch/distributed/"))
      << now.out;
  EXPECT_THAT(Row(now.out, 2), ContainsRegex(" in all_reduce \\(")) << now.out;
  EXPECT_THAT(now.out, ContainsRegex("\n  rank 1's stacks \\(capture 1, pid [0-9]+, py-spy, "
                                     "eu-stack, [0-9.]+s\\) outside any collective: "
                                     "block_forever \\(stall_program.py:[0-9]+\\)\n  Python "
                                     "\\(py-spy\\), [0-9]+ threads?:\n    Thread [0-9]+ "
                                     "\"MainThread\" \\(main\\):\n      block_forever "
                                     "\\(stall_program.py:[0-9]+\\)\n      main "))
      << now.out;
  EXPECT_THAT(now.out, ContainsRegex("\n  rank 0's stacks \\(capture 1, [^\n]* in a collective: "
                                     "all_reduce "));
  // The stall: named from the stacks its workers take when it is suspected.
  auto failed = WaitFailed(c, id);
  ASSERT_TRUE(failed.ok()) << failed.status();
  const absl::Duration took = absl::Now() - source.hung_at();
  const v1::Attempt& a = *failed;
  const std::string& reason = a.reason();
  std::cout << "the reason, " << took << " after rank 1 blocked: " << reason << "\n";
  EXPECT_LE(took, absl::Seconds(kTimeoutS + 5)) << reason;
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("rank 1 on ", a.ranks(1).worker(), " stalled")));
  EXPECT_THAT(reason, ContainsRegex("; ranks 0, 2 wait in all_reduce \\([^)]*torch/distributed/"
                                    "[^)]*\\); rank 1 is outside any collective, in "
                                    "block_forever \\(stall_program.py:[0-9]+\\) \\(their "
                                    "stacks\\)"))
      << reason;
  // After: the reason and the stacks the stall took (capture 2), from the job's log.
  std::string out;
  for (const absl::Time until = absl::Now() + absl::Seconds(30); absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(200))) {
    out = c.Ctl({"diagnose", id}).out;
    if (absl::StrContains(out, "rank 2's stacks (capture 2")) break;
  }
  source.Release();
  EXPECT_THAT(out, HasSubstr(absl::StrCat("attempt 1: FAILED - ", reason)));
  EXPECT_THAT(out, ContainsRegex("\n  rank 1's stacks \\(capture 2, [^\n]*\n  Python [^\n]*\n"
                                 "    Thread [0-9]+ \"MainThread\" \\(main\\):\n      "
                                 "block_forever "))
      << out;
  EXPECT_THAT(out, ContainsRegex("\n  rank 0's stacks \\(capture 2, [^\n]* in a collective"));
  EXPECT_THAT(out, ContainsRegex("\n  rank 2's stacks \\(capture 2, [^\n]* in a collective"));
}

}  // namespace
}  // namespace ddp
