// Coordinator::Metrics(), the numbers a Prometheus scrape shows, driven with a
// FakeClock against a real SQLite store: heartbeat gaps, rendezvous time, restarts,
// jobs and workers by state, and the running ranks' latest step metrics (gone once
// the job is not RUNNING).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;

class CoordinatorMetricsTest : public testing::CoordinatorHarness {
 protected:
  // A step event of rank `task.ranks(0)` at global step 7.
  void Step(const std::string& worker, const v1::Task& task, double samples_per_s) {
    v1::TrainerEvent e;
    v1::TrainerEvent::Step* step = e.mutable_step();
    step->set_global_step(7);
    step->set_loss(0.5 + task.ranks(0));
    step->set_samples_per_s(samples_per_s);
    step->set_step_ms(250);
    ASSERT_TRUE(ReportEvents(worker, task.job_id(), task.attempt(), task.ranks(0), {e}).ok());
  }
};

TEST_F(CoordinatorMetricsTest, CountsHeartbeatGapsRendezvousRestartsAndShowsRunningRanks) {
  Register("w1");
  Register("w2");
  Register("w3");
  // One heartbeat gap each, of 1 s (the interval when all is well).
  clock_.Advance(absl::Seconds(1));
  for (const char* w : {"w1", "w2", "w3"}) Heartbeat(w);
  CoordinatorMetrics m = coordinator_->Metrics();
  EXPECT_EQ(m.heartbeat_lag.count(), 3u);
  EXPECT_DOUBLE_EQ(m.heartbeat_lag.sum(), 3.0);
  EXPECT_EQ(m.workers.alive(), 3);
  EXPECT_EQ(m.jobs.size(), 6u) << "every state, zeros included";

  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(
      "name: demo\nnodes: 2\nmax_restarts: 1\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
      "train: {batch_size: 4}\n");
  auto job = coordinator_->Submit(submit);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->id();
  const v1::Task t1 = Heartbeat("w1").at(0);
  const v1::Task t2 = Heartbeat("w2").at(0);
  EXPECT_EQ(coordinator_->Metrics().jobs[v1::RENDEZVOUS], 1);
  // The trainers take 3 s to come up.
  clock_.Advance(absl::Seconds(3));
  Heartbeat("w1", {Running(t1)});
  Heartbeat("w2", {Running(t2)});
  m = coordinator_->Metrics();
  EXPECT_EQ(m.jobs[v1::RUNNING], 1);
  EXPECT_EQ(m.rendezvous.count(), 1u);
  EXPECT_DOUBLE_EQ(m.rendezvous.sum(), 3.0);
  EXPECT_EQ(m.job_restarts, 0);
  ASSERT_EQ(m.ranks.size(), 2u);
  EXPECT_FALSE(m.ranks[0].has_metrics) << "no step yet: no made-up zero";

  Step("w1", t1, 800);
  Step("w2", t2, 750);
  m = coordinator_->Metrics();
  ASSERT_EQ(m.ranks.size(), 2u);
  std::map<int, std::pair<std::string, double>> by_rank;
  for (const auto& r : m.ranks) {
    EXPECT_EQ(r.job_id, id);
    ASSERT_TRUE(r.has_metrics);
    EXPECT_DOUBLE_EQ(r.metrics.loss(), 0.5 + r.rank);
    by_rank[r.rank] = {r.worker, r.metrics.samples_per_s()};
  }
  ASSERT_EQ(by_rank.size(), 2u);
  EXPECT_EQ(by_rank[0].first, "w1");
  EXPECT_DOUBLE_EQ(by_rank[0].second, 800.0);
  EXPECT_EQ(by_rank[1].first, "w2");
  EXPECT_DOUBLE_EQ(by_rank[1].second, 750.0);

  // w2 goes silent past the heartbeat timeout: the attempt fails, the job restarts on
  // w1 + w3, and the failed attempt's rank series are gone.
  clock_.Advance(absl::Seconds(11));
  Heartbeat("w1", {Running(t1)});
  Heartbeat("w3");
  coordinator_->Tick();
  m = coordinator_->Metrics();
  EXPECT_TRUE(m.ranks.empty());
  EXPECT_EQ(m.workers.lost(), 1);
  EXPECT_EQ(m.rendezvous.count(), 1u) << "a failed attempt's rendezvous is not observed twice";
  v1::TaskStatus stopped = Running(t1);
  stopped.mutable_ranks(0)->set_exited(true);
  stopped.mutable_ranks(0)->set_exit_code(143);
  Heartbeat("w1", {stopped});
  m = coordinator_->Metrics();
  EXPECT_EQ(m.job_restarts, 1);
  EXPECT_EQ(m.jobs[v1::RENDEZVOUS], 1);
  // w1's 11 s gap and w3's 14 s one land in the (10 s, 20 s] bucket.
  EXPECT_EQ(m.heartbeat_lag.counts()[m.heartbeat_lag.bounds().size() - 2], 2u);
}

// Operators see when rate scaling (decisions 162, 164) stretches what workers are told.
TEST_F(CoordinatorMetricsTest, ShowTheHeartbeatIntervalAndTimeoutWorkersAreToldNow) {
  options_.heartbeat_interval = absl::Seconds(1);
  options_.heartbeat_timeout = absl::Seconds(10);
  options_.max_heartbeats_per_second = 2;  // Two workers per factor.
  Open();
  Register("w1");
  CoordinatorMetrics m = coordinator_->Metrics();
  EXPECT_EQ(m.heartbeat_interval, absl::Seconds(1));
  EXPECT_EQ(m.heartbeat_timeout, absl::Seconds(10));
  Register("w2");
  Register("w3");
  m = coordinator_->Metrics();
  EXPECT_EQ(m.heartbeat_interval, absl::Seconds(2)) << "3 workers at 2 beats/s: every 2 s";
  EXPECT_EQ(m.heartbeat_timeout, absl::Seconds(20));
}

TEST(BucketHistogramTest, CountsEachValueInTheFirstBucketWhoseBoundHoldsIt) {
  BucketHistogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 5.0, 9.0}) h.Observe(v);
  EXPECT_THAT(h.counts(), ElementsAre(2u, 1u, 1u, 1u));
  EXPECT_EQ(h.count(), 5u);
  EXPECT_DOUBLE_EQ(h.sum(), 17.0);
}

}  // namespace
}  // namespace ddp
