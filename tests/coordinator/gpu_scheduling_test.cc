// GPUs as resources: workers register their GPUs (as a fake NVML inventory would
// list them), the coordinator gives each rank of a GPU job a GPU of its own by UUID,
// never the same one to two jobs, and frees it once the rank's trainer is gone.
// Driven through the Coordinator facade with a FakeClock and a real SQLite store.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

std::string GpuJob(const std::string& nproc, const std::string& backend = "nccl") {
  return absl::StrCat("name: ", backend, "\nnodes: \"1\"\nnproc_per_node: ", nproc,
                      "\nbackend: ", backend,
                      "\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n");
}

class GpuSchedulingTest : public testing::CoordinatorHarness {
 protected:
  // Who holds each GPU of `worker`, as ListWorkers shows it: uuid -> "job/rank".
  std::map<std::string, std::string> Holders(const std::string& worker) {
    std::map<std::string, std::string> out;
    auto resp = coordinator_->ListWorkers({});
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return out;
    for (const v1::Worker& w : resp->workers()) {
      if (w.name() != worker) continue;
      for (const v1::GpuDevice& g : w.gpu_devices()) {
        out[g.uuid()] = g.job_id().empty() ? "" : absl::StrCat(g.job_id(), "/", g.rank());
      }
    }
    return out;
  }
};

TEST_F(GpuSchedulingTest, TwoJobsOnAFourGpuNodeGetDisjointGpus) {
  Register("g1", 4);
  const std::string a = Submit(GpuJob("2"));
  std::vector<v1::Task> tasks = Heartbeat("g1");
  ASSERT_NE(TaskOf(a, tasks), nullptr);
  const v1::Task held = *TaskOf(a, tasks);
  const v1::Task* ta = &held;
  ASSERT_EQ(ta->gpu_uuids_size(), 2);
  Heartbeat("g1", {Running(*ta)});
  EXPECT_EQ(Get(a).state(), v1::RUNNING);

  const std::string b = Submit(GpuJob("2"));
  tasks = Heartbeat("g1", {Running(*ta)});
  const v1::Task* tb = TaskOf(b, tasks);
  ASSERT_NE(tb, nullptr) << "2 of 4 GPUs are free: job b fits";
  ASSERT_EQ(tb->gpu_uuids_size(), 2);
  std::set<std::string> all(ta->gpu_uuids().begin(), ta->gpu_uuids().end());
  all.insert(tb->gpu_uuids().begin(), tb->gpu_uuids().end());
  EXPECT_EQ(all.size(), 4u) << "no GPU is given twice";
  // The rank table records each rank's GPU, as the heartbeat hands it out.
  const v1::Job job_b = Get(b);
  ASSERT_EQ(job_b.attempts(0).ranks_size(), 2);
  EXPECT_EQ(job_b.attempts(0).ranks(1).gpu_uuid(), tb->gpu_uuids(1));

  // The node is full: a third GPU job waits, saying for what.
  const std::string c = Submit(GpuJob("1"));
  Heartbeat("g1", {Running(*ta), Running(*tb)});
  EXPECT_EQ(Get(c).state(), v1::PENDING);
  EXPECT_THAT(Get(c).reason(), HasSubstr("1 free GPU(s)"));

  std::map<std::string, std::string> holders = Holders("g1");
  ASSERT_EQ(holders.size(), 4u);
  EXPECT_EQ(holders[ta->gpu_uuids(0)], a + "/0");
  EXPECT_EQ(holders[ta->gpu_uuids(1)], a + "/1");
  EXPECT_EQ(holders[tb->gpu_uuids(0)], b + "/0");
  EXPECT_EQ(holders[tb->gpu_uuids(1)], b + "/1");
}

// GPU metrics where each is known: the worker's NVML sample (sent with its heartbeat)
// shows on its GPUs in ListWorkers and on the rank holding each GPU, and reaches the
// Prometheus collection; the trainer's allocator memory (its step events) shows in the
// rank's latest metrics.
TEST_F(GpuSchedulingTest, GpuUseFromHeartbeatsAndStepsShowsOnTheRanksHoldingThem) {
  Register("g1", 2);
  const std::string a = Submit(GpuJob("1"));
  std::vector<v1::Task> tasks = Heartbeat("g1");
  ASSERT_NE(TaskOf(a, tasks), nullptr);
  const v1::Task task = *TaskOf(a, tasks);
  ASSERT_EQ(task.gpu_uuids_size(), 1);
  const std::string held = task.gpu_uuids(0);
  EXPECT_FALSE(Get(a).attempts(0).ranks(0).has_gpu_utilization_pct()) << "no sample yet";

  v1::HeartbeatRequest req;
  req.set_worker("g1");
  req.set_incarnation(Incarnation("g1"));
  *req.add_tasks() = Running(task);
  for (const auto& [uuid, holder] : Holders("g1")) {
    v1::GpuUsage* u = req.add_gpu_usage();
    u->set_uuid(uuid);
    u->set_utilization_percent(uuid == held ? 87 : 0);
    u->set_memory_used_bytes(uuid == held ? (int64_t{3} << 30) : 0);
  }
  ASSERT_TRUE(coordinator_->Heartbeat(req).ok());

  const v1::RankAssignment rank = Get(a).attempts(0).ranks(0);
  EXPECT_DOUBLE_EQ(rank.gpu_utilization_pct(), 87);
  EXPECT_DOUBLE_EQ(rank.gpu_memory_used_mib(), 3072);
  auto workers = coordinator_->ListWorkers({});
  ASSERT_TRUE(workers.ok()) << workers.status();
  int sampled = 0;
  for (const v1::GpuDevice& g : workers->workers(0).gpu_devices()) {
    ASSERT_TRUE(g.has_utilization_percent()) << g.uuid();
    sampled += 1;
    EXPECT_EQ(g.utilization_percent(), g.uuid() == held ? 87 : 0);
    EXPECT_EQ(g.memory_used_bytes(), g.uuid() == held ? (int64_t{3} << 30) : 0);
  }
  EXPECT_EQ(sampled, 2);

  v1::TrainerEvent step;
  step.mutable_step()->set_loss(0.5);
  step.mutable_step()->set_gpu_memory_allocated_mib(100);
  step.mutable_step()->set_gpu_memory_reserved_mib(128);
  step.mutable_step()->set_gpu_memory_peak_mib(150);
  ASSERT_TRUE(ReportEvents("g1", a, 1, 0, {step}).ok());
  const v1::Job job = Get(a);
  ASSERT_EQ(job.metrics_size(), 1);
  EXPECT_DOUBLE_EQ(job.metrics(0).gpu_memory_allocated_mib(), 100);
  EXPECT_DOUBLE_EQ(job.metrics(0).gpu_memory_reserved_mib(), 128);
  EXPECT_DOUBLE_EQ(job.metrics(0).gpu_memory_peak_mib(), 150);

  const CoordinatorMetrics m = coordinator_->Metrics();
  ASSERT_EQ(m.ranks.size(), 1u);
  ASSERT_TRUE(m.ranks[0].gpu_utilization_pct.has_value());
  EXPECT_DOUBLE_EQ(*m.ranks[0].gpu_utilization_pct, 87);
  EXPECT_DOUBLE_EQ(m.ranks[0].metrics.gpu_memory_peak_mib(), 150);

  // A CPU job's rank on the same node shows no GPU use.
  const std::string cpu = Submit(GpuJob("1", "gloo"));
  tasks = Heartbeat("g1", {Running(task)});
  ASSERT_NE(TaskOf(cpu, tasks), nullptr);
  Heartbeat("g1", {Running(task), Running(*TaskOf(cpu, tasks))});
  EXPECT_FALSE(Get(cpu).attempts(0).ranks(0).has_gpu_utilization_pct());
}

TEST_F(GpuSchedulingTest, AutoRunsOneRankPerFreeGpu) {
  Register("g1", 4);
  const std::string a = Submit(GpuJob("1"));
  std::vector<v1::Task> tasks = Heartbeat("g1");
  ASSERT_NE(TaskOf(a, tasks), nullptr);
  const v1::Task held = *TaskOf(a, tasks);
  Heartbeat("g1", {Running(held)});

  const std::string b = Submit(GpuJob("auto", "auto"));
  tasks = Heartbeat("g1", {Running(held)});
  const v1::Task* tb = TaskOf(b, tasks);
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->ranks_size(), 3) << "4 GPUs, 1 held by job a";
  EXPECT_EQ(tb->world_size(), 3);
  ASSERT_EQ(tb->gpu_uuids_size(), 3);
  for (const std::string& uuid : tb->gpu_uuids()) EXPECT_NE(uuid, held.gpu_uuids(0));
}

TEST_F(GpuSchedulingTest, ALostWorkerFreesItsGpus) {
  Register("g1", 4);
  const std::string a = Submit(GpuJob("4"));
  std::vector<v1::Task> tasks = Heartbeat("g1");
  ASSERT_NE(TaskOf(a, tasks), nullptr);
  const v1::Task ta = *TaskOf(a, tasks);
  Heartbeat("g1", {Running(ta)});
  EXPECT_EQ(Get(a).state(), v1::RUNNING);
  EXPECT_EQ(Holders("g1")[ta.gpu_uuids(3)], a + "/3");

  clock_.Advance(CoordinatorOptions().heartbeat_timeout + absl::Seconds(1));
  coordinator_->Tick();  // g1 is lost, and job a (no restarts) with it.
  EXPECT_EQ(Get(a).state(), v1::FAILED);
  for (const auto& [uuid, holder] : Holders("g1")) EXPECT_EQ(holder, "") << uuid;

  // Back, with its trainers gone: a new job gets all four GPUs.
  Heartbeat("g1");
  const std::string b = Submit(GpuJob("4"));
  const std::vector<v1::Task> now = Heartbeat("g1");
  const v1::Task* tb = TaskOf(b, now);
  ASSERT_NE(tb, nullptr);
  EXPECT_THAT(std::vector<std::string>(tb->gpu_uuids().begin(), tb->gpu_uuids().end()),
              UnorderedElementsAre("GPU-g1-0", "GPU-g1-1", "GPU-g1-2", "GPU-g1-3"));
}

TEST_F(GpuSchedulingTest, AGpuIsHeldUntilItsTrainerIsGoneNotOnlyUntilTheJobEnds) {
  Register("g1", 2);
  const std::string a = Submit(GpuJob("2"));
  const std::vector<v1::Task> first = Heartbeat("g1");
  ASSERT_NE(TaskOf(a, first), nullptr);
  const v1::Task ta = *TaskOf(a, first);
  Heartbeat("g1", {Running(ta)});
  ASSERT_TRUE(coordinator_->Cancel(a).ok());
  // Cancelled, but its trainers still run (they are being stopped): nothing new fits.
  const std::string b = Submit(GpuJob("1"));
  EXPECT_EQ(TaskOf(b, Heartbeat("g1", {Running(ta)})), nullptr);  // (Compared at once.)
  EXPECT_EQ(Holders("g1")[ta.gpu_uuids(0)], a + "/0");
  // Once they exited, the GPU is b's.
  const std::vector<v1::Task> later = Heartbeat("g1", {Running(ta, /*exited=*/true)});
  const v1::Task* tb = TaskOf(b, later);
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->gpu_uuids_size(), 1);
}

TEST_F(GpuSchedulingTest, CpuJobsGetNoGpuAndNcclJobsNeedGpus) {
  Register("z1", 0, /*slots=*/2);
  const std::string nccl = Submit(GpuJob("1"));
  Heartbeat("z1");
  const v1::Job waiting = Get(nccl);
  EXPECT_EQ(waiting.state(), v1::PENDING);
  EXPECT_TRUE(waiting.unschedulable()) << "no node of this cluster has a GPU";
  EXPECT_THAT(waiting.reason(), HasSubstr("GPU"));

  // On a GPU node, a gloo job takes slots but no GPU; auto on a CPU node likewise.
  Register("g1", 2, /*slots=*/3);
  const std::string gloo = Submit(GpuJob("1", "gloo"));
  std::vector<v1::Task> tasks = Heartbeat("g1");
  // The nccl job (first in the queue) now fits on g1 and takes a GPU.
  const v1::Task* tn = TaskOf(nccl, tasks);
  ASSERT_NE(tn, nullptr);
  EXPECT_EQ(tn->gpu_uuids_size(), 1);
  const v1::Task* tg = TaskOf(gloo, tasks);
  ASSERT_NE(tg, nullptr) << "g1 comes first by name and has 2 free slots";
  EXPECT_THAT(tg->gpu_uuids(), IsEmpty());
}

// train.device cuda over Gloo: ranks that share a node's GPU (Gloo's CUDA path), so
// they need a node with a free GPU but not one each. A node without one would start
// them only to see each exit 3 (no GPU here) and the job retried elsewhere; a rank
// without a GPU of the job's is hidden from the node's GPUs (CUDA_VISIBLE_DEVICES="").
TEST_F(GpuSchedulingTest, ACudaJobOverGlooWaitsForANodeWithAGpuAndItsRanksShareIt) {
  Register("a1", 0, /*slots=*/2);  // First by name: the node a slot-only need would take.
  const std::string shared_job =
      "nodes: \"1\"\nnproc_per_node: 2\nbackend: gloo\nmodel: {mlp: {}}\n"
      "data: {synthetic: {}}\ntrain: {batch_size: 4, device: cuda}\n";
  const std::string job = Submit("name: shared\n" + shared_job);
  EXPECT_EQ(TaskOf(job, Heartbeat("a1")), nullptr) << "a1 has no GPU";
  const v1::Job waiting = Get(job);
  EXPECT_EQ(waiting.state(), v1::PENDING);
  EXPECT_TRUE(waiting.unschedulable()) << "no node of this cluster has a GPU";
  EXPECT_THAT(waiting.reason(), HasSubstr("a GPU to share (train.device cuda)"));

  Register("g1", 1, /*slots=*/4);  // One GPU for two ranks.
  Heartbeat("a1");
  const std::vector<v1::Task> tasks = Heartbeat("g1");
  const v1::Task* t = TaskOf(job, tasks);
  ASSERT_NE(t, nullptr) << Get(job).reason();
  ASSERT_EQ(t->ranks_size(), 2);
  ASSERT_EQ(t->gpu_uuids_size(), 2) << "each rank is given the GPU it shares";
  EXPECT_EQ(t->gpu_uuids(0), t->gpu_uuids(1));
  const v1::Task held = *t;
  Heartbeat("g1", {Running(held)});
  EXPECT_EQ(Holders("g1")[held.gpu_uuids(0)], job + "/0");

  // A CPU job still goes to the node without a GPU; and the GPU is this job's: a second
  // such job waits although g1 has free slots.
  const std::string cpu = Submit(GpuJob("1", "gloo"));
  EXPECT_NE(TaskOf(cpu, Heartbeat("a1")), nullptr);
  const std::string second = Submit("name: second\n" + shared_job);
  EXPECT_EQ(TaskOf(second, Heartbeat("g1", {Running(held)})), nullptr);
  EXPECT_EQ(Get(second).state(), v1::PENDING);
  EXPECT_THAT(Get(second).reason(), HasSubstr("on a node with a GPU"));
}

TEST_F(GpuSchedulingTest, GpuAssignmentsSurviveACoordinatorRestart) {
  Register("g1", 2);
  const std::string a = Submit(GpuJob("1"));
  const std::vector<v1::Task> first = Heartbeat("g1");
  ASSERT_NE(TaskOf(a, first), nullptr);
  const v1::Task ta = *TaskOf(a, first);
  Heartbeat("g1", {Running(ta)});
  Open();  // A restarted coordinator: the same state directory.
  EXPECT_EQ(Get(a).attempts(0).ranks(0).gpu_uuid(), ta.gpu_uuids(0));
  std::map<std::string, std::string> holders = Holders("g1");
  ASSERT_EQ(holders.size(), 2u) << "the worker's GPUs were stored";
  EXPECT_EQ(holders[ta.gpu_uuids(0)], a + "/0");
  // The worker checks back in, and a second job gets the other GPU.
  const std::string b = Submit(GpuJob("1"));
  const std::vector<v1::Task> back = Heartbeat("g1", {Running(ta)});
  const v1::Task* tb = TaskOf(b, back);
  ASSERT_NE(tb, nullptr);
  ASSERT_EQ(tb->gpu_uuids_size(), 1);
  EXPECT_NE(tb->gpu_uuids(0), ta.gpu_uuids(0));
}

TEST_F(GpuSchedulingTest, RegistrationRefusesGpusWithoutUuidsOrTwice) {
  v1::RegisterRequest req;
  req.set_worker("g9");
  req.set_incarnation("i");
  req.set_address("10.0.0.9");
  req.set_slots(2);
  req.set_gpus(2);
  for (int g = 0; g < 2; ++g) {
    v1::GpuDevice* d = req.add_gpu_devices();
    d->set_index(g);
    d->set_uuid("GPU-same");
  }
  auto st = coordinator_->Register(req);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("UUID of its own"));
  req.set_gpus(3);
  st = coordinator_->Register(req);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("gpus: 3 but 2 gpu_devices"));
}

}  // namespace
}  // namespace ddp
