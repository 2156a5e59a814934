// The scheduler's decisions against a fake cluster: FIFO gang order, unschedulable
// jobs skipped, last call, and how much of the cluster a pass looks at; priorities,
// node selectors, quotas and preemption (docs/scheduling.md).
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
  Labels labels = {};
};

// A cluster of nodes with fixed slots; counts how often the pass lists them.
class FakeCluster : public ClusterView {
 public:
  explicit FakeCluster(std::vector<FakeNode> nodes) : nodes_(std::move(nodes)) {}

  int CapableNodes(const NodeNeed& need) const override {
    int n = 0;
    for (const FakeNode& node : nodes_) n += Has(node, node.slots, node.gpus, need) ? 1 : 0;
    return n;
  }
  int EligibleNodes(const NodeNeed& need) const override {
    int n = 0;
    for (const FakeNode& node : nodes_) n += Has(node, node.free, node.free_gpus, need) ? 1 : 0;
    return n;
  }
  std::optional<NodeRoom> Room(const std::string& worker, const NodeNeed& need) const override {
    for (const FakeNode& node : nodes_) {
      if (node.name != worker || !Has(node, node.slots, node.gpus, need)) continue;
      return NodeRoom{node.free, node.free_gpus};
    }
    return std::nullopt;
  }
  std::vector<NodeOffer> Offers(const NodeNeed& need) const override {
    ++offers_calls;
    std::vector<NodeOffer> out;
    for (const FakeNode& node : nodes_) {
      if (!Has(node, node.free, node.free_gpus, need)) continue;
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
  static bool Has(const FakeNode& node, int slots, int gpus, const NodeNeed& need) {
    if (need.selective() && !SelectorMatches(*need.selector, node.labels)) return false;
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
    return Queue(min, max, [](JobSpec&) {}, nproc, last_call_s);
  }
  // The same, with `edit` applied to the spec (priority, node_selector, ...).
  template <typename Edit>
  JobRecord& Queue(int min, int max, Edit edit, int nproc = 1, int last_call_s = 10) {
    JobSpec spec;
    spec.name = "job";
    spec.nodes = {min, max};
    spec.nproc_per_node = nproc;
    spec.rdzv.last_call_s = last_call_s;
    edit(spec);
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
                         : d.kind == Decision::Kind::kPreempt     ? "preempt"
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


// --- Priorities, node selectors, quotas, preemption ---

auto Priority(int p) {
  return [p](JobSpec& s) { s.priority = p; };
}
auto Select(Labels selector, int priority = 0) {
  return [selector, priority](JobSpec& s) {
    s.node_selector = selector;
    s.priority = priority;
  };
}

// A job running on `workers` (one rank each, with a GPU each when `gpus`), as the
// facade lists it.
RunningJob Running(JobRecord& job, std::vector<std::string> workers, bool preempting = false,
                   bool gpus = false) {
  RunningJob r{&job, {}, 0, preempting, false, {}};
  for (const std::string& w : workers) {
    ++r.ranks_by_worker[w];
    if (gpus) ++r.gpus_by_worker[w];
    ++r.ranks;
  }
  return r;
}

TEST_F(SchedulerTest, HigherPrioritiesAreServedFirstAndFifoWithinOne) {
  FakeCluster cluster(Nodes(1));
  Queue(1, 1, Priority(0));    // job-1
  Queue(1, 1, Priority(5));    // job-2
  Queue(1, 1, Priority(10));   // job-3
  JobRecord& fourth = Queue(1, 1, Priority(5));  // job-4: after job-2, its equal.
  std::vector<std::string> order;
  for (const auto& [key, job] : queue_.jobs()) order.push_back(job->job.id());
  EXPECT_THAT(order, ElementsAre("job-3", "job-2", "job-4", "job-1"));
  EXPECT_EQ(queue_.Position(fourth), 3);
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-3: form"));
}

TEST_F(SchedulerTest, ANodeSelectorPlacesAJobOnlyOnMatchingNodesAndSaysWhenItCannot) {
  FakeCluster cluster({{"a1", 1, 1, 0, 0, {{"pool", "a"}}},
                       {"b1", 1, 1, 0, 0, {{"pool", "b"}}},
                       {"a2", 1, 1, 0, 0, {{"pool", "a"}, {"gpu", "h100"}}}});
  Queue(3, 3, Select({{"pool", "a"}}));  // Only two pool=a nodes.
  Queue(2, 2, Select({{"pool", "a"}}));
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: unschedulable", "job-2: form"));
  EXPECT_EQ(decisions[0].reason,
            "unschedulable: needs 3 node(s) with pool=a with 1 slot(s) each; the cluster has "
            "2 such node(s) alive (skipped until it can hold it)");
  EXPECT_THAT(Workers(decisions[1]), ElementsAre("a1", "a2"));
}

TEST_F(SchedulerTest, AWaitingJobHoldsOnlyJobsThatCouldShareItsNodes) {
  FakeCluster cluster({{"a1", 1, 0, 0, 0, {{"pool", "a"}}},  // Busy.
                       {"b1", 1, 1, 0, 0, {{"pool", "b"}}},
                       {"b2", 1, 1, 0, 0, {{"pool", "b"}}}});
  Queue(1, 1, Select({{"pool", "a"}}));  // Waits for a1.
  Queue(1, 1);                            // Any node, a1 included: waits its turn.
  Queue(1, 1, Select({{"pool", "b"}}));  // Another pool: goes.
  auto decisions = SchedulePass(queue_, cluster, kNow);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: wait", "job-3: form"));
  EXPECT_EQ(decisions[0].reason, "waiting for 1 node(s) with pool=a with 1 free slot(s); 0 available");
  EXPECT_THAT(Workers(decisions[1]), ElementsAre("b1"));
}

TEST_F(SchedulerTest, AnOwnerAtQuotaWaitsWithoutHoldingOthers) {
  FakeCluster cluster(Nodes(4));
  Quotas quotas = *ParseQuotas({"alice=2", "*=3"});
  EXPECT_EQ(quotas.Limit("alice"), 2);
  EXPECT_EQ(quotas.Limit("bob"), 3);
  EXPECT_EQ(quotas.Limit(""), -1) << "the anonymous caller has no quota";
  JobRecord& running = Queue(2, 2);
  running.job.set_owner("alice");
  queue_.Remove(running);  // It runs: not queued.
  JobRecord& more = Queue(1, 1);
  more.job.set_owner("alice");
  JobRecord& bobs = Queue(2, 2);
  bobs.job.set_owner("bob");
  PassContext context{&quotas, [&] { return std::vector<RunningJob>{Running(running, {"n5", "n6"})}; }};
  auto decisions = SchedulePass(queue_, cluster, kNow, context);
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-2: wait", "job-3: form"));
  EXPECT_EQ(decisions[0].reason,
            "waiting for quota: owner alice holds 2 of its 2 slot(s) (--quota); this job needs "
            "at least 1");
}

TEST_F(SchedulerTest, AnElasticJobTakesOnlyTheNodesItsQuotaAllows) {
  FakeCluster cluster(Nodes(4));
  Quotas quotas = *ParseQuotas({"alice=3"});
  JobRecord& job = Queue(1, 4, /*nproc=*/1, /*last_call_s=*/0);
  job.job.set_owner("alice");
  auto decisions = SchedulePass(queue_, cluster, kNow, {&quotas, [] { return std::vector<RunningJob>{}; }});
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-1: form"));
  EXPECT_THAT(Workers(decisions[0]), ElementsAre("n1", "n2", "n3"));
}

TEST_F(SchedulerTest, BadQuotasAreRefusedNamingTheEntry) {
  EXPECT_THAT(ParseQuotas({"alice"}).status().message(), HasSubstr("quota 'alice': expected OWNER=SLOTS"));
  EXPECT_THAT(ParseQuotas({"alice=-1"}).status().message(), HasSubstr("quota 'alice=-1'"));
  EXPECT_THAT(ParseQuotas({"alice=1", "alice=2"}).status().message(),
              HasSubstr("quota for 'alice' given twice"));
}

// A running job that checkpoints periodically (so it may be preempted at one).
auto Checkpointing(int priority, PreemptionPolicy policy = PreemptionPolicy::kAtCheckpoint) {
  return [priority, policy](JobSpec& s) {
    s.priority = priority;
    s.preemption = policy;
    s.checkpoint.dir = "/ckpt";
    s.checkpoint.every_epochs = 1;
  };
}

TEST_F(SchedulerTest, AHigherPriorityJobPreemptsTheLowestPriorityRunningJobsItNeeds) {
  FakeCluster cluster(Nodes(3, 1, 0));  // All busy.
  JobRecord& low = Queue(1, 1, Checkpointing(0));
  JobRecord& mid = Queue(1, 1, Checkpointing(1));
  JobRecord& lowest_kill = Queue(1, 1, Checkpointing(-1, PreemptionPolicy::kKill));
  for (JobRecord* r : {&low, &mid, &lowest_kill}) queue_.Remove(*r);
  low.job.set_start_ms(1);
  JobRecord& high = Queue(2, 2, Priority(5));
  std::vector<RunningJob> running = {Running(low, {"n1"}), Running(mid, {"n2"}),
                                     Running(lowest_kill, {"n3"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  ASSERT_THAT(Kinds(decisions), ElementsAre("job-4: wait", "job-3: preempt", "job-1: preempt"));
  EXPECT_EQ(decisions[0].reason,
            "waiting for 2 node(s) with 1 free slot(s); 0 available; preempting job-3 "
            "(priority -1, at once), job-1 (priority 0, at its next checkpoint)");
  EXPECT_EQ(decisions[1].for_job, &high);
  EXPECT_EQ(decisions[1].reason, "job job-4 (priority 5) needs its nodes");

  // Once marked, their nodes count as coming free: nothing more is taken, and the
  // marks are listed again (still needed).
  running[0].preempting = running[2].preempting = true;
  decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait", "job-3: preempt", "job-1: preempt"));

  // Once they stopped (attempts ended, trainers going), their nodes are counted for
  // the waiting job, and nobody else is taken.
  running[0].ended = running[2].ended = true;
  decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait"));
  EXPECT_EQ(decisions[0].reason, "waiting for 2 node(s) with 1 free slot(s); 0 available");
}

// Within one priority the job that would lose the least training goes first, before
// start order: a job that moves at its checkpoint (nothing lost), then a kill job
// checkpointed 1 minute ago, then one checkpointed 10 minutes ago.
TEST_F(SchedulerTest, AmongEqualPrioritiesTheLeastTrainingLostIsTakenFirst) {
  FakeCluster cluster(Nodes(3, 1, 0));  // All busy.
  JobRecord& ten = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kKill));
  JobRecord& one = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kKill));
  JobRecord& none = Queue(1, 1, Checkpointing(0));
  for (JobRecord* r : {&ten, &one, &none}) queue_.Remove(*r);
  // Start order alone would take `ten` first (the most recently started).
  ten.job.set_start_ms(3000);
  one.job.set_start_ms(2000);
  none.job.set_start_ms(1000);
  Queue(1, 1, Priority(5));
  std::vector<RunningJob> running = {Running(ten, {"n1"}), Running(one, {"n2"}),
                                     Running(none, {"n3"})};
  running[0].loss = absl::Minutes(10);
  running[1].loss = absl::Minutes(1);
  running[2].loss = absl::ZeroDuration();
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait", "job-3: preempt"));
  running.pop_back();  // Without the one that loses nothing: the 1-minute loss.
  decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait", "job-2: preempt"));
  running[1].loss = absl::Minutes(20);  // Now the other one's is the smaller.
  decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait", "job-1: preempt"));
}

TEST_F(SchedulerTest, AJobMarkedForAHigherPriorityIsNotTakenForALowerOne) {
  FakeCluster cluster(Nodes(2, 1, 0));
  JobRecord& marked = Queue(1, 1, Checkpointing(5));  // Marked for a priority-10 job.
  JobRecord& low = Queue(1, 1, Checkpointing(0));
  queue_.Remove(marked);
  queue_.Remove(low);
  Queue(1, 1, Priority(3));
  std::vector<RunningJob> running = {Running(marked, {"n1"}, /*preempting=*/true),
                                     Running(low, {"n2"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-3: wait", "job-2: preempt"))
      << "priority 3 takes the priority-0 job, not the priority-5 one marked already";
}

TEST_F(SchedulerTest, AVictimThatAddsNoRoomIsNotPreempted) {
  // Needs 2 free slots on one node. n1: 1 free, 1 held by `low`; n2: all 2 held by `mid`.
  FakeCluster cluster({{"n1", 2, 1}, {"n2", 2, 0}});
  JobRecord& low = Queue(1, 1, Checkpointing(0));
  JobRecord& mid = Queue(1, 1, Checkpointing(1));
  queue_.Remove(low);
  queue_.Remove(mid);
  Queue(2, 2, Priority(5), /*nproc=*/2);  // job-3: two nodes of 2 ranks.
  std::vector<RunningJob> running = {Running(low, {"n1"}), Running(mid, {"n2", "n2"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-3: wait", "job-1: preempt", "job-2: preempt"));

  // With one node needed, n2 alone (mid) would do, but low is the lowest priority:
  // taken first, it frees n1 and mid is left alone.
  JobRecord& one = Queue(1, 1, Priority(6), /*nproc=*/2);  // job-4, ahead of job-3.
  decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  ASSERT_GE(decisions.size(), 2u);
  EXPECT_EQ(decisions[0].job, &one);
  EXPECT_THAT(Kinds(decisions), ::testing::Contains("job-1: preempt"));
  EXPECT_THAT(Kinds(decisions), ::testing::Not(::testing::Contains("job-2: preempt")));
}

TEST_F(SchedulerTest, AVictimTakenFirstButNotNeededInTheEndIsLeftAlone) {
  // One node of 2 ranks needed. n1: `low` holds 1 slot, a job that is never
  // preempted the other; n2: `mid` holds both.
  FakeCluster cluster({{"n1", 2, 0}, {"n2", 2, 0}});
  JobRecord& low = Queue(1, 1, Checkpointing(0));
  JobRecord& never = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kNever));
  JobRecord& mid = Queue(1, 1, Checkpointing(1));
  for (JobRecord* r : {&low, &never, &mid}) queue_.Remove(*r);
  Queue(1, 1, Priority(5), /*nproc=*/2);
  std::vector<RunningJob> running = {Running(low, {"n1"}), Running(never, {"n1"}),
                                     Running(mid, {"n2", "n2"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait", "job-3: preempt"))
      << "low frees half a node: not worth its work";
}

TEST_F(SchedulerTest, ACpuJobFreesNoGpusForAGpuJob) {
  // 2 slots, 1 GPU: the GPU is held by a priority-9 NCCL job, the other slot by a
  // priority-0 gloo job. Preempting the gloo job frees no GPU.
  FakeCluster cluster({{"g1", 2, 0, 1, 0}});
  JobRecord& gpu_job = Queue(1, 1, Checkpointing(9));
  JobRecord& cpu_job = Queue(1, 1, Checkpointing(0));
  queue_.Remove(gpu_job);
  queue_.Remove(cpu_job);
  Queue(1, 1, [](JobSpec& s) {
    s.priority = 5;
    s.backend = Backend::kNccl;
  });
  std::vector<RunningJob> running = {Running(gpu_job, {"g1"}, false, /*gpus=*/true),
                                     Running(cpu_job, {"g1"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-3: wait"));
}

TEST_F(SchedulerTest, AJobWithAutoRanksAndAQuotaDoesNotPreempt) {
  FakeCluster cluster(Nodes(2, 1, 0));
  Quotas quotas = *ParseQuotas({"alice=8"});
  JobRecord& low = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kKill));
  queue_.Remove(low);
  JobRecord& high = Queue(1, 1, Priority(5), /*nproc=*/0);
  high.job.set_owner("alice");
  std::vector<RunningJob> running = {Running(low, {"n1"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {&quotas, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-2: wait"))
      << "its size is known only once nodes are offered: no preemption its quota may undo";
}

TEST_F(SchedulerTest, NoJobIsPreemptedThatWouldLoseWorkOrSaysNeverOrForNothing) {
  FakeCluster cluster(Nodes(3, 1, 0));
  JobRecord& no_checkpoints = Queue(1, 1, Priority(0));  // at_checkpoint, but none taken.
  JobRecord& never = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kNever));
  JobRecord& equal = Queue(1, 1, Checkpointing(5));
  for (JobRecord* r : {&no_checkpoints, &never, &equal}) queue_.Remove(*r);
  Queue(1, 1, Priority(5));
  std::vector<RunningJob> running = {Running(no_checkpoints, {"n1"}), Running(never, {"n2"}),
                                     Running(equal, {"n3"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-4: wait"));

  // One preemptible job, but the waiting job needs two nodes: nothing is preempted.
  JobRecord& killable = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kKill));
  queue_.Remove(killable);
  Queue(2, 2, Priority(9));  // job-6, ahead of job-4.
  running = {Running(killable, {"n1"}), Running(never, {"n2"}), Running(no_checkpoints, {"n3"})};
  decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-6: wait"));
}

TEST_F(SchedulerTest, PreemptionLooksOnlyAtNodesTheWaitingJobMayUse) {
  FakeCluster cluster({{"a1", 1, 0, 0, 0, {{"pool", "a"}}}, {"b1", 1, 0, 0, 0, {{"pool", "b"}}}});
  JobRecord& on_b = Queue(1, 1, Checkpointing(0, PreemptionPolicy::kKill));
  JobRecord& on_a = Queue(1, 1, Checkpointing(1, PreemptionPolicy::kKill));
  queue_.Remove(on_b);
  queue_.Remove(on_a);
  Queue(1, 1, Select({{"pool", "a"}}, /*priority=*/5));
  std::vector<RunningJob> running = {Running(on_b, {"b1"}), Running(on_a, {"a1"})};
  auto decisions = SchedulePass(queue_, cluster, kNow, {nullptr, [&] { return running; }});
  EXPECT_THAT(Kinds(decisions), ElementsAre("job-3: wait", "job-2: preempt"))
      << "the lower-priority job on pool b frees nothing the job may use";
}

}  // namespace
}  // namespace ddp
