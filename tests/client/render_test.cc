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

TEST(RenderTest, WatchShowsGpuColumnsOnlyForGpuRanks) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job job = RunningJob(now);
  ProgressEstimator progress;
  const std::string cpu = absl::StrJoin(RenderWatch(job, progress, now, false), "\n");
  EXPECT_THAT(cpu, testing::Not(HasSubstr("GPU")));
  for (int r = 0; r < 2; ++r) {
    job.mutable_metrics(r)->set_gpu_memory_allocated_mib(1200 + r);
    job.mutable_metrics(r)->set_gpu_memory_reserved_mib(2048);
    job.mutable_metrics(r)->set_gpu_memory_peak_mib(1800);
  }
  job.mutable_attempts(0)->mutable_ranks(0)->set_gpu_utilization_pct(91);
  std::vector<std::string> lines = RenderWatch(job, progress, now, false);
  EXPECT_THAT(lines, Contains(testing::ContainsRegex("COMM MS +GPU MEM MIB +GPU UTIL +UPDATED")));
  EXPECT_THAT(lines, Contains(testing::ContainsRegex("^0 .* 0.7 +1200/1800 +91% +0.3s ago")));
  EXPECT_THAT(lines, Contains(testing::ContainsRegex("^1 .* 0.7 +1201/1800 +- +0.3s ago")));
  const std::vector<std::string> plain = RenderWatchLines(job, nullptr, now);
  EXPECT_THAT(plain, Contains(HasSubstr("gpu_mem_mib 1200 gpu_peak_mib 1800")));
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

TEST(RenderTest, GetShowsWhoSubmittedTheJob) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job job = RunningJob(now);
  job.set_owner("alice");
  EXPECT_THAT(RenderJob(job, now), ::testing::ContainsRegex("Owner: +alice\n"));
  job.clear_owner();
  EXPECT_THAT(RenderJob(job, now),
              ::testing::ContainsRegex("Owner: +- \\(submitted without authentication\\)"));
}

TEST(RenderTest, GetShowsALostRankOfAFailedAttemptAsLost) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job job = RunningJob(now);
  v1::Attempt* a = job.mutable_attempts(0);
  a->set_state(v1::FAILED);
  a->set_reason("worker w2 lost: no heartbeat for 5.0s");
  a->mutable_ranks(0)->set_exited(true);
  a->mutable_ranks(0)->set_signal(15);
  a->mutable_ranks(1)->set_lost(true);  // Its worker was lost before reporting an exit.
  const std::string text = RenderJob(job, now);
  EXPECT_THAT(text, ::testing::ContainsRegex("w1 +100 +signal 15 \\(SIGTERM\\)"));
  EXPECT_THAT(text, ::testing::ContainsRegex("w2 +101 +lost"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("running")));
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

TEST(RenderTest, WorkersShowEachGpuAndWhoHoldsIt) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  v1::Worker w;
  w.set_name("gpu-a");
  w.set_alive(true);
  w.set_slots(2);
  w.set_free_slots(1);
  w.set_gpus(2);
  w.set_last_heartbeat_ms(absl::ToUnixMillis(now));
  for (int i = 0; i < 2; ++i) {
    v1::GpuDevice* g = w.add_gpu_devices();
    g->set_index(i);
    g->set_uuid(i == 0 ? "GPU-0a1b" : "GPU-2c3d");
    g->set_model("NVIDIA H100 80GB HBM3");
    g->set_memory_bytes(int64_t{80} << 30);
    if (i == 1) {
      g->set_job_id("cnn-x1y2z");
      g->set_rank(3);
      g->set_utilization_percent(93);  // The worker's NVML sample.
      g->set_memory_used_bytes(int64_t{12} << 30);
    }
  }
  v1::Worker cpu;
  cpu.set_name("cpu-b");
  cpu.set_alive(true);
  cpu.set_slots(1);
  cpu.set_free_slots(1);
  cpu.set_last_heartbeat_ms(absl::ToUnixMillis(now));
  const std::string out = RenderWorkers({w, cpu}, now);
  // The worker table's GPUS column: free/total, or the plain count for a CPU node.
  EXPECT_THAT(out, testing::ContainsRegex("gpu-a +alive .* 1/2 "));
  EXPECT_THAT(out, testing::ContainsRegex("cpu-b +alive .* 0 "));
  // One row per GPU with model, memory and holder.
  // One row per GPU with model, memory, use (when sampled) and holder.
  EXPECT_THAT(out, testing::ContainsRegex(
                       "gpu-a +0 +NVIDIA H100 80GB HBM3 +80 GiB +- +- +GPU-0a1b +- +-"));
  EXPECT_THAT(out, testing::ContainsRegex(
                       "gpu-a +1 +NVIDIA H100 80GB HBM3 +80 GiB +12.0 GiB +93% +GPU-2c3d +cnn-x1y2z +3"));
}

TEST(RenderTest, WorkersShowTheirLabelsAndJobsTheirPriorityAndSelector) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  v1::Worker labelled;
  labelled.set_name("node-a");
  labelled.set_alive(true);
  (*labelled.mutable_labels())["pool"] = "team-a";
  (*labelled.mutable_labels())["gpu"] = "h100";
  v1::Worker plain;
  plain.set_name("node-b");
  plain.set_alive(true);
  const std::string out = RenderWorkers({labelled, plain}, now);
  EXPECT_THAT(out, testing::ContainsRegex("WORKER +STATE .* GPUS +LABELS +LAST HEARTBEAT"));
  EXPECT_THAT(out, testing::ContainsRegex("node-a +alive .* gpu=h100,pool=team-a +"));
  EXPECT_THAT(out, testing::ContainsRegex("node-b +alive .* 0 +- +"));

  v1::Job job;
  job.set_id("urgent-x1y2z");
  job.set_name("urgent");
  job.set_state(v1::PENDING);
  job.set_priority(10);
  job.set_preemptions(2);
  (*job.mutable_node_selector())["pool"] = "team-a";
  EXPECT_THAT(RenderJobList({job}, now), testing::ContainsRegex("urgent-x1y2z +urgent +PENDING +10 "));
  const std::string detail = RenderJob(job, now);
  EXPECT_THAT(detail, testing::ContainsRegex("Priority: +10 \\(preempted 2 time\\(s\\)\\)"));
  EXPECT_THAT(detail, testing::ContainsRegex("Node selector: +pool=team-a"));
  EXPECT_THAT(detail, testing::ContainsRegex("Preemption: +at its next checkpoint"));
}

TEST(RenderTest, AJobShowsItsNewestCheckpointAndWhatAPreemptionNowWouldLose) {
  const absl::Time now = absl::FromUnixSeconds(10000);
  v1::Job job;
  job.set_id("train-x1y2z");
  job.set_state(v1::RUNNING);
  job.set_preemption(v1::PREEMPT_KILL);
  EXPECT_THAT(RenderJob(job, now), testing::ContainsRegex("Checkpoint: +- \\(none reported\\)"));
  EXPECT_THAT(RenderJob(job, now), testing::Not(HasSubstr("Preempted now:")))
      << "unset: the coordinator says it cannot be preempted";
  job.set_last_checkpoint_attempt(2);
  job.set_last_checkpoint_step(5000);
  job.set_last_checkpoint_ms((10000 - 90) * 1000);
  job.set_preemption_loss_ms(90 * 1000);
  const std::string detail = RenderJob(job, now);
  EXPECT_THAT(detail, testing::ContainsRegex("Checkpoint: +global step 5000 \\(attempt 2\\), 1m ?30s ago"));
  EXPECT_THAT(detail, testing::ContainsRegex("Preempted now: +would lose 1m ?30s of training"));
  // The latest metrics show where the steps went, when the ranks say.
  v1::RankMetrics* m = job.add_metrics();
  m->set_step_ms(12.5);
  m->set_comm_ms(2);
  EXPECT_THAT(RenderJob(job, now), testing::Not(HasSubstr("COMPUTE MS")));
  m->set_data_ms(1.5);
  m->set_compute_ms(8.25);
  m->set_optimizer_ms(0.75);
  EXPECT_THAT(RenderJob(job, now), testing::ContainsRegex("COMM MS +DATA MS +COMPUTE MS +OPTIMIZER MS +UPDATED"));
  EXPECT_THAT(RenderJob(job, now), testing::ContainsRegex("12.5 +2.0 +1.5 +8.2 +0.8 "));
  job.set_preemption(v1::PREEMPT_AT_CHECKPOINT);
  job.set_preemption_loss_ms(0);
  EXPECT_THAT(RenderJob(job, now),
              testing::ContainsRegex("Preempted now: +would lose nothing \\(moves at its next checkpoint\\)"));
}

TEST(RenderTest, WorkersWithoutGpusShowNoGpuTable) {
  v1::Worker cpu;
  cpu.set_name("cpu-b");
  cpu.set_alive(true);
  EXPECT_THAT(RenderWorkers({cpu}, absl::FromUnixSeconds(1000)), testing::Not(HasSubstr("MODEL")));
}

TEST(RenderTest, AQuarantinedWorkerShowsItsStateAndWhyWithTheTimeLeft) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  v1::Worker q;
  q.set_name("w1");
  q.set_alive(true);
  q.set_quarantined_until_ms(absl::ToUnixMillis(now + absl::Seconds(25)));
  q.set_quarantine_reason("could not start trainers of j attempt 1: workdir /x does not exist");
  v1::Worker ok;
  ok.set_name("w2");
  ok.set_alive(true);
  const std::string out = RenderWorkers({q, ok}, now);
  EXPECT_THAT(out, testing::ContainsRegex("w1 +quarantined "));
  EXPECT_THAT(out, testing::ContainsRegex("w2 +alive "));
  EXPECT_THAT(out, HasSubstr("w1 is quarantined for another 25s: could not start trainers of j "
                             "attempt 1: workdir /x does not exist\n"));
}

TEST(RenderTest, WorkersInMaintenanceShowTheirStateWhoAndSince) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  v1::Worker cordoned;
  cordoned.set_name("w1");
  cordoned.set_alive(true);
  cordoned.set_maintenance(v1::WORKER_CORDONED);
  cordoned.set_maintenance_since_ms(absl::ToUnixMillis(now));
  cordoned.set_maintenance_by("alice");
  v1::Worker draining = cordoned;
  draining.set_name("w2");
  draining.set_maintenance(v1::WORKER_DRAINING);
  draining.clear_maintenance_by();
  draining.add_jobs("j-1");
  v1::Worker drained = draining;
  drained.set_name("w3");
  drained.set_alive(false);
  drained.clear_jobs();
  const std::string out = RenderWorkers({cordoned, draining, drained}, now);
  EXPECT_THAT(out, testing::ContainsRegex("w1 +alive,cordoned "));
  EXPECT_THAT(out, testing::ContainsRegex("w2 +alive,draining "));
  EXPECT_THAT(out, testing::ContainsRegex("w3 +lost,drained "));
  EXPECT_THAT(out, HasSubstr("w1 is cordoned since 2027-01-15 08:00:00 UTC by alice\n"));
  EXPECT_THAT(out, HasSubstr("w2 is draining (each job moves after its next checkpoint) since "
                             "2027-01-15 08:00:00 UTC\n"));

  v1::WorkerSummary summary;
  summary.set_workers(3);
  summary.set_cordoned(3);
  EXPECT_THAT(RenderWorkerSummary(summary), HasSubstr("; 3 cordoned or draining"));
  summary.set_cordoned(0);
  EXPECT_THAT(RenderWorkerSummary(summary), testing::Not(HasSubstr("cordoned")));
}

TEST(RenderTest, MaintenanceRepliesSayWhatHappensToTheJobs) {
  v1::Worker w;
  w.set_name("w2");
  w.set_alive(true);
  w.add_jobs("j-1");
  w.add_jobs("j-2");
  w.set_maintenance(v1::WORKER_CORDONED);
  EXPECT_EQ(DescribeMaintenance(w),
            "worker w2 cordoned: it takes no new ranks; its jobs (j-1, j-2) keep running");
  w.set_maintenance(v1::WORKER_DRAINING);
  EXPECT_THAT(DescribeMaintenance(w),
              HasSubstr("its jobs (j-1, j-2) move to other workers after their next checkpoint"));
  w.set_drain_policy(v1::DRAIN_NOW);
  EXPECT_THAT(DescribeMaintenance(w), HasSubstr("restart on other workers from their last"));
  w.set_drain_policy(v1::DRAIN_WAIT);
  EXPECT_THAT(DescribeMaintenance(w), HasSubstr("run to their end there"));
  w.clear_jobs();
  EXPECT_THAT(DescribeMaintenance(w), HasSubstr("worker w2 drained"));
  w.set_maintenance(v1::WORKER_SCHEDULABLE);
  EXPECT_EQ(DescribeMaintenance(w), "worker w2 uncordoned: it takes new ranks again");
}

}  // namespace
}  // namespace ddp
