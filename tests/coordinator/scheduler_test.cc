// The scheduler's decisions against a fake cluster: FIFO gang order, unschedulable
// jobs skipped, last call, and how much of the cluster a pass looks at.
#include "coordinator/core/scheduler.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

struct FakeNode {
  std::string name;
  int slots = 1;
  int free = 1;
  int gpus = 0;
  int free_gpus = 0;
};

// A cluster of nodes with fixed slots; counts how often the pass lists them.
class FakeCluster : public ClusterView {
 public:
  explicit FakeCluster(std::vector<FakeNode> nodes) : nodes_(std::move(nodes)) {}

  int CapableNodes(const NodeNeed& need) const override {
    int n = 0;
    for (const FakeNode& node : nodes_) n += Has(node.slots, node.gpus, need) ? 1 : 0;
    return n;
  }
  int EligibleNodes(const NodeNeed& need) const override {
    int n = 0;
    for (const FakeNode& node : nodes_) n += Has(node.free, node.free_gpus, need) ? 1 : 0;
    return n;
  }
  std::vector<NodeOffer> Offers(const NodeNeed& need) const override {
    ++offers_calls;
    std::vector<NodeOffer> out;
    for (const FakeNode& node : nodes_) {
      if (!Has(node.free, node.free_gpus, need)) continue;
      NodeOffer o{node.name, "addr", node.free, node.gpus, {}};
      for (int g = 0; g < node.free_gpus; ++g) o.free_gpus.push_back(absl::StrCat("GPU-", g));
      out.push_back(std::move(o));
    }
    std::sort(out.begin(), out.end(),
              [](const NodeOffer& a, const NodeOffer& b) { return a.worker < b.worker; });
    return out;
  }

  mutable int offers_calls = 0;

 private:
  static bool Has(int slots, int gpus, const NodeNeed& need) {
    return (need.gpus ? std::min(slots, gpus) : slots) >= need.MinRanks();
  }

  std::vector<FakeNode> nodes_;
};

// Nodes n1..n<count>, each with `slots` slots of which `free` are free.
std::vector<FakeNode> Nodes(int count, int slots = 1, int free = 1) {
  std::vector<FakeNode> nodes;
  for (int i = 1; i <= count; ++i) nodes.push_back({absl::StrCat("n", i), slots, free, 0, 0});
  return nodes;
}

class SchedulerTest : public ::testing::Test {
 protected:
  // Queues a job of `min`:`max` nodes with `nproc` ranks per node.
  JobRecord& Queue(int min, int max, int nproc = 1, int last_call_s = 10) {
    JobSpec spec;
    spec.name = "job";
    spec.nodes = {min, max};
    spec.nproc_per_node = nproc;
    spec.rdzv.last_call_s = last_call_s;
    const int64_t seq = static_cast<int64_t>(jobs_.size()) + 1;
    JobRecord& job = jobs_.emplace_back(
        NewJob(absl::StrCat("job-", seq), seq, spec, "", "", "/w", kNow));
    queue_.Sync(job);
    return job;
  }

  static std::vector<std::string> Kinds(const std::vector<Decision>& decisions) {
    std::vector<std::string> out;
    for (const Decision& d : decisions) {
      const char* kind = d.kind == Decision::Kind::kUnschedulable ? "unschedulable"
                         : d.kind == Decision::Kind::kWait        ? "wait"
                         : d.kind == Decision::Kind::kLastCall    ? "last call"
                                                                  : "form";
      out.push_back(absl::StrCat(d.job->job.id(), ": ", kind));
    }
    return out;
  }

  static std::vector<std::string> Workers(const Decision& d) {
    std::vector<std::string> out;
    for (const NodeOffer& n : d.nodes) out.push_back(n.worker);
    return out;
  }

  std::deque<JobRecord> jobs_;  // Stable addresses, as the coordinator's map has.
  JobQueue queue_;
};

TEST_F(SchedulerTest, FormsTheHeadOfTheQueueOnItsNodesInNameOrder) {
  FakeCluster cluster({{"n3"}, {"n1"}, {"n2"}});
  Queue(2, 2);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: form"));
  EXPECT_THAT(Workers(decisions[0]), ElementsAre("n1", "n2"));
}

TEST_F(SchedulerTest, AHeadThatCouldRunButCannotYetHoldsTheQueue) {
  FakeCluster cluster({{"n1", 1, 0}, {"n2", 1, 1}});  // n1 busy.
  Queue(2, 2);
  Queue(1, 1);  // Would fit on n2, but waits its turn: no backfill.
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: wait"));
  EXPECT_EQ(decisions[0].reason, "waiting for 2 node(s) with 1 free slot(s); 1 available");
}

TEST_F(SchedulerTest, AJobTheClusterCannotHoldIsSkippedAndTheNextStarts) {
  FakeCluster cluster(Nodes(2));
  Queue(3, 3);  // Needs more nodes than there are.
  Queue(2, 2);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: unschedulable", "job-2: form"));
  EXPECT_EQ(decisions[0].reason,
            "unschedulable: needs 3 node(s) with 1 slot(s) each; the cluster has 2 such "
            "node(s) alive (skipped until it can hold it)");
}

TEST_F(SchedulerTest, NodesTooSmallForAJobMakeItUnschedulable) {
  FakeCluster cluster(Nodes(4, /*slots=*/2, /*free=*/2));
  Queue(1, 1, /*nproc=*/4);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: unschedulable"));
  EXPECT_THAT(decisions[0].reason, HasSubstr("needs 1 node(s) with 4 slot(s) each; the cluster "
                                             "has 0 such node(s)"));
}

TEST_F(SchedulerTest, JobsBehindTheHeadAreLabelledButDoNotStart) {
  FakeCluster cluster({{"n1", 1, 0}, {"n2", 1, 0}, {"n3", 1, 1}});
  Queue(2, 2);
  Queue(5, 5);  // Never fits: says so, wherever it is in the queue.
  JobRecord& third = Queue(1, 1);
  third.job.set_unschedulable(true);  // Did not fit before the cluster grew.
  Queue(1, 1);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  EXPECT_THAT(Kinds(decisions),
              ElementsAre("job-1: wait", "job-2: unschedulable", "job-3: wait"));
  EXPECT_EQ(decisions[2].reason, "queued: waiting for the jobs ahead of it to start");
}

TEST_F(SchedulerTest, AnElasticJobGathersUntilItsLastCallEndsThenForms) {
  FakeCluster cluster(Nodes(2));
  JobRecord& job = Queue(1, 3, 1, /*last_call_s=*/10);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: last call"));
  EXPECT_EQ(decisions[0].window_end, kNow + absl::Seconds(10));
  EXPECT_EQ(decisions[0].eligible, 2);
  OpenLastCall(job, decisions[0].window_end, 2);
  EXPECT_THAT(Kinds(SchedulePass(queue_, cluster, kNow + absl::Seconds(9))),
              ElementsAre("job-1: last call"));
  decisions = SchedulePass(queue_, cluster, kNow + absl::Seconds(10));
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: form"));
  EXPECT_THAT(Workers(decisions[0]), ElementsAre("n1", "n2"));
}

TEST_F(SchedulerTest, AnElasticJobFormsAtOnceWithMaxNodesAndTakesNoMore) {
  FakeCluster cluster(Nodes(5));
  Queue(1, 3);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: form"));
  EXPECT_THAT(Workers(decisions[0]), ElementsAre("n1", "n2", "n3"));
}

TEST_F(SchedulerTest, DecidingThatNothingCanStartListsNoNodes) {
  FakeCluster cluster(Nodes(10000, 1, 0));  // A big cluster, all busy.
  Queue(10, 10);
  Queue(20000, 20000);
  for (int i = 0; i < 100; ++i) SchedulePass(queue_, cluster, kNow);
  EXPECT_EQ(cluster.offers_calls, 0) << "counts only: nodes are listed to form an attempt";
}

TEST_F(SchedulerTest, TheQueueKeepsSubmissionOrderAndPositionsCountPendingJobs) {
  JobRecord& a = Queue(1, 1);
  JobRecord& b = Queue(1, 1);
  JobRecord& c = Queue(1, 3);
  EXPECT_EQ(queue_.Position(a), 1);
  EXPECT_EQ(queue_.Position(c), 3);
  OpenLastCall(a, kNow, 1);  // Gathering: still queued, no longer PENDING.
  EXPECT_FALSE(queue_.Sync(a)) << "still queued";
  EXPECT_EQ(queue_.Position(a), 0);
  EXPECT_EQ(queue_.Position(b), 1);
  ASSERT_TRUE(Cancel(b, kNow).ok());
  EXPECT_TRUE(queue_.Sync(b)) << "a finished job leaves the queue";
  EXPECT_EQ(queue_.jobs().size(), 2u);
  EXPECT_EQ(queue_.Position(c), 1);
}

}  // namespace
}  // namespace ddp
