// The stall watch alone, on explicit times: arming, the learned timeout and its
// bounds, and whom it blames.
#include "coordinator/core/stall_watchdog.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

absl::Time At(double s) { return kT0 + absl::Seconds(s); }

TEST(StallWatchTest, NothingIsWatchedBeforeTheFirstStep) {
  StallWatch w;
  w.Progress(0, 2, /*step=*/false, At(0));  // A `start` event: start-up is not watched.
  EXPECT_FALSE(w.armed());
  EXPECT_FALSE(w.Find(At(1000), absl::Seconds(5)).has_value());
  w.Progress(1, 2, /*step=*/true, At(1));
  EXPECT_TRUE(w.armed());
}

TEST(StallWatchTest, ARankSilentPastTheTimeoutIsNamedWithHowLongItWasSilent) {
  StallWatch w;
  w.Progress(0, 3, true, At(0));  // Arms: every rank's clock starts now.
  for (double t = 1; t <= 10; t += 1) {
    w.Progress(0, 3, true, At(t));
    w.Progress(2, 3, true, At(t));
  }
  EXPECT_FALSE(w.Find(At(4.9), absl::Seconds(5)).has_value());
  auto stall = w.Find(At(10), absl::Seconds(5));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_EQ(stall->silent, absl::Seconds(10));
  EXPECT_FALSE(stall->stopped);
}

TEST(StallWatchTest, ACommandJobsRankIsWatchedOnlyFromItsSecondStepLine) {
  StallWatch w(/*reporting_ranks_only=*/true);
  // Rank 0 reports, rank 1 never does (a program that logs on rank 0 only).
  for (double t = 0; t <= 100; t += 1) w.Progress(0, 2, true, At(t));
  EXPECT_FALSE(w.Find(At(100), absl::Seconds(5)).has_value()) << "rank 1 never reported";
  // Rank 1's first line: one report, no gap seen yet, not watched.
  w.Progress(1, 2, true, At(101));
  w.Progress(0, 2, true, At(101));
  EXPECT_FALSE(w.Find(At(200), absl::Seconds(5)).has_value() &&
               w.Find(At(200), absl::Seconds(5))->rank == 1);
  w.Progress(1, 2, true, At(201));
  for (double t = 102; t <= 260; t += 1) w.Progress(0, 2, true, At(t));
  auto stall = w.Find(At(260), absl::Seconds(30));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1) << "watched from its second line on";
  EXPECT_EQ(stall->silent, absl::Seconds(59));
}

TEST(StallWatchTest, WhenEveryRankIsSilentTheStoppedOneIsBlamedNotTheOneWaitingLongest) {
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Progress(1, 2, true, At(1));  // Rank 1 reported last, then was stopped...
  w.SetStopped(1, 2, true);
  auto stall = w.Find(At(20), absl::Seconds(5));  // ...and rank 0 waits for it.
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_TRUE(stall->stopped);
  // Without the agent's word, the one silent longest.
  w.SetStopped(1, 2, false);
  EXPECT_EQ(w.Find(At(20), absl::Seconds(5))->rank, 0);
}

TEST(StallWatchTest, AStoppedRankThatReportedLastIsBlamedOnceItsPeerIsPastTheTimeout) {
  // The race seen in CI: rank 1 was stopped right after its last report, which
  // arrived after rank 0's (batched a little earlier). At the timeout only rank 0 is
  // past it, but rank 1 is the cause.
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Progress(1, 2, true, At(0.4));
  w.SetStopped(1, 2, true);
  EXPECT_FALSE(w.Find(At(4.9), absl::Seconds(5)).has_value()) << "nobody is past it yet";
  auto stall = w.Find(At(5.1), absl::Seconds(5), absl::Seconds(1));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_TRUE(stall->stopped);
  EXPECT_EQ(stall->silent, absl::Seconds(4.7));
}

TEST(StallWatchTest, WithoutAStoppedReportTheWatchWaitsTheGraceBeforeBlaming) {
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Progress(1, 2, true, At(0.4));
  // Past the timeout, within the grace: the agent's word may still be on its way.
  EXPECT_FALSE(w.Find(At(5.5), absl::Seconds(5), absl::Seconds(1)).has_value());
  // It comes: the stopped rank is named at once.
  w.SetStopped(1, 2, true);
  auto named = w.Find(At(5.5), absl::Seconds(5), absl::Seconds(1));
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->rank, 1);
  // It does not: past the grace, the rank silent longest.
  w.SetStopped(1, 2, false);
  auto oldest = w.Find(At(6), absl::Seconds(5), absl::Seconds(1));
  ASSERT_TRUE(oldest.has_value());
  EXPECT_EQ(oldest->rank, 0);
  EXPECT_FALSE(oldest->stopped);
  EXPECT_EQ(oldest->silent, absl::Seconds(6));
}

TEST(StallWatchTest, AFinishedRankNeverStalls) {
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Done(1);
  auto stall = w.Find(At(100), absl::Seconds(5));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 0);
  w.Done(0);
  EXPECT_FALSE(w.Find(At(100), absl::Seconds(5)).has_value());
}

TEST(StallWatchTest, TheTimeoutIsLearnedFromStepGapsWithAFloorAndBelowTheCollectiveTimeout) {
  StallWatch w;
  EXPECT_EQ(w.Timeout(/*stall_timeout_s=*/7, 300), absl::Seconds(7));  // Set: used as is.
  w.Progress(0, 1, true, At(0));
  w.Progress(0, 1, true, At(1));
  EXPECT_EQ(w.Timeout(0, 300), StallWatch::kFloor);  // 10 x 1 s is below the floor.
  w.Progress(0, 1, true, At(9));  // An 8 s gap (validation at an epoch's end, say).
  EXPECT_EQ(w.Timeout(0, 300), absl::Seconds(80));
  EXPECT_EQ(w.Timeout(0, 100), absl::Seconds(50)) << "at most half the collective timeout";
}

RankFlight Flight(const char* phase, uint64_t entered, int64_t waiting_ms,
                  const std::string& collective, absl::Time read_at, int64_t step = -1) {
  RankFlight f;
  f.known = true;
  f.state.set_phase(phase);
  f.state.set_phase_ms(3000);
  f.state.set_entered(entered);
  f.state.set_completed(waiting_ms > 0 ? entered - 1 : entered);
  f.state.set_waiting_ms(waiting_ms);
  f.state.set_collective(collective);
  f.state.set_global_step(step);
  f.read_at = read_at;
  return f;
}

// Rank 1 of 3 never entered the all-reduce ranks 0 and 2 wait in: it is named, at the
// timeout (no grace: the recorders are evidence), though rank 2 has been silent longer,
// and the reason says where each is.
TEST(StallWatchTest, TheFlightRecordersNameTheRankTheOthersWaitForAndWhy) {
  StallWatch w;
  w.Progress(2, 3, true, At(0));
  w.Progress(0, 3, true, At(1));
  w.Progress(1, 3, true, At(1));
  const std::string ar = "all-reduce #4817 (bucket 3, 1.2 MB)";
  w.SetFlight(0, 3, Flight("comm_wait", 4817, 4000, ar, At(5)));
  w.SetFlight(1, 3, Flight("data", 4816, 0, "all-reduce #4816 (bucket 0, 1.0 MB)", At(5), 11));
  w.SetFlight(2, 3, Flight("comm_wait", 4817, 4500, ar, At(5)));
  EXPECT_EQ(w.Laggard(), 1);
  auto stall = w.Find(At(6), absl::Seconds(5), /*unreported_grace=*/absl::Seconds(10));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_TRUE(stall->lagging);
  EXPECT_EQ(w.Explain(*stall, At(6)),
            "; it never entered all-reduce #4817 (bucket 3, 1.2 MB), where ranks 0, 2 have "
            "waited 5.5s; rank 1 is in data loading (for 4.0s, step 11)");
}

TEST(StallWatchTest, WithoutEveryRecorderTheLongestSilenceIsBlamedAndExplainedAsFarAsKnown) {
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Progress(1, 2, true, At(2));
  w.SetFlight(1, 2, Flight("compute", 7, 0, "all-reduce #7", At(2)));
  EXPECT_EQ(w.Laggard(), -1) << "rank 0's recorder is unknown";
  auto stall = w.Find(At(20), absl::Seconds(5));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 0);
  EXPECT_EQ(w.Explain(*stall, At(20)), "") << "nothing known of rank 0";
  const StallWatch::Stall other{1, absl::Seconds(18), false, false};
  EXPECT_EQ(w.Explain(other, At(2)), "; rank 1 is in forward and backward (for 3.0s)");
}

TEST(StallWatchTest, EveryRankInOneCollectiveIsTheCollectivesFaultNotARanks) {
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Progress(1, 2, true, At(0));
  const std::string ar = "all-reduce #9 (bucket 0, 2.7 kB)";
  w.SetFlight(0, 2, Flight("comm_wait", 9, 6000, ar, At(6)));
  w.SetFlight(1, 2, Flight("comm_wait", 9, 6100, ar, At(6)));
  EXPECT_EQ(w.Laggard(), -1);
  auto stall = w.Find(At(6), absl::Seconds(5));
  ASSERT_TRUE(stall.has_value());
  EXPECT_THAT(w.Explain(*stall, At(6)),
              ::testing::StartsWith("; every rank is in all-reduce #9 (bucket 0, 2.7 kB), which "
                                    "has not completed for "));
  // With a third rank whose recorder is unknown, that is not said.
  StallWatch three;
  three.Progress(0, 3, true, At(0));
  three.SetFlight(0, 3, Flight("comm_wait", 9, 6000, ar, At(6)));
  three.SetFlight(1, 3, Flight("comm_wait", 9, 6100, ar, At(6)));
  EXPECT_THAT(three.Explain(StallWatch::Stall{0, absl::Seconds(6), false, false}, At(6)),
              ::testing::StartsWith("; it waits in all-reduce #9"));
}

TEST(StallWatchTest, AStoppedRankStaysBlamedOverTheRecorders) {
  StallWatch w;
  w.Progress(0, 2, true, At(0));
  w.Progress(1, 2, true, At(0));
  w.SetFlight(0, 2, Flight("data", 3, 0, "broadcast #3", At(1)));
  w.SetFlight(1, 2, Flight("comm_wait", 4, 900, "all-reduce #4", At(1)));
  w.SetStopped(1, 2, true);
  auto stall = w.Find(At(6), absl::Seconds(5));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_TRUE(stall->stopped);
}

v1::StackSummary Stack(int seq, bool in_collective, const char* where,
                       const char* tools = "py-spy, eu-stack") {
  v1::StackSummary s;
  s.set_seq(seq);
  s.set_in_collective(in_collective);
  s.set_where(where);
  s.set_tools(tools);
  return s;
}

// A command job (no recorder): the stacks asked for when the stall is suspected name
// the rank outside any collective at once, without the grace; a stale capture does not.
TEST(StallWatchTest, TheStacksNameTheRankOutsideAnyCollectiveWhileTheOthersWaitInOne) {
  StallWatch w(/*reporting_ranks_only=*/true);
  for (double t = 0; t <= 1; t += 1) {
    for (int r = 0; r < 3; ++r) w.Progress(r, 3, true, At(t));
  }
  EXPECT_FALSE(w.Suspected(At(5.9), absl::Seconds(5)));
  EXPECT_TRUE(w.Suspected(At(6), absl::Seconds(5)));
  const char* ar = "all_reduce (torch/distributed/distributed_c10d.py:1404)";
  // Capture 1 (--now, earlier) is in; the stall's capture is 2: not evidence yet.
  w.SetStack(0, 3, Stack(1, true, ar));
  w.SetStack(1, 3, Stack(1, false, "block_forever (stall_program.py:21)"));
  w.SetStack(2, 3, Stack(1, true, ar));
  w.AskedStacks(2, At(9));
  EXPECT_FALSE(w.StacksIn(2));
  EXPECT_FALSE(w.Find(At(6), absl::Seconds(5), absl::Seconds(1)).has_value());
  w.SetStack(0, 3, Stack(2, true, ar));
  w.SetStack(1, 3, Stack(2, false, "block_forever (stall_program.py:21)"));
  EXPECT_FALSE(w.StacksIn(2));
  w.SetStack(2, 3, Stack(2, true, ar));
  ASSERT_TRUE(w.StacksIn(2));
  EXPECT_EQ(w.StackLaggard(2), 1);
  auto stall = w.Find(At(6.1), absl::Seconds(5), absl::Seconds(10));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_TRUE(stall->by_stack);
  EXPECT_EQ(w.Explain(*stall, At(6.1)),
            "; ranks 0, 2 wait in all_reduce (torch/distributed/distributed_c10d.py:1404); "
            "rank 1 is outside any collective, in block_forever (stall_program.py:21) (their "
            "stacks)");
  // Progress again: the ask is cleared by the coordinator, and so is the evidence.
  w.AskedStacks(0, absl::InfinitePast());
  EXPECT_EQ(w.asked_seq(), 0);
}

TEST(StallWatchTest, StacksWithoutAToolOrWithEveryRankInACollectiveBlameNoOne) {
  StallWatch w;
  for (int r = 0; r < 2; ++r) w.Progress(r, 2, true, At(0));
  w.AskedStacks(1, At(9));
  w.SetStack(0, 2, Stack(1, true, "all_reduce (x.py:1)"));
  w.SetStack(1, 2, Stack(1, false, "", ""));  // No tool took it.
  EXPECT_TRUE(w.StacksIn(1));
  EXPECT_EQ(w.StackLaggard(1), -1);
  w.SetStack(1, 2, Stack(1, true, "all_reduce (x.py:1)"));
  EXPECT_EQ(w.StackLaggard(1), -1);
  // Blamed by silence after the grace, the stack still says where the rank is.
  w.Progress(0, 2, true, At(1));
  auto stall = w.Find(At(8), absl::Seconds(5), absl::Seconds(1));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_FALSE(stall->by_stack);
  EXPECT_EQ(w.Explain(*stall, At(8)), "; its stack: all_reduce (x.py:1)");
}

}  // namespace
}  // namespace ddp
