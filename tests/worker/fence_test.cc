// The fencing rule (worker/agent/fence.h): when a worker cut off from the coordinator
// asks its witnesses, and what it makes of their answers.
#include "worker/agent/fence.h"

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
