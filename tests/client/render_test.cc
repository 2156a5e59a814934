#include "client/render.h"

#include "gmock/gmock.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::SizeIs;

v1::Job RunningJob(absl::Time now) {
  v1::Job job;
  job.set_id("cancer-ddp-abc12");
  job.set_state(v1::RUNNING);
  job.set_epochs(10);
  job.set_start_ms(absl::ToUnixMillis(now - absl::Seconds(75)));
  v1::Attempt* a = job.add_attempts();
  a->set_number(1);
  a->set_world_size(2);
  for (int r = 0; r < 2; ++r) {
    v1::RankAssignment* ra = a->add_ranks();
    ra->set_rank(r);
    ra->set_worker(r == 0 ? "w1" : "w2");
    ra->set_pid(100 + r);
    v1::RankMetrics* m = job.add_metrics();
    m->set_rank(r);
    m->set_epoch(4);
    m->set_step(13);
    m->set_steps(28);
    m->set_global_step(4 * 28 + 13);
    m->set_loss(0.25 + r);
    m->set_samples_per_s(1500);
    m->set_step_ms(5.3);
    m->set_comm_ms(0.7);
    m->set_update_ms(absl::ToUnixMillis(now - absl::Milliseconds(300)));
  }
  return job;
}

TEST(RenderTest, FormatsNumbersAndDurations) {
  EXPECT_EQ(WithThousands(1234567), "1,234,567");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(HumanDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(absl::Seconds(187)), "3m07s");
  EXPECT_EQ(HumanDuration(absl::Seconds(7500)), "2h05m");
  EXPECT_EQ(ProgressBar(0.5, 4), "[██░░]  50%");
}

TEST(RenderTest, TablesAlignColumns) {
  EXPECT_EQ(FormatTable({{"A", "BB"}, {"ccc", "d"}}), "A    BB\nccc  d\n");
}

TEST(RenderTest, WatchShowsEveryRankWithLossThroughputAndProgress) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job job = RunningJob(now);
  ProgressEstimator progress;
  progress.Observe(job, now - absl::Seconds(1));
  job.mutable_metrics(0)->set_global_step(job.metrics(0).global_step() + 10);
  job.mutable_metrics(0)->set_step(23);
  progress.Observe(job, now);
  std::vector<std::string> lines = RenderWatch(job, progress, now, /*color=*/false);
  const std::string all = absl::StrJoin(lines, "\n");
  EXPECT_THAT(all, HasSubstr("job cancer-ddp-abc12  RUNNING  attempt 1  world 2  elapsed 1m15s"));
  EXPECT_THAT(all, HasSubstr("epoch 5/10"));
  EXPECT_THAT(all, HasSubstr("3,000 samples/s"));  // Summed over ranks.
  EXPECT_THAT(all, HasSubstr("ETA 14s"));  // 5 * 28 + 4 = 144 steps left at 10 steps/s.
  EXPECT_THAT(lines, Contains(HasSubstr("0     w1      running  4      24/28  0.2500  1,500")));
  EXPECT_THAT(lines, Contains(HasSubstr("1     w2      running  4      14/28  1.2500  1,500")));
  EXPECT_THAT(all, HasSubstr("0.3s ago"));
}

TEST(RenderTest, PlainWatchLinesOnlyReportChanges) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job before = RunningJob(now);
  EXPECT_THAT(RenderWatchLines(before, nullptr, now), SizeIs(3));  // State + two ranks.
  v1::Job after = before;
  after.mutable_metrics(1)->set_global_step(before.metrics(1).global_step() + 1);
  auto lines = RenderWatchLines(after, &before, now);
  ASSERT_THAT(lines, SizeIs(1));
  EXPECT_THAT(lines[0], HasSubstr("rank 1 epoch 4 step 14/28 loss 1.2500 samples/s 1,500"));
}

TEST(RenderTest, LogLinesNameTheRankUnlessFiltered) {
  v1::LogLine l;
  l.set_rank(1);
  l.set_text("hello");
  EXPECT_EQ(RenderLogLine(l, true), "[rank 1] hello");
  EXPECT_EQ(RenderLogLine(l, false), "hello");
}

TEST(RenderTest, GetShowsTheNewestEpochsOfALongJob) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job job = RunningJob(now);
  for (int e = 0; e < 25; ++e) {
    v1::EpochSummary* s = job.add_epoch_history();
    s->set_attempt(1);
    s->set_epoch(e);
    s->set_train_loss(1.0 / (e + 1));
    s->set_val_loss(0.5);
    s->set_val_accuracy(0.9);
  }
  const std::string out = RenderJob(job, now);
  EXPECT_THAT(out, HasSubstr("Epochs (the last 10 of 25; all of them: -o json):"));
  // Epochs 15..24 are listed (train loss 1/16 .. 1/25), epoch 14 (1/15) is not.
  EXPECT_THAT(out, HasSubstr("0.0400"));  // Epoch 24.
  EXPECT_THAT(out, HasSubstr("0.0625"));  // Epoch 15.
  EXPECT_THAT(out, ::testing::Not(HasSubstr("0.0667")));  // Epoch 14.

  job.mutable_epoch_history()->DeleteSubrange(0, 20);
  EXPECT_THAT(RenderJob(job, now), HasSubstr("\nEpochs:\n"));
}

}  // namespace
}  // namespace ddp
