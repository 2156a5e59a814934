// Node maintenance through the Coordinator (FakeClock, real SQLite): a cordoned worker
// takes no new ranks but keeps its trainers; a drain moves each job after its next
// checkpoint (or at once, or never, per its policy) without spending a restart; an
// operator's choice survives coordinator and agent restarts; only a lost worker can be
// removed, and a removed one stays removed.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPlain[] =
    "name: plain\nnodes: \"1\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
    "train: {batch_size: 4}\n";
constexpr char kCheckpointed[] =
    "name: ckpt\nnodes: \"1\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
    "train: {batch_size: 4}\ncheckpoint: {dir: /tmp/ddp-maintenance-test, every_steps: 5}\n";

class MaintenanceTest : public testing::CoordinatorHarness {
 protected:
  void SetUp() override {
    CoordinatorHarness::SetUp();
    Register("w1");
    Register("w2");
    Heartbeat("w1");  // Free ports: a job can form there.
    Heartbeat("w2");
  }

  absl::StatusOr<v1::Worker> Set(const std::string& worker, v1::WorkerMaintenance m,
                                 v1::DrainPolicy policy = v1::DRAIN_AT_CHECKPOINT,
                                 const std::string& by = "") {
    Caller caller;
    caller.name = by;
    return coordinator_->SetMaintenance(worker, m, policy, caller);
  }

  v1::ListWorkersResponse Workers() {
    auto resp = coordinator_->ListWorkers(v1::ListWorkersRequest());
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::ListWorkersResponse();
  }

  const v1::Worker* Find(const v1::ListWorkersResponse& resp, const std::string& name) {
    for (const v1::Worker& w : resp.workers()) {
      if (w.name() == name) return &w;
    }
    return nullptr;
  }

  // The worker running the current attempt of `id` (one node).
  std::string Host(const std::string& id) {
    const v1::Job job = Get(id);
    if (job.attempts().empty() || job.attempts().rbegin()->ranks().empty()) return "";
    return job.attempts().rbegin()->ranks(0).worker();
  }

  // Starts the job's current attempt on its worker: task handed out, pid reported.
  void StartOn(const std::string& id) {
    const std::string host = Host(id);
    ASSERT_FALSE(host.empty()) << "job " << id << " was not placed";
    const std::vector<v1::Task> tasks = Heartbeat(host);
    const v1::Task* task = TaskOf(id, tasks);
    ASSERT_NE(task, nullptr);
    std::vector<v1::TaskStatus> running;
    for (const v1::Task& t : tasks) running.push_back(Running(t));
    Heartbeat(host, running);
    ASSERT_EQ(Get(id).state(), v1::RUNNING);
  }

  // `worker` reports rank 0 of `id`'s attempt `attempt` gone (stopped, as told).
  void StoppedOn(const std::string& worker, const std::string& id, int attempt) {
    v1::Task task;
    task.set_job_id(id);
    task.set_attempt(attempt);
    task.add_ranks(0);
    Heartbeat(worker, {Running(task, /*exited=*/true)});
  }

  // Rank 0 of `id`'s current attempt, on `worker`, reports an event of `type`.
  void Report(const std::string& worker, const std::string& id, const std::string& type,
              int64_t global_step, int64_t epoch = 0) {
    const v1::Job job = Get(id);
    v1::ReportEventsRequest req;
    req.set_worker(worker);
    req.set_incarnation(worker + "-inc");
    v1::ReportedEvent* e = req.add_events();
    e->set_job_id(id);
    e->set_attempt(job.attempts_size());
    e->set_rank(0);
    v1::TrainerEvent* ev = e->mutable_event();
    ev->set_rank(0);
    if (type == "checkpoint") {
      ev->mutable_checkpoint()->set_global_step(global_step);
      ev->mutable_checkpoint()->set_epoch(epoch);
    } else {
      ASSERT_EQ(type, "step") << "a type this helper does not build";
      ev->mutable_step()->set_global_step(global_step);
      ev->mutable_step()->set_epoch(epoch);
    }
    ASSERT_TRUE(coordinator_->ReportEvents(req).ok());
  }
};

TEST_F(MaintenanceTest, ACordonedWorkerTakesNoNewRanksButKeepsItsTrainers) {
  const std::string first = Submit(kPlain);
  StartOn(first);
  const std::string busy = Host(first);
  const std::string other = busy == "w1" ? "w2" : "w1";

  auto view = Set(busy, v1::WORKER_CORDONED, v1::DRAIN_AT_CHECKPOINT, "alice");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->maintenance(), v1::WORKER_CORDONED);
  EXPECT_EQ(view->maintenance_by(), "alice");
  EXPECT_EQ(view->maintenance_since_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_THAT(view->jobs(), ::testing::ElementsAre(first)) << "its job keeps running";
  EXPECT_EQ(Get(first).state(), v1::RUNNING);
  ASSERT_NE(TaskOf(first, Heartbeat(busy)), nullptr) << "still in its desired state";

  const std::string second = Submit(kPlain);
  EXPECT_EQ(Host(second), other) << "the cordoned worker takes no new ranks";
  // A two-node job cannot be placed while only one node is schedulable.
  const std::string wide = Submit(
      "name: wide\nnodes: \"2\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
      "train: {batch_size: 4}\n");
  EXPECT_TRUE(Get(wide).unschedulable()) << Get(wide).reason();
  EXPECT_EQ(Workers().summary().cordoned(), 1);

  view = Set(busy, v1::WORKER_SCHEDULABLE);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->maintenance(), v1::WORKER_SCHEDULABLE);
  EXPECT_EQ(view->maintenance_by(), "");
  EXPECT_FALSE(Get(wide).unschedulable()) << "both nodes count again: it waits for slots";
  EXPECT_EQ(Workers().summary().cordoned(), 0);
}

TEST_F(MaintenanceTest, ACordonSurvivesCoordinatorAndAgentRestarts) {
  ASSERT_TRUE(Set("w1", v1::WORKER_CORDONED, v1::DRAIN_AT_CHECKPOINT, "alice").ok());
  ASSERT_TRUE(Set("w2", v1::WORKER_DRAINING, v1::DRAIN_NOW, "bob").ok());
  const int64_t since = absl::ToUnixMillis(clock_.Now());
  clock_.Advance(absl::Seconds(5));
  Open();  // A coordinator restart on the same state.

  v1::ListWorkersResponse resp = Workers();
  const v1::Worker* w1 = Find(resp, "w1");
  const v1::Worker* w2 = Find(resp, "w2");
  ASSERT_NE(w1, nullptr);
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w1->maintenance(), v1::WORKER_CORDONED);
  EXPECT_EQ(w1->maintenance_by(), "alice");
  EXPECT_EQ(w1->maintenance_since_ms(), since);
  EXPECT_EQ(w2->maintenance(), v1::WORKER_DRAINING);
  EXPECT_EQ(w2->drain_policy(), v1::DRAIN_NOW);
  EXPECT_EQ(resp.summary().cordoned(), 2);

  // w1's agent restarts (a new incarnation): still cordoned. w2 is uncordoned and
  // checks in: the job goes there.
  v1::RegisterRequest again;
  again.set_worker("w1");
  again.set_incarnation("w1-second");
  again.set_address("10.0.0.1");
  again.set_slots(1);
  ASSERT_TRUE(coordinator_->Register(again).ok());
  ASSERT_TRUE(Set("w2", v1::WORKER_SCHEDULABLE).ok());
  Heartbeat("w2");
  const std::string id = Submit(kPlain);
  EXPECT_EQ(Host(id), "w2");
  EXPECT_EQ(Find(Workers(), "w1")->maintenance(), v1::WORKER_CORDONED);
}

TEST_F(MaintenanceTest, ADrainMovesAJobAfterItsNextCheckpointWithoutSpendingARestart) {
  const std::string id = Submit(kCheckpointed);
  StartOn(id);
  const std::string from = Host(id);
  const std::string to = from == "w1" ? "w2" : "w1";
  Heartbeat(to);

  auto view = Set(from, v1::WORKER_DRAINING);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->drain_policy(), v1::DRAIN_AT_CHECKPOINT);
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << "it waits for a checkpoint";
  Report(from, id, "step", 3);
  EXPECT_EQ(Get(id).state(), v1::RUNNING) << "a step is no checkpoint";
  // The checkpoint a job takes as it finishes (its position: past the last epoch) is
  // no reason to move: nothing would be left to train.
  Report(from, id, "checkpoint", 9, /*epoch=*/1);
  EXPECT_EQ(Get(id).attempts_size(), 1) << "the final checkpoint moved the job";

  Report(from, id, "checkpoint", 5);
  const v1::Job moving = Get(id);
  EXPECT_EQ(moving.attempts_size(), 1) << "never two live processes of one rank";
  EXPECT_THAT(moving.reason(), HasSubstr("waiting for 1 rank(s) of attempt 1 to exit"));
  EXPECT_EQ(TaskOf(id, Heartbeat(from)), nullptr) << "its trainers are told to stop";
  StoppedOn(from, id, 1);
  const v1::Job moved = Get(id);
  ASSERT_EQ(moved.attempts_size(), 2) << moved.reason();
  EXPECT_EQ(moved.attempts(0).state(), v1::FAILED);
  EXPECT_TRUE(moved.attempts(0).preempted()) << "an outcome is a field, not a reason prefix";
  EXPECT_FALSE(moved.attempts(1).preempted());
  EXPECT_THAT(moved.attempts(0).reason(),
              StartsWith(absl::StrCat("preempted: worker ", from, " is draining")));
  EXPECT_THAT(moved.attempts(0).reason(), HasSubstr("global step 5"));
  EXPECT_EQ(moved.restarts(), 0) << "not counted against max_restarts (0 here)";
  EXPECT_EQ(Host(id), to);
  const v1::Worker* drained = Find(Workers(), from);
  ASSERT_NE(drained, nullptr);
  EXPECT_TRUE(drained->jobs().empty()) << "drained";

  // The moved attempt runs to the end and the job succeeds.
  StartOn(id);
  const std::vector<v1::Task> tasks = Heartbeat(to);
  ASSERT_NE(TaskOf(id, tasks), nullptr);
  Heartbeat(to, {Running(*TaskOf(id, tasks), /*exited=*/true)});
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_EQ(Get(id).restarts(), 0);
}

TEST_F(MaintenanceTest, DrainPoliciesNowAndWaitAndAJobWithoutCheckpoints) {
  // Without periodic checkpoints there is no "next checkpoint": the job stays.
  const std::string plain = Submit(kPlain);
  StartOn(plain);
  const std::string host = Host(plain);
  ASSERT_TRUE(Set(host, v1::WORKER_DRAINING).ok());
  Report(host, plain, "checkpoint", 10);  // (Its final checkpoint, say.)
  EXPECT_EQ(Get(plain).state(), v1::RUNNING);
  EXPECT_EQ(Get(plain).attempts_size(), 1);

  // --wait: not even after a checkpoint.
  ASSERT_TRUE(Set(host, v1::WORKER_DRAINING, v1::DRAIN_WAIT).ok());
  Report(host, plain, "checkpoint", 20);
  EXPECT_EQ(Get(plain).attempts_size(), 1);

  // --now: at once, however it checkpoints.
  auto view = Set(host, v1::WORKER_DRAINING, v1::DRAIN_NOW);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->jobs().empty());
  StoppedOn(host, plain, 1);  // Moved once its trainer is gone.
  const v1::Job moved = Get(plain);
  ASSERT_EQ(moved.attempts_size(), 2);
  EXPECT_THAT(moved.attempts(0).reason(), HasSubstr("is draining now"));
  EXPECT_EQ(moved.restarts(), 0);
  EXPECT_NE(Host(plain), host);
}

TEST_F(MaintenanceTest, OnlyALostWorkerIsRemovedAndItStaysRemoved) {
  EXPECT_THAT(coordinator_->RemoveWorker("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no worker named 'nope'")));
  EXPECT_THAT(Set("nope", v1::WORKER_CORDONED), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(coordinator_->RemoveWorker("w1"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("only a lost worker can be removed")));

  // w1 falls silent and is declared lost; w2 keeps beating.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(options_.heartbeat_interval);
    Heartbeat("w2");
    coordinator_->Tick();
  }
  const v1::Worker* lost = Find(Workers(), "w1");
  ASSERT_NE(lost, nullptr);
  ASSERT_FALSE(lost->alive());
  ASSERT_TRUE(coordinator_->RemoveWorker("w1").ok());
  v1::ListWorkersResponse resp = Workers();
  EXPECT_EQ(Find(resp, "w1"), nullptr);
  EXPECT_EQ(resp.summary().workers(), 1);
  EXPECT_EQ(resp.summary().lost(), 0);

  Open();  // Still gone after a restart.
  EXPECT_EQ(Find(Workers(), "w1"), nullptr);
  v1::HeartbeatRequest hb;
  hb.set_worker("w1");
  hb.set_incarnation("w1-inc");
  EXPECT_THAT(coordinator_->Heartbeat(hb),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register first")));
  Register("w1");  // Its agent comes back: a new worker.
  EXPECT_NE(Find(Workers(), "w1"), nullptr);
}

}  // namespace
}  // namespace ddp
