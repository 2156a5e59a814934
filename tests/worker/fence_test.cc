// The fencing rule (worker/agent/fence.h): when a worker cut off from the coordinator
// asks its witnesses, and what it makes of their answers.
#include "worker/agent/fence.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

TEST(PlanFencing, TheDefaultTimeoutsLetEveryWitnessNoticeAnOutageFirst) {
  // The coordinator's defaults: interval 500 ms, timeout 2.5 s, deadline 400 ms.
  const FencePlan plan =
      PlanFencing(absl::Milliseconds(500), absl::Milliseconds(2500), absl::Milliseconds(400));
  EXPECT_EQ(plan.ask_after, absl::Milliseconds(1800));  // 2 x (interval + deadline).
  // Half a deadline, and half the 300 ms the timeout leaves beyond that.
  EXPECT_EQ(plan.ask_deadline, absl::Milliseconds(350));
  EXPECT_FALSE(plan.tight);
  // Decided half a deadline before the coordinator's verdict, at the latest.
  EXPECT_LE(plan.ask_after + plan.ask_deadline, absl::Milliseconds(2500 - 200));
}

TEST(PlanFencing, ATightTimeoutStillFencesBeforeTheCoordinatorsVerdict) {
  const FencePlan plan =
      PlanFencing(absl::Milliseconds(500), absl::Milliseconds(1500), absl::Milliseconds(400));
  EXPECT_TRUE(plan.tight);
  EXPECT_EQ(plan.ask_after, absl::Milliseconds(1500 - 200 - 200));
  EXPECT_LT(plan.ask_after + plan.ask_deadline, absl::Milliseconds(1500));
}

// Quiet heartbeats (decision 161): one beat in k is answered, so the agent notices an
// outage up to k intervals (plus the deadline) after its last answered beat was sent.
TEST(QuietBeatsPerAck, TheDefaultTimeoutsAndTheBenchsLeaveEveryBeatAnswered) {
  // 500 ms / 2.5 s / 400 ms: k = 2 would ask after 2 x (1 s + 400 ms) > 2.1 s.
  EXPECT_EQ(QuietBeatsPerAck(absl::Milliseconds(500), absl::Milliseconds(2500),
                             absl::Milliseconds(400)),
            1);
  // bench/control_plane.sh's 1 s interval with the 2.5 s timeout: tight already.
  EXPECT_EQ(QuietBeatsPerAck(absl::Seconds(1), absl::Milliseconds(2500), absl::Milliseconds(400)),
            1);
}

TEST(QuietBeatsPerAck, ALongerTimeoutLetsTheCoordinatorAnswerFewerBeatsAndStillFenceFirst) {
  const absl::Duration deadline = absl::Milliseconds(400);
  for (absl::Duration interval : {absl::Milliseconds(500), absl::Seconds(1)}) {
    for (int timeout_s : {3, 5, 10, 30}) {
      const absl::Duration timeout = absl::Seconds(timeout_s);
      const int k = QuietBeatsPerAck(interval, timeout, deadline);
      ASSERT_GE(k, 1);
      ASSERT_LE(k, kMaxBeatsPerAck);
      const FencePlan plan = PlanFencing(interval, timeout, deadline, k);
      const FencePlan every = PlanFencing(interval, timeout, deadline);
      SCOPED_TRACE(absl::StrCat("interval ", absl::FormatDuration(interval), " timeout ",
                                timeout_s, "s: k = ", k));
      // Safe: decided half a deadline before the coordinator's verdict, counted from
      // the last answered beat (the coordinator heard it, or a later one).
      EXPECT_LE(plan.ask_after + plan.ask_deadline, timeout - deadline / 2);
      // Every witness has noticed an outage when asked, whenever quiet beats are on
      // where answering every beat had that too.
      EXPECT_EQ(plan.tight, every.tight && k == 1);
      // A healthy agent is never taken for cut off: its beat that asks is due within k
      // intervals and answered within the deadline, before the witnesses are asked.
      EXPECT_LT(k * interval + deadline, plan.ask_after);
      // The largest such k (up to the cap).
      if (k < kMaxBeatsPerAck) EXPECT_TRUE(PlanFencing(interval, timeout, deadline, k + 1).tight);
      if (timeout_s >= 10) EXPECT_GT(k, 1);
    }
  }
}

TEST(DecideFence, AWitnessThatReachesTheCoordinatorMeansThisWorkerIsCutOff) {
  const FenceVerdict v = DecideFence({"10.0.0.2:1", "10.0.0.3:1"},
                                     {absl::UnavailableError("down"), true});
  EXPECT_TRUE(v.fence);
  EXPECT_NE(v.why.find("10.0.0.3:1 still reaches the coordinator"), std::string::npos) << v.why;
}

TEST(DecideFence, NoAnswerAtAllMeansThisWorkerIsCutOffFromEveryone) {
  const FenceVerdict v = DecideFence({"a:1", "b:1"}, {absl::UnavailableError("x"),
                                                      absl::DeadlineExceededError("y")});
  EXPECT_TRUE(v.fence);
  EXPECT_NE(v.why.find("none of 2"), std::string::npos) << v.why;
}

TEST(DecideFence, WitnessesThatLostTheCoordinatorTooMeanAnOutage) {
  const FenceVerdict v = DecideFence({"a:1", "b:1", "c:1"},
                                     {false, absl::UnavailableError("x"), false});
  EXPECT_FALSE(v.fence);
  EXPECT_NE(v.why.find("2 of 3 other workers lost the coordinator too"), std::string::npos)
      << v.why;
}

TEST(DecideFence, AOneWorkerClusterKeepsTraining) {
  const FenceVerdict v = DecideFence({}, {});
  EXPECT_FALSE(v.fence);
  EXPECT_NE(v.why.find("no other worker"), std::string::npos) << v.why;
}

}  // namespace
}  // namespace ddp
