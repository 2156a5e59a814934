// The whole system as users run it: a ddp-coordinator process, ddp-worker processes
// spawning real ddp-trainer ranks that form a Gloo group, and ddpctl, over loopback.
#include <signal.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;
using ::testing::HasSubstr;
using ::testing::Not;

// A synthetic job that trains for a while (several seconds on two cores).
std::string LongJob(const std::string& dir, const std::string& name, int epochs,
                    const std::string& extra = "") {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  testing::WriteFile(path, absl::StrCat("name: ", name, R"(
nodes: 2
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: )", epochs, R"(, batch_size: 32, optimizer: {name: adam, lr: 0.001}}
metrics: {every_steps: 5}
)", extra));
  return path;
}

std::string SubmitOk(LocalCluster& c, const std::string& spec) {
  CtlResult r = c.Ctl({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::string(absl::StripAsciiWhitespace(r.out));
}

bool Running(const v1::Job& j) { return j.state() == v1::RUNNING && j.metrics_size() == 2; }

std::set<int> TrainerPids(const v1::Job& job) {
  std::set<int> pids;
  for (const auto& a : job.attempts()) {
    for (const auto& r : a.ranks()) {
      if (r.pid()) pids.insert(r.pid());
    }
  }
  return pids;
}

bool ProcessGone(int pid) {
  if (::kill(pid, 0) != 0) return true;
  // A zombie not yet reaped by its parent is gone for our purposes.
  std::string stat = testing::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t close = stat.rfind(')');
  return close == std::string::npos || (close + 2 < stat.size() && stat[close + 2] == 'Z');
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = LocalCluster::Start({});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(ClusterTest, TrainsTheBreastCancerExampleWhileWatchShowsEveryRankLive) {
  const std::string spec = testing::StageExample("cancer.yaml", cluster_->dir());
  const std::string id = SubmitOk(*cluster_, spec);
  ASSERT_FALSE(id.empty());
  // ddpctl watch, with stdout a pipe: plain lines as updates arrive.
  CtlResult watch = cluster_->Ctl({"watch", id});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_THAT(watch.err, HasSubstr(absl::StrCat("job ", id, " SUCCEEDED")));
  // Both ranks' loss and throughput, at many points of training, not only the end.
  testing::WatchLines seen = testing::ParseWatch(watch.out);
  for (const auto& [rank, lines] : seen.lines) {
    for (const std::string& line : lines) {
      EXPECT_THAT(line, HasSubstr(" loss "));
      EXPECT_THAT(line, HasSubstr(" samples/s "));
    }
  }
  EXPECT_GE(seen.epochs[0].size(), 10u) << watch.out;
  EXPECT_GE(seen.epochs[1].size(), 10u) << watch.out;
  const size_t rank1 = watch.out.find(" rank 1 epoch ");
  const size_t succeeded = watch.out.find("SUCCEEDED");
  ASSERT_NE(rank1, std::string::npos) << watch.out;
  ASSERT_NE(succeeded, std::string::npos) << watch.out;
  EXPECT_LT(rank1, succeeded) << "live updates before the outcome";

  auto job = cluster_->GetJob(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  ASSERT_FALSE(job->epoch_history().empty());
  EXPECT_GE(job->epoch_history().rbegin()->val_accuracy(), 0.95);
  // The rank table: ranks 0 and 1 on w1 and w2, by name.
  ASSERT_EQ(job->attempts_size(), 1);
  EXPECT_EQ(job->attempts(0).ranks(0).worker(), "w1");
  EXPECT_EQ(job->attempts(0).ranks(1).worker(), "w2");

  CtlResult get = cluster_->Ctl({"get", id});
  EXPECT_EQ(get.exit_code, 0);
  EXPECT_THAT(get.out, HasSubstr("State:           SUCCEEDED"));
  EXPECT_THAT(get.out, HasSubstr("w2      127.0.0.1"));

  CtlResult logs = cluster_->Ctl({"logs", id, "--rank", "1"});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("[rank 1] rank 1/2 on cpu (gloo): mlp 30-64-32-2"));
  EXPECT_THAT(logs.out, HasSubstr("* done after"));
  EXPECT_THAT(logs.out, Not(HasSubstr("[rank 0]")));
  CtlResult all = cluster_->Ctl({"logs", id});
  EXPECT_THAT(all.out, HasSubstr("[rank 0] * started: mlp 30-64-32-2"));
  EXPECT_THAT(all.out, HasSubstr("[rank 1] * started: mlp 30-64-32-2"));
}

// A paused ddpctl: the kernel's socket buffers absorb what the coordinator sends it,
// so this is no test of back-pressure (server_test's StreamingTest is); it checks
// that a watcher paused mid-job and resumed after the end still reports the outcome.
TEST_F(ClusterTest, AWatcherPausedMidJobResumesToTheOutcome) {
  const std::string id = SubmitOk(*cluster_, LongJob(cluster_->dir(), "watched", 2));
  auto stalled = cluster_->CtlAsync({"watch", id});
  ASSERT_TRUE(stalled.ok());
  ASSERT_TRUE(cluster_->WaitFor(id, Running).ok());
  (*stalled)->Signal(SIGSTOP);
  // Meanwhile another watcher follows the job to its end, and the job finishes.
  CtlResult live = cluster_->Ctl({"watch", id});
  EXPECT_EQ(live.exit_code, 0) << live.err;
  EXPECT_THAT(live.err, HasSubstr("SUCCEEDED"));
  auto job = cluster_->GetJob(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_EQ(job->epoch_history_size(), 2);
  // Resumed, the stalled watcher gets the final state, not a backlog, and exits 0.
  (*stalled)->Signal(SIGCONT);
  auto status = (*stalled)->WaitFor(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->exit_code, 0);
}

TEST_F(ClusterTest, ASecondJobWaitsPendingUntilTheFirstEndsThenRuns) {
  const std::string first = SubmitOk(*cluster_, LongJob(cluster_->dir(), "first", 2));
  const std::string second = SubmitOk(*cluster_, LongJob(cluster_->dir(), "second", 1));
  ASSERT_TRUE(cluster_->WaitFor(first, Running).ok());
  auto waiting = cluster_->GetJob(second);
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(waiting->state(), v1::PENDING);
  EXPECT_EQ(waiting->queue_position(), 1);
  CtlResult get = cluster_->Ctl({"get", second});
  EXPECT_THAT(get.out, HasSubstr("PENDING (queue position 1)"));

  auto done = cluster_->WaitFor(second, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; });
  ASSERT_TRUE(done.ok()) << done.status();
  auto first_job = cluster_->GetJob(first);
  ASSERT_TRUE(first_job.ok());
  EXPECT_EQ(first_job->state(), v1::SUCCEEDED);
  EXPECT_GE(done->attempts(0).start_ms(), first_job->end_ms());
}

TEST_F(ClusterTest, CancelMidRunEndsTheJobAndLeavesNoTrainer) {
  const std::string id = SubmitOk(*cluster_, LongJob(cluster_->dir(), "long", 100));
  auto running = cluster_->WaitFor(id, Running);
  ASSERT_TRUE(running.ok()) << running.status();
  const std::set<int> pids = TrainerPids(*running);
  ASSERT_EQ(pids.size(), 2u);

  CtlResult cancel = cluster_->Ctl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_THAT(cancel.out, HasSubstr("cancelled; its trainers have stopped"));
  auto job = cluster_->GetJob(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::CANCELLED);
  for (const auto& r : job->attempts(0).ranks()) {
    EXPECT_TRUE(r.exited()) << "rank " << r.rank();
    // Stopped within the grace period: by its SIGTERM or, when its peer was stopped
    // first (a loaded machine delivers the two signals apart), by the retryable error
    // of its broken collective. Never SIGKILL: that would mean the grace ran out.
    EXPECT_TRUE(r.signal() == SIGTERM || (r.signal() == 0 && r.exit_code() == 1))
        << "rank " << r.rank() << ": " << r.ShortDebugString();
  }
  for (int pid : pids) EXPECT_TRUE(ProcessGone(pid)) << "trainer " << pid << " still runs";
  // `watch` on a cancelled job reports the outcome with its own exit code.
  CtlResult watch = cluster_->Ctl({"watch", id});
  EXPECT_EQ(watch.exit_code, 3);
}

TEST_F(ClusterTest, BadRequestsGetClearErrorsAndStoreNothing) {
  const std::string live = SubmitOk(
      *cluster_, LongJob(cluster_->dir(), "holder", 100, "rdzv_id: shared-rdzv\n"));
  CtlResult dup = cluster_->Ctl(
      {"submit", LongJob(cluster_->dir(), "dup", 1, "rdzv_id: shared-rdzv\n")});
  EXPECT_EQ(dup.exit_code, 1);
  EXPECT_THAT(dup.err, HasSubstr(absl::StrCat("rdzv_id 'shared-rdzv' is in use by job ", live)));

  CtlResult unknown = cluster_->Ctl({"get", "no-such-job"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("job 'no-such-job' not found: `ddpctl list` shows"));
  EXPECT_EQ(cluster_->Ctl({"cancel", "no-such-job"}).exit_code, 1);
  EXPECT_EQ(cluster_->Ctl({"logs", "no-such-job"}).exit_code, 1);

  const std::string bad = cluster_->dir() + "/bad.yaml";
  testing::WriteFile(bad, "name: bad\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain:\n"
                          "  epochs: 1\n  batch_size: 0\n");
  CtlResult invalid = cluster_->Ctl({"submit", bad});
  EXPECT_EQ(invalid.exit_code, 2);
  EXPECT_THAT(invalid.err, HasSubstr(bad + ":6: train.batch_size: must be > 0 (got 0)"));
  testing::WriteFile(bad, "name: bad\nmodel: {mlp: {}\n");
  invalid = cluster_->Ctl({"submit", bad});
  EXPECT_EQ(invalid.exit_code, 2);
  EXPECT_THAT(invalid.err, HasSubstr("not valid YAML"));

  CtlResult list = cluster_->Ctl({"list", "-o", "json"});
  EXPECT_EQ(list.exit_code, 0);
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(list.out, &jobs).ok()) << list.out;
  EXPECT_EQ(jobs.jobs_size(), 1) << "only the valid job was stored";

  CtlResult nowhere = testing::RunCapture(
      {testing::BinDir() + "/ddpctl", "list", "--coordinator", "127.0.0.1:1"},
      absl::Seconds(30));
  EXPECT_EQ(nowhere.exit_code, 1);
  EXPECT_THAT(nowhere.err,
              HasSubstr("no coordinator at 127.0.0.1:1: is ddp-coordinator running?"));
  // Global flags go before the verb as well as after it.
  CtlResult before = testing::RunCapture(
      {testing::BinDir() + "/ddpctl", "--coordinator", "127.0.0.1:1", "list"}, absl::Seconds(30));
  EXPECT_EQ(before.exit_code, 1) << before.err;
  EXPECT_THAT(before.err, HasSubstr("no coordinator at 127.0.0.1:1"));
  CtlResult json_first = cluster_->Ctl({"-o", "json", "list"});
  EXPECT_EQ(json_first.exit_code, 0) << json_first.err;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json_first.out, &jobs).ok())
      << json_first.out;
  EXPECT_EQ(cluster_->Ctl({"cancel", live}).exit_code, 0);
}

TEST_F(ClusterTest, ARestartedCoordinatorServesTheSameHistory) {
  const std::string spec = testing::StageExample("cancer.yaml", cluster_->dir());
  const std::string id = SubmitOk(*cluster_, spec);
  ASSERT_TRUE(
      cluster_->WaitFor(id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }).ok());
  CtlResult before = cluster_->Ctl({"get", id, "-o", "json", "--history"});
  CtlResult logs_before = cluster_->Ctl({"logs", id});
  ASSERT_EQ(before.exit_code, 0);

  EXPECT_TRUE(cluster_->StopCoordinator(SIGTERM).ok()) << "clean exit on SIGTERM";
  ASSERT_TRUE(cluster_->StartCoordinator().ok());

  CtlResult after = cluster_->Ctl({"get", id, "-o", "json", "--history"});
  ASSERT_EQ(after.exit_code, 0) << after.err;
  v1::Job a, b;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(before.out, &a).ok());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(after.out, &b).ok());
  EXPECT_EQ(b.state(), v1::SUCCEEDED);
  EXPECT_EQ(b.attempts(0).DebugString(), a.attempts(0).DebugString()) << "rank table";
  EXPECT_EQ(b.epoch_history_size(), a.epoch_history_size());
  EXPECT_EQ(b.history_size(), a.history_size());
  EXPECT_GT(b.history_size(), 1000) << "every step of both ranks is stored";
  ASSERT_EQ(b.metrics_size(), 2);
  EXPECT_EQ(b.metrics(1).DebugString(), a.metrics(1).DebugString());
  EXPECT_EQ(cluster_->Ctl({"logs", id}).out, logs_before.out);
}

TEST_F(ClusterTest, TrainingCarriesOnWhileTheCoordinatorRestarts) {
  // A cluster whose workers wait 5 s, not the fixture's 2, before they ask the others and
  // fence (fence.h): a coordinator that takes 2 s to come back on a loaded machine (tests
  // side by side) is an outage this test means to ride out, not a partition.
  cluster_.reset();
  auto slower = LocalCluster::Start({.heartbeat_timeout = absl::Seconds(5)});
  ASSERT_TRUE(slower.ok()) << slower.status();
  cluster_ = std::move(*slower);
  const std::string id = SubmitOk(*cluster_, LongJob(cluster_->dir(), "survivor", 3));
  ASSERT_TRUE(cluster_->WaitFor(id, Running).ok());
  // A watcher and a log follower, connected before the coordinator dies.
  auto watch = cluster_->CtlAsync({"watch", id});
  auto logs = cluster_->CtlAsync({"logs", id, "-f"});
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(logs.ok()) << logs.status();
  testing::OutputCollector watch_out((*watch)->stdout_fd()), watch_err((*watch)->stderr_fd());
  testing::OutputCollector logs_out((*logs)->stdout_fd()), logs_err((*logs)->stderr_fd());
  ASSERT_TRUE(watch_out.WaitFor(" RUNNING")) << watch_err.text();
  ASSERT_TRUE(logs_out.WaitFor("* started:")) << logs_err.text();

  EXPECT_TRUE(cluster_->StopCoordinator(SIGKILL).signal == SIGKILL);
  ASSERT_TRUE(cluster_->StartCoordinator().ok());
  // The data plane never went through the coordinator: the same attempt finishes.
  auto done = cluster_->WaitFor(id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->attempts_size(), 1);
  EXPECT_EQ(done->restarts(), 0);
  EXPECT_EQ(done->epoch_history_size(), 3);

  // Both reconnected and ended with the job: watch with its outcome, logs with the
  // output after the restart and nothing twice.
  auto watch_exit = (*watch)->WaitFor(absl::Minutes(2));
  ASSERT_TRUE(watch_exit.has_value());
  const std::string werr = watch_err.Finish();
  EXPECT_EQ(watch_exit->exit_code, 0) << werr;
  EXPECT_THAT(werr, HasSubstr("coordinator unavailable, reconnecting..."));
  EXPECT_THAT(werr, HasSubstr(absl::StrCat("job ", id, " SUCCEEDED")));
  auto logs_exit = (*logs)->WaitFor(absl::Minutes(2));
  ASSERT_TRUE(logs_exit.has_value());
  const std::string lout = logs_out.Finish();
  EXPECT_EQ(logs_exit->exit_code, 0) << logs_err.Finish();
  for (int rank : {0, 1}) {
    const std::string started = absl::StrCat("[rank ", rank, "] * started:");
    const size_t first = lout.find(started);
    ASSERT_NE(first, std::string::npos) << lout;
    EXPECT_EQ(lout.find(started, first + 1), std::string::npos) << "repeated after reconnecting";
    EXPECT_THAT(lout, HasSubstr(absl::StrCat("[rank ", rank, "] * done after")));
  }
}

TEST(CoordinatorProcessTest, BadFlagValuesExitTwoAndABusyStateDirExitsOne) {
  const std::string dir = testing::MakeTempDir("coordinator-flags");
  const std::string bin = testing::BinDir() + "/ddp-coordinator";
  CtlResult zero = testing::RunCapture(
      {bin, "--listen", "127.0.0.1:0", "--state-dir", dir, "--retain-jobs", "0"},
      absl::Seconds(30));
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.err, HasSubstr("--retain-jobs: must be >= 1 (got 0)"));
  CtlResult order = testing::RunCapture(
      {bin, "--listen", "127.0.0.1:0", "--state-dir", dir, "--heartbeat-timeout", "500ms"},
      absl::Seconds(30));
  EXPECT_EQ(order.exit_code, 2);
  EXPECT_THAT(order.err, HasSubstr("must be shorter than --heartbeat-timeout"));

  auto cluster = LocalCluster::Start({.workers = 0});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  CtlResult busy = testing::RunCapture(
      {bin, "--listen", "127.0.0.1:0", "--state-dir", (*cluster)->dir() + "/state"},
      absl::Seconds(30));
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_THAT(busy.err, HasSubstr("is in use by another ddp-coordinator (pid "));
}

TEST(ClusterRestartTest, ALostWorkerRestartsTheJobFromItsCheckpointOnAnotherNode) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string id = SubmitOk(
      c, LongJob(c.dir(), "resilient", 3,
                 "max_restarts: 2\ncheckpoint: {dir: ckpt, every_steps: 50}\n"));
  ASSERT_TRUE(c.WaitFor(id, [](const v1::Job& j) {
                 return Running(j) && j.metrics(0).global_step() > 120;
               }).ok());
  // w2's agent dies; its trainer dies with it (PR_SET_PDEATHSIG).
  c.worker(1).Signal(SIGKILL);
  auto done = c.WaitFor(id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; });
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->attempts_size(), 2);
  EXPECT_EQ(done->attempts(0).state(), v1::FAILED);
  EXPECT_EQ(done->restarts(), 1);
  std::set<std::string> second;
  for (const auto& r : done->attempts(1).ranks()) second.insert(r.worker());
  EXPECT_EQ(second, (std::set<std::string>{"w1", "w3"}));
  CtlResult logs = c.Ctl({"logs", id, "--rank", "0"});
  EXPECT_THAT(logs.out, HasSubstr("resumed from")) << "attempt 2 resumed, not restarted";
}

}  // namespace
}  // namespace ddp
