// Node maintenance on a real cluster, with ddpctl as operators run it: a cordoned
// worker gets no ranks; draining a worker that runs a job moves the job to another
// worker right after its next checkpoint, where it resumes from that checkpoint and
// SUCCEEDS without spending a restart; a lost worker is removed; and what an operator
// set survives a coordinator restart.
#include <signal.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
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

// Two nodes, two epochs of 313 steps per rank, a checkpoint every 50 steps, no restarts
// allowed: a drain must not spend one.
std::string Job(const std::string& dir) {
  const std::string path = dir + "/moved.yaml";
  testing::WriteFile(path, R"(name: moved
nodes: 2
max_restarts: 0
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: 2, batch_size: 32, threads: 1, optimizer: {name: adam, lr: 0.001}}
checkpoint: {dir: "ckpt/{job_id}", every_steps: 50}
metrics: {every_steps: 1}
)");
  return path;
}

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

std::set<std::string> WorkersOf(const v1::Attempt& a) {
  std::set<std::string> out;
  for (const v1::RankAssignment& r : a.ranks()) out.insert(r.worker());
  return out;
}

// The STATE cell of `name` in `ddpctl workers`, "" if it is not listed.
std::string StateOf(LocalCluster& c, const std::string& name) {
  CtlResult r = c.Ctl({"workers"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream cells(line);
    std::string first, state;
    cells >> first >> state;
    if (first == name) return state;
  }
  return "";
}

TEST(MaintenanceClusterTest, CordonDrainAndRemoveAsAnOperatorDoes) {
  LocalCluster::Options options;
  options.workers = 3;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  CtlResult r = c.Ctl({"workers", "cordon", "w1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("worker w1 cordoned: it takes no new ranks"));
  EXPECT_EQ(StateOf(c, "w1"), "alive,cordoned");

  r = c.Ctl({"submit", Job(c.dir())});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string id(absl::StripAsciiWhitespace(r.out));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2 && j.metrics(0).global_step() > 60;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->metrics(0).epoch(), 0) << "too late to test a move mid-job";
  EXPECT_EQ(WorkersOf(running->attempts(0)), (std::set<std::string>{"w2", "w3"}))
      << "the cordoned worker got no rank";

  // Take w2 out: w1 comes back into service, and the job moves to w1 and w3 after its
  // next checkpoint.
  r = c.Ctl({"workers", "uncordon", "w1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("worker w1 uncordoned"));
  r = c.Ctl({"workers", "drain", "w2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("worker w2 draining: its jobs (", id,
                                            ") move to other workers after their next "
                                            "checkpoint")));

  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts(), 0) << "a drain spends no restart (max_restarts: 0)";
  ASSERT_EQ(done->attempts_size(), 2);
  EXPECT_THAT(done->attempts(0).reason(),
              HasSubstr("preempted: worker w2 is draining: moving to other workers from the "
                        "checkpoint of global step"));
  EXPECT_EQ(WorkersOf(done->attempts(1)), (std::set<std::string>{"w1", "w3"}));
  EXPECT_EQ(StateOf(c, "w2"), "alive,drained");

  // Attempt 2 resumed from the checkpoint: it did not start over, and where both
  // attempts ran the same step, they computed the same loss.
  auto job = c.GetJob(id, /*history=*/true);
  ASSERT_TRUE(job.ok()) << job.status();
  std::map<std::tuple<int, int64_t, int64_t>, double> first, second;
  for (const v1::RankMetrics& m : job->history()) {
    (m.attempt() == 1 ? first : second)[{m.rank(), m.epoch(), m.step()}] = m.loss();
  }
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  EXPECT_GT(second.begin()->first, first.begin()->first) << "attempt 2 started over";
  EXPECT_LT(second.size(), 2u * 2 * 313) << "attempt 2 started over";
  EXPECT_EQ(std::get<1>(second.rbegin()->first), 1) << "attempt 2 trained to the end";
  // It resumed from the very checkpoint the move was made at (313 steps per epoch).
  const std::string& reason = done->attempts(0).reason();
  const size_t at = reason.rfind("global step ");
  ASSERT_NE(at, std::string::npos) << reason;
  const int64_t checkpoint = std::stoll(reason.substr(at + 12));
  EXPECT_EQ(second.begin()->first, std::make_tuple(0, checkpoint / 313, checkpoint % 313))
      << "attempt 2's first step is the one after global step " << checkpoint;
  // Where attempt 1 ran past the checkpoint before it was stopped, both computed the
  // same losses (the resume is exact).
  for (const auto& [step, loss] : second) {
    auto it = first.find(step);
    if (it == first.end()) continue;
    EXPECT_NEAR(loss, it->second, 1e-6)
        << "rank " << std::get<0>(step) << " epoch " << std::get<1>(step) << " step "
        << std::get<2>(step);
  }

  // rm: refused while w2 is alive; once its agent is gone and it is lost, removed.
  r = c.Ctl({"workers", "rm", "w2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("only a lost worker can be removed"));
  c.worker(1).Signal(SIGKILL);
  for (int i = 0; i < 100 && StateOf(c, "w2") != "lost,drained"; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_EQ(StateOf(c, "w2"), "lost,drained");
  r = c.Ctl({"workers", "rm", "w2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("worker w2 removed"));
  EXPECT_EQ(StateOf(c, "w2"), "");

  // What the operator set survives a coordinator restart.
  r = c.Ctl({"workers", "cordon", "w3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  c.StopCoordinator(SIGTERM);
  ASSERT_TRUE(c.StartCoordinator().ok());
  ASSERT_TRUE(c.WaitForWorkers(2).ok());
  EXPECT_EQ(StateOf(c, "w3"), "alive,cordoned");
  EXPECT_EQ(StateOf(c, "w1"), "alive");
  EXPECT_EQ(StateOf(c, "w2"), "") << "removed stays removed";
  r = c.Ctl({"workers", "--summary"});
  EXPECT_THAT(r.out, HasSubstr("1 cordoned or draining"));
}

}  // namespace
}  // namespace ddp
