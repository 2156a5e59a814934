// The rank ledger (worker/agent/rank_ledger.h): a worker killed with kill -9 leaves
// its ranks' children behind with PPID 1; the next incarnation (same name and work
// dir) finds their process groups in the ledger and ends them, and touches nothing
// that is not theirs.
#include "worker/agent/rank_ledger.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Gone, or a zombie nobody reaps yet: either way it runs no more.
bool Ended(int pid) {
  const std::optional<ProcStat> s = ReadProcStat(pid);
  return !s.has_value() || s->state == 'Z';
}

bool WaitEnded(int pid) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!Ended(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return Ended(pid);
}

class RankLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ddp::testing::MakeTempDir("rank-ledger"); }
  void TearDown() override {
    for (int pid : spawned_) ::kill(pid, SIGKILL);
    std::filesystem::remove_all(dir_);
  }

  // A rank as a user's program makes one: a group leader (the "rank") with a child
  // in its group, the leader then killed alone, as PR_SET_PDEATHSIG kills a rank with
  // its worker. Returns the leader's entry and the child's pid.
  std::pair<LedgerEntry, int> RankThatLeavesAChild() {
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!; exec sleep 300"};
    o.capture_stdout = true;
    auto proc = Subprocess::Spawn(o);
    EXPECT_TRUE(proc.ok()) << proc.status();
    LedgerEntry e;
    e.pgid = (*proc)->pid();
    e.start_ticks = ProcessStartTicks(e.pgid);
    e.job_id = "job-1";
    e.attempt = 2;
    e.rank = 1;
    std::string out;
    char c;
    while (out.find('\n') == std::string::npos && ::read((*proc)->stdout_fd(), &c, 1) == 1) {
      out.push_back(c);
    }
    ::kill(e.pgid, SIGKILL);  // The leader only; a zombie until the test ends.
    EXPECT_TRUE(WaitEnded(e.pgid));
    leaders_.push_back(std::move(*proc));
    int child = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(out), &child)) << out;
    spawned_.push_back(child);
    return {e, child};
  }

  std::string dir_;
  std::vector<int> spawned_;
  std::vector<std::unique_ptr<Subprocess>> leaders_;  // Reaped (with their groups) at the end.
};

TEST_F(RankLedgerTest, ARestartedWorkerEndsWhatItsPredecessorsRanksLeft) {
  auto [entry, child] = RankThatLeavesAChild();
  ASSERT_GT(entry.start_ticks, 0u);
  {
    auto first = RankLedger::Open(dir_, "node-a");
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_THAT((*first)->previous(), IsEmpty());
    (*first)->Add(entry);
    // Killed here: no Remove(), the file stays as it was.
  }
  ASSERT_FALSE(Ended(child)) << "the child outlived its rank, as in the report";
  auto second = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ((*second)->previous().size(), 1u);
  const LedgerEntry& found = (*second)->previous()[0];
  EXPECT_EQ(found.pgid, entry.pgid);
  EXPECT_EQ(found.job_id, "job-1");
  EXPECT_EQ(found.attempt, 2);
  EXPECT_EQ(found.rank, 1);
  EXPECT_THAT(EndProcessGroup(found), ElementsAre(child));
  EXPECT_TRUE(WaitEnded(child));
  // The new incarnation starts its own list: a third finds nothing of the first.
  second->reset();
  auto third = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(third.ok());
  EXPECT_THAT((*third)->previous(), IsEmpty());
}

TEST_F(RankLedgerTest, AGroupRemovedWhenItsTaskEndedIsNotRecalled) {
  auto ledger = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(ledger.ok());
  (*ledger)->Add({4242, 7, "job-1", 1, 0});
  (*ledger)->Add({4343, 8, "job-2", 1, 0});
  (*ledger)->Remove(4242);
  ledger->reset();
  auto next = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(next.ok());
  ASSERT_EQ((*next)->previous().size(), 1u);
  EXPECT_EQ((*next)->previous()[0].job_id, "job-2");
}

TEST_F(RankLedgerTest, ASecondLiveWorkerOfTheSameNameAndDirIsRefused) {
  auto first = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(RankLedger::Open(dir_, "node-a").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is in use by another ddp-worker named node-a")));
  EXPECT_TRUE(RankLedger::Open(dir_, "node-b").ok()) << "another name may share the dir";
}

TEST_F(RankLedgerTest, EntriesOfAnotherBootOrPidNamespaceAreVoid) {
  ddp::testing::WriteFile(dir_ + "/ddp-worker-node-a.ranks",
                          "boot 00000000-0000-0000-0000-000000000000\n4242 7 1 0 job-1\n");
  auto ledger = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(ledger.ok());
  EXPECT_THAT((*ledger)->previous(), IsEmpty());
  ledger->reset();
  // This boot, but another container's PID namespace.
  std::string boot = ddp::testing::ReadFile("/proc/sys/kernel/random/boot_id");
  boot = std::string(absl::StripAsciiWhitespace(boot));
  ddp::testing::WriteFile(dir_ + "/ddp-worker-node-a.ranks",
                          absl::StrCat("boot ", boot, " pid:[1]\n4242 7 1 0 job-1\n"));
  ledger = RankLedger::Open(dir_, "node-a");
  ASSERT_TRUE(ledger.ok());
  EXPECT_THAT((*ledger)->previous(), IsEmpty());
}

TEST_F(RankLedgerTest, AGroupNumberNowLedByAnotherProcessIsLeftAlone) {
  // A live group leader whose start time is not the recorded one: the number was
  // reused after the rank's group emptied.
  SpawnOptions o;
  o.argv = {"/bin/sleep", "300"};
  auto other = Subprocess::Spawn(o);
  ASSERT_TRUE(other.ok());
  LedgerEntry stale{(*other)->pid(), ProcessStartTicks((*other)->pid()) - 1, "job-1", 1, 0};
  EXPECT_THAT(EndProcessGroup(stale), IsEmpty());
  EXPECT_FALSE(Ended((*other)->pid()));
  // With the right start time it is the rank itself, and it is ended.
  LedgerEntry same{(*other)->pid(), ProcessStartTicks((*other)->pid()), "job-1", 1, 0};
  EXPECT_THAT(EndProcessGroup(same), ElementsAre((*other)->pid()));
  EXPECT_EQ((*other)->Wait().signal, SIGKILL);
}

}  // namespace
}  // namespace ddp
