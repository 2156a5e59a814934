// Priorities, node labels and preemption on a real 3-worker cluster, with ddpctl as
// users run it: jobs queued behind a running one start in priority order (FIFO within
// one); a worker's labels show in `ddpctl workers`; a high-priority job selected to a
// labelled node preempts a lower-priority job at its next checkpoint, runs there and
// SUCCEEDS, and the preempted job resumes from its checkpoint and SUCCEEDS without
// spending a restart.
#include <set>
#include <string>
#include <vector>

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

// A job file in `dir`: `nodes` nodes of synthetic data, `samples` of them, and `extra`
// top-level YAML.
std::string JobFile(const std::string& dir, const std::string& name, int nodes, int samples,
                    const std::string& extra = "") {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  testing::WriteFile(path, absl::StrCat("name: ", name, "\nnodes: ", nodes, R"(
max_restarts: 0
model: {mlp: {hidden: [64]}}
data: {synthetic: {samples: )", samples, R"(, features: 32, classes: 4}}
train: {epochs: 1, batch_size: 32, threads: 1}
metrics: {every_steps: 5}
)", extra));
  return path;
}

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

std::string Submit(LocalCluster& c, const std::string& path) {
  CtlResult r = c.Ctl({"submit", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string id = r.out;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

TEST(SchedulingClusterTest, PrioritiesLabelsAndPreemptionOnThreeWorkers) {
  LocalCluster::Options options;
  options.workers = 3;
  options.flags_of["w1"] = {"--label", "pool=a", "--label", "rack=r1"};
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  CtlResult workers = c.Ctl({"workers"});
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr("LABELS"));
  EXPECT_THAT(workers.out, HasSubstr("pool=a,rack=r1"));

  // 1. A queue served by priority: three 3-node jobs wait behind a running one.
  const std::string blocker = Submit(c, JobFile(c.dir(), "blocker", 3, 150000));
  ASSERT_TRUE(c.WaitFor(blocker, [](const v1::Job& j) { return j.state() == v1::RUNNING; }).ok());
  const std::string low = Submit(c, JobFile(c.dir(), "low", 3, 3000));
  const std::string mid = Submit(c, JobFile(c.dir(), "mid", 3, 3000, "priority: 5\n"));
  const std::string high = Submit(c, JobFile(c.dir(), "high", 3, 3000, "priority: 10\n"));
  const std::string mid2 = Submit(c, JobFile(c.dir(), "mid2", 3, 3000, "priority: 5\n"));
  auto still = c.GetJob(blocker);
  ASSERT_TRUE(still.ok());
  ASSERT_EQ(still->state(), v1::RUNNING)
      << "the blocker ended before the queue was filled: the test proves nothing";
  CtlResult list = c.Ctl({"list"});
  EXPECT_THAT(list.out, HasSubstr("PRIORITY"));
  EXPECT_THAT(c.Ctl({"get", high}).out, HasSubstr("queue position 1"));

  std::vector<std::pair<int64_t, std::string>> starts;
  for (const std::string& id : {low, mid, high, mid2}) {
    auto job = c.WaitFor(id, Ended, absl::Minutes(4));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->state(), v1::SUCCEEDED) << id << ": " << job->reason();
    starts.emplace_back(job->attempts(0).start_ms(), job->name());
  }
  std::sort(starts.begin(), starts.end());
  std::vector<std::string> order;
  for (const auto& [ms, name] : starts) order.push_back(name);
  EXPECT_THAT(order, ::testing::ElementsAre("high", "mid", "mid2", "low"));

  // 2. Preemption at a checkpoint, for a job selected to the labelled node.
  const std::string background =
      Submit(c, JobFile(c.dir(), "background", 3, 90000,
                        "checkpoint: {dir: \"ckpt/{job_id}\", every_steps: 40}\n"));
  ASSERT_TRUE(c.WaitFor(background, [](const v1::Job& j) {
                 return j.state() == v1::RUNNING && !j.metrics().empty() &&
                        j.metrics(0).global_step() >= 5;
               }).ok());
  const std::string urgent = Submit(
      c, JobFile(c.dir(), "urgent", 1, 2000, "priority: 10\nnode_selector: {pool: a}\n"));
  auto done = c.WaitFor(urgent, Ended, absl::Minutes(4));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->attempts(0).ranks(0).worker(), "w1") << "placed by its node_selector";

  auto resumed = c.WaitFor(background, Ended, absl::Minutes(4));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state(), v1::SUCCEEDED) << resumed->reason();
  EXPECT_EQ(resumed->preemptions(), 1);
  EXPECT_EQ(resumed->restarts(), 0) << "a preemption spends no restart";
  ASSERT_GE(resumed->attempts_size(), 2);
  EXPECT_TRUE(resumed->attempts(0).preempted());
  EXPECT_THAT(resumed->attempts(0).reason(), HasSubstr(absl::StrCat("job ", urgent)));
  EXPECT_GE(resumed->attempts(1).start_ms(), done->end_ms())
      << "the preempted job came back once the urgent one was done";
  CtlResult get = c.Ctl({"get", background});
  EXPECT_THAT(get.out, HasSubstr("preempted 1 time(s)"));
}

}  // namespace
}  // namespace ddp
