// Heartbeat rate scaling (decisions 162 and 164): the factor, the interval and timeout
// workers are told and held to as the cluster grows and shrinks, the default, and what
// a recovering coordinator assumes. The coordinator driven directly with a FakeClock
// on the in-memory store, as coordinator_test.cc.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/core/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

// coordinator_test.cc's timing: 1 s interval, 10 s timeout.
class HeartbeatRateTest : public testing::TimedCoordinatorHarness {};

TEST(HeartbeatStretchTest, AWholeFactorKeepsTheLiveWorkersUnderTheRateUpToTheCap) {
  EXPECT_EQ(HeartbeatStretch(10000, 0, absl::Seconds(1)), 1) << "0: never stretched";
  EXPECT_EQ(HeartbeatStretch(0, 5000, absl::Seconds(1)), 1);
  EXPECT_EQ(HeartbeatStretch(5000, 5000, absl::Seconds(1)), 1);
  EXPECT_EQ(HeartbeatStretch(5001, 5000, absl::Seconds(1)), 2);
  EXPECT_EQ(HeartbeatStretch(10000, 5000, absl::Seconds(1)), 2);
  EXPECT_EQ(HeartbeatStretch(10000, 5000, absl::Milliseconds(500)), 4);
  EXPECT_EQ(HeartbeatStretch(1000000, 5000, absl::Seconds(1)), kMaxHeartbeatStretch);
}

TEST_F(HeartbeatRateTest, ABadHeartbeatRateIsRefused) {
  CoordinatorOptions o;
  o.max_heartbeats_per_second = -1;
  EXPECT_THAT(ValidateTimeouts(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("--max-heartbeats-per-second (-1)")));
}

TEST_F(HeartbeatRateTest, AtScaleWorkersAreToldALongerIntervalAndHeldToItsLongerTimeout) {
  options_.max_heartbeats_per_second = 1;  // 1 s interval: one worker per second each.
  Open();
  auto silent_for = [&](const std::string& name) {
    auto listed = coordinator_->ListWorkers(v1::ListWorkersRequest());
    for (const v1::Worker& w : listed->workers()) {
      if (w.name() == name) return w.alive();
    }
    ADD_FAILURE() << "no worker " << name;
    return false;
  };
  auto beat = [&](const std::string& name, absl::Duration says) {
    v1::HeartbeatRequest req;
    req.set_worker(name);
    req.set_incarnation(Incarnation(name));
    req.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(says));
    auto resp = coordinator_->Heartbeat(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::HeartbeatResponse();
  };
  Register("w1");
  // Alone: 1 heartbeat a second, within the rate: the configured interval and timeout.
  v1::HeartbeatResponse r = HeartbeatReply("w1");
  EXPECT_EQ(r.heartbeat_interval_ms(), 1000);
  EXPECT_EQ(r.heartbeat_timeout_ms(), 10000);
  Register("w2");
  Register("w3");
  r = beat("w1", absl::Seconds(1));
  EXPECT_EQ(r.heartbeat_interval_ms(), 3000) << "3 workers at 1 beat/s: every 3 s";
  EXPECT_EQ(r.heartbeat_timeout_ms(), 30000);
  beat("w2", absl::Seconds(3));
  // w3 is silent past the configured 10 s but within the 30 s it was told at Register:
  // alive.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(5));
    beat("w1", absl::Seconds(3));
    beat("w2", absl::Seconds(3));
    coordinator_->Tick();
  }
  EXPECT_TRUE(silent_for("w3")) << "silent 25 s of its 30";
  clock_.Advance(absl::Seconds(6));
  beat("w1", absl::Seconds(3));
  beat("w2", absl::Seconds(3));
  coordinator_->Tick();
  EXPECT_FALSE(silent_for("w3")) << "silent 31 s of its 30";
  // Two live workers: w1 is told 2 s, but says it still beats every 3 s (it has not yet
  // heard): held to the 3 s interval's 30 s timeout, not 20.
  r = beat("w1", absl::Seconds(3));
  EXPECT_EQ(r.heartbeat_interval_ms(), 2000);
  EXPECT_EQ(r.heartbeat_timeout_ms(), 20000);
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(5));
    beat("w2", absl::Seconds(2));
    coordinator_->Tick();
  }
  EXPECT_TRUE(silent_for("w1")) << "silent 25 s, held to 30";
  clock_.Advance(absl::Seconds(6));
  beat("w2", absl::Seconds(2));
  coordinator_->Tick();
  EXPECT_FALSE(silent_for("w1")) << "silent 31 s, held to 30";
}

TEST_F(HeartbeatRateTest, WithoutARateTheIntervalIsTheConfiguredOneWhateverTheWorkers) {
  options_.max_heartbeats_per_second = 0;
  Open();
  for (int i = 1; i <= 3; ++i) Register(absl::StrCat("w", i));
  v1::HeartbeatResponse r = HeartbeatReply("w1");
  EXPECT_EQ(r.heartbeat_interval_ms(), 1000);
  EXPECT_EQ(r.heartbeat_timeout_ms(), 10000);
}

TEST_F(HeartbeatRateTest, TheRateIsOnByDefaultAndLeavesAClusterBelowItAlone) {
  EXPECT_EQ(CoordinatorOptions().max_heartbeats_per_second, kDefaultMaxHeartbeatsPerSecond);
  EXPECT_GT(kDefaultMaxHeartbeatsPerSecond, 0);
  for (int i = 1; i <= 3; ++i) Register(absl::StrCat("w", i));
  v1::HeartbeatResponse r = HeartbeatReply("w1");
  EXPECT_EQ(r.heartbeat_interval_ms(), 1000);
  EXPECT_EQ(r.heartbeat_timeout_ms(), 10000);
}

// Timeouts are ordered heartbeat < rendezvous: a job's rdzv.timeout_s must exceed the
// heartbeat timeout workers are held to now, stretched at scale, not only the configured
// one (else its trainers' rendezvous can give up before a dead node is declared lost).
TEST_F(HeartbeatRateTest, ARendezvousTimeoutMustExceedTheStretchedHeartbeatTimeout) {
  options_.max_heartbeats_per_second = 1;  // 1 s interval: the 3 workers stretch it 3x.
  Open();
  for (int i = 1; i <= 3; ++i) Register(absl::StrCat("w", i));
  ASSERT_EQ(HeartbeatReply("w1").heartbeat_timeout_ms(), 30000);
  const std::string job =
      "name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n";
  v1::SubmitJobRequest req;
  req.set_spec_yaml(job + "rdzv: {timeout_s: 20}\n");  // Above 10 s, not above 30 s.
  req.set_source_name("job.yaml");
  EXPECT_THAT(coordinator_->Submit(req),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml: rdzv.timeout_s: must be greater than the "
                                 "coordinator's heartbeat timeout (30s: 10s stretched 3x")));
  EXPECT_TRUE(coordinator_->ListJobs(10).empty());
  EXPECT_FALSE(Submit(job + "rdzv: {timeout_s: 31}\n").empty());
  // Below the rate (one worker left alive), the configured timeout rules again.
  clock_.Advance(absl::Seconds(31));
  Heartbeat("w1");
  coordinator_->Tick();
  ASSERT_EQ(HeartbeatReply("w1").heartbeat_timeout_ms(), 10000);
  EXPECT_FALSE(Submit(job + "rdzv: {timeout_s: 11}\n").empty());
}

// After a restart (or a takeover) the agents may beat at a stretched interval the new
// coordinator never told them: it waits for them as long as the last leader could have
// told them, which the stored workers bound (decision 164), not always 4 timeouts.
TEST_F(HeartbeatRateTest, RecoveredWorkersAreWaitedForAsLongAsTheLastLeaderCouldHaveToldThem) {
  options_.max_heartbeats_per_second = 2;  // 1 s interval: 2 workers per factor.
  options_.recovery_grace = absl::Seconds(1);
  Open();
  auto alive = [&](const std::string& name) {
    auto listed = coordinator_->ListWorkers(v1::ListWorkersRequest());
    for (const v1::Worker& w : listed->workers()) {
      if (w.name() == name) return w.alive();
    }
    ADD_FAILURE() << "no worker " << name;
    return false;
  };
  auto silent_for = [&](absl::Duration d) {
    clock_.Advance(d);
    coordinator_->Tick();
  };
  // Two workers: within the rate, never stretched: the plain 10 s timeout as grace.
  Register("w1");
  Register("w2");
  Open();  // Recovers.
  silent_for(absl::Seconds(9));
  EXPECT_TRUE(alive("w1"));
  silent_for(absl::Seconds(2));
  EXPECT_FALSE(alive("w1")) << "11 s silent: below the rate nothing was ever stretched";
  EXPECT_FALSE(alive("w2"));
  // Five stored workers (the two lost ones count: the last leader may have had them
  // live): the factor could have been 3, so 30 s.
  Register("w1", 1, "w1-inc2");
  Register("w2", 1, "w2-inc2");
  Register("w3");
  Register("w4");
  Register("w5");
  Open();
  silent_for(absl::Seconds(29));
  EXPECT_TRUE(alive("w3")) << "29 s silent of the 30 s a factor of 3 allows";
  silent_for(absl::Seconds(2));
  EXPECT_FALSE(alive("w3"));
}

}  // namespace
}  // namespace ddp
