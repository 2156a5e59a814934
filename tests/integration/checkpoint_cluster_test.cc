// Resuming after faults on a real cluster: the coordinator restarts the job, the
// trainers agree on the newest checkpoint any node holds, and training continues with
// exactly the losses an uninterrupted run has. Each node keeps its checkpoints in its
// own directory ({node} in checkpoint.dir), as nodes without shared storage do.
#include <signal.h>

#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;
using ::testing::HasSubstr;

// Two nodes, two epochs of 313 steps per rank, a checkpoint every 50 steps.
std::string Job(const std::string& dir, const std::string& name, int max_restarts) {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  testing::WriteFile(path, absl::StrCat("name: ", name, R"(
nodes: 2
max_restarts: )", max_restarts, R"(
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: 2, batch_size: 32, threads: 1, optimizer: {name: adam, lr: 0.001}}
checkpoint: {dir: "ckpt/{job_id}/{node}", every_steps: 50}
metrics: {every_steps: 1}
)"));
  return path;
}

std::string SubmitOk(LocalCluster& c, const std::string& spec) {
  CtlResult r = c.Ctl({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::string(absl::StripAsciiWhitespace(r.out));
}

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

// (rank, epoch, step) -> loss of one attempt, from the coordinator's stored history.
using Losses = std::map<std::tuple<int, int64_t, int64_t>, double>;
Losses LossesOf(const v1::Job& job, int attempt) {
  Losses out;
  for (const v1::RankMetrics& m : job.history()) {
    if (m.attempt() == attempt) out[{m.rank(), m.epoch(), m.step()}] = m.loss();
  }
  return out;
}

// Runs the job once without faults and returns its losses.
Losses Reference(LocalCluster& c) {
  const std::string id = SubmitOk(c, Job(c.dir(), "reference", 0));
  auto done = c.WaitFor(id, Ended);
  EXPECT_TRUE(done.ok() && done->state() == v1::SUCCEEDED) << done.status();
  auto job = c.GetJob(id, /*history=*/true);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? LossesOf(*job, 1) : Losses();
}

// Every loss attempt 2 logged equals the reference's; it starts past the beginning
// (resumed) and goes to the end.
void ExpectSecondAttemptMatches(const v1::Job& job, const Losses& reference) {
  const Losses resumed = LossesOf(job, 2);
  ASSERT_FALSE(resumed.empty());
  ASSERT_EQ(reference.size(), 2u * 2 * 313);
  EXPECT_LT(resumed.size(), reference.size()) << "attempt 2 started over instead of resuming";
  EXPECT_EQ(resumed.rbegin()->first, reference.rbegin()->first) << "and trained to the end";
  for (const auto& [at, loss] : resumed) {
    ASSERT_TRUE(reference.count(at));
    EXPECT_NEAR(loss, reference.at(at), 1e-6)
        << "rank " << std::get<0>(at) << " epoch " << std::get<1>(at) << " step "
        << std::get<2>(at);
  }
}

TEST(CheckpointClusterTest, KillingATrainerMidEpochRestartsOnceWithTheLossesOfAnUninterruptedRun) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const Losses reference = Reference(c);

  const std::string id = SubmitOk(c, Job(c.dir(), "killed", 1));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2 && j.metrics(1).global_step() > 120;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_LT(running->metrics(1).epoch(), 1) << "too late for a mid-epoch kill";
  const int pid = running->attempts(0).ranks(1).pid();
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);

  auto done = c.WaitFor(id, Ended);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts(), 1);
  ASSERT_EQ(done->attempts_size(), 2);
  auto job = c.GetJob(id, /*history=*/true);
  ASSERT_TRUE(job.ok()) << job.status();
  ExpectSecondAttemptMatches(*job, reference);
}

TEST(CheckpointClusterTest, ARestartWhoseRankZeroLandsOnANodeWithoutCheckpointsResumes) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const Losses reference = Reference(c);

  // Attempt 1 on w1 (rank 0) and w2 (rank 1), each keeping its own checkpoints.
  const std::string id = SubmitOk(c, Job(c.dir(), "moved", 1));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2 && j.metrics(0).global_step() > 120;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  // w1 is lost for good (its agent and trainer die); a new node, a0, joins. Ranks go
  // by worker name, so attempt 2 puts rank 0 on a0, which has no checkpoint, and
  // rank 1 on w2, which has them all.
  c.worker(0).Signal(SIGKILL);
  ASSERT_TRUE(c.AddWorker("a0").ok());
  auto done = c.WaitFor(id, Ended);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->attempts_size(), 2);
  EXPECT_EQ(done->attempts(1).ranks(0).worker(), "a0");
  EXPECT_EQ(done->attempts(1).ranks(1).worker(), "w2");
  CtlResult logs = c.Ctl({"logs", id, "--rank", "0"});
  EXPECT_THAT(logs.out, HasSubstr("(held by rank 1) at epoch 0"));
  auto job = c.GetJob(id, /*history=*/true);
  ASSERT_TRUE(job.ok()) << job.status();
  ExpectSecondAttemptMatches(*job, reference);
}

}  // namespace
}  // namespace ddp
