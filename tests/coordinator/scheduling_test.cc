// Scheduling policy through the Coordinator (FakeClock, in-memory store): the queue
// serves priorities in order as slots free; node selectors against worker labels
// (kept across restarts); who may raise a priority; preemption at a checkpoint, at
// once, or not at all; per-owner quotas; a worker that leaves. docs/scheduling.md.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/utf8.h"
#include "tests/common/status_matchers.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A one-node job named `name` with `extra` top-level YAML (priority, node_selector...).
std::string Job(const std::string& name, const std::string& extra = "") {
  return absl::StrCat("name: ", name,
                      "\nnodes: \"1\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                      "train: {batch_size: 4}\n",
                      extra);
}
constexpr char kCheckpoints[] =
    "checkpoint: {dir: /tmp/ddp-scheduling-test, every_steps: 5}\n";

class SchedulingTest : public testing::CoordinatorHarness {
 protected:
  // The worker of the current attempt of `id` ("" when not placed).
  std::string Host(const std::string& id) {
    const v1::Job job = Get(id);
    if (job.attempts().empty() || job.attempts().rbegin()->ranks().empty()) return "";
    if (job.state() != v1::RENDEZVOUS && job.state() != v1::RUNNING) return "";
    return job.attempts().rbegin()->ranks(0).worker();
  }

  // Hands out the current attempt of `id` and reports its trainers running.
  void Start(const std::string& id) {
    const std::string host = Host(id);
    ASSERT_FALSE(host.empty()) << "job " << id << " was not placed: " << Get(id).reason();
    const std::vector<v1::Task> tasks = Heartbeat(host);
    const v1::Task* task = TaskOf(id, tasks);
    ASSERT_NE(task, nullptr);
    tasks_[id] = *task;
    Heartbeat(host, {Running(*task)});
    ASSERT_EQ(Get(id).state(), v1::RUNNING);
  }

  // Its trainers exit with `code` (0: the job succeeds).
  void Exit(const std::string& id, const std::string& host, int code = 0) {
    Heartbeat(host, {Report(tasks_.at(id), code)});
  }

  void Checkpoint(const std::string& id, const std::string& host, int64_t step) {
    v1::TrainerEvent e;
    e.mutable_checkpoint()->set_global_step(step);
    e.mutable_checkpoint()->set_epoch(0);
    ASSERT_TRUE(ReportEvents(host, id, Get(id).attempts_size(), 0, {e}).ok());
  }

  std::map<std::string, v1::Task> tasks_;  // The last task handed out, by job.
};

TEST_F(SchedulingTest, TheQueueServesHigherPrioritiesFirstAsSlotsFree) {
  Register("w1");
  Heartbeat("w1");
  const std::string running = Submit(Job("first"));
  Start(running);
  const std::string low = Submit(Job("low"));
  clock_.Advance(absl::Seconds(1));
  const std::string mid = Submit(Job("mid", "priority: 5\n"));
  clock_.Advance(absl::Seconds(1));
  const std::string high = Submit(Job("high", "priority: 10\n"));
  const std::string mid2 = Submit(Job("mid2", "priority: 5\n"));
  EXPECT_EQ(Get(high).queue_position(), 1);
  EXPECT_EQ(Get(mid).queue_position(), 2);
  EXPECT_EQ(Get(mid2).queue_position(), 3) << "FIFO within a priority";
  EXPECT_EQ(Get(low).queue_position(), 4);
  EXPECT_EQ(Get(high).priority(), 10);

  // Each time the node frees, the head of the queue takes it.
  std::vector<std::string> order;
  std::string previous = running;
  for (int i = 0; i < 4; ++i) {
    Exit(previous, "w1");
    ASSERT_EQ(Get(previous).state(), v1::SUCCEEDED);
    Heartbeat("w1");  // The exit is seen; the slot is free.
    std::string next;
    for (const std::string& id : {low, mid, high, mid2}) {
      if (Get(id).state() == v1::RENDEZVOUS) next = id;
    }
    ASSERT_FALSE(next.empty()) << "nothing formed after " << previous;
    order.push_back(Get(next).name());
    Start(next);
    clock_.Advance(absl::Seconds(10));
    previous = next;
  }
  EXPECT_THAT(order, ElementsAre("high", "mid", "mid2", "low"));
}

TEST_F(SchedulingTest, ANodeSelectorMatchesWorkerLabelsThatSurviveARestart) {
  Register("a1", 0, 0, "", {{"pool", "team-a"}});
  Register("b1", 0, 0, "", {{"pool", "team-b"}, {"gpu", "h100"}});
  Heartbeat("a1");
  Heartbeat("b1");
  const std::string on_b = Submit(Job("on-b", "node_selector: {pool: team-b}\n"));
  EXPECT_EQ(Host(on_b), "b1");
  const std::string two_a =
      Submit(absl::StrReplaceAll(Job("two-a", "node_selector: {pool: team-a}\n"),
                                 {{"nodes: \"1\"", "nodes: \"2\""}}));
  EXPECT_TRUE(Get(two_a).unschedulable());
  EXPECT_THAT(Get(two_a).reason(),
              HasSubstr("needs 2 node(s) with pool=team-a with 1 slot(s) each; the cluster has "
                        "1 such node(s) alive"));
  EXPECT_THAT(Get(on_b).node_selector(), ::testing::Contains(::testing::Pair("pool", "team-b")));

  Open();  // A coordinator restart: labels come from the store until workers re-register.
  auto workers = coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers_size(), 2);
  EXPECT_EQ(workers->workers(1).name(), "b1");
  EXPECT_EQ(workers->workers(1).labels().at("gpu"), "h100");
  EXPECT_EQ(workers->workers(0).labels().at("pool"), "team-a");
}

TEST_F(SchedulingTest, BadLabelsAreRefusedAtRegistration) {
  v1::RegisterRequest req;
  req.set_worker("w1");
  req.set_incarnation("i");
  req.set_address("10.0.0.1");
  req.set_slots(1);
  (*req.mutable_labels())["pool"] = "team a";  // A space.
  EXPECT_THAT(coordinator_->Register(req),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels: label pool='team a'")));
}

TEST_F(SchedulingTest, OnlyAnAdminMaySubmitAboveTheUserPriorityBound) {
  limits_.max_user_priority = 3;
  Open();
  EXPECT_TRUE(Submit(Job("ok", "priority: 3\n"), Caller{"bob", false}).ok());
  EXPECT_TRUE(Submit(Job("low", "priority: -7\n"), Caller{"bob", false}).ok());
  EXPECT_THAT(Submit(Job("urgent", "priority: 4\n"), Caller{"bob", false}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("priority: 4 is above this coordinator's --max-user-priority (3)")));
  EXPECT_TRUE(Submit(Job("urgent", "priority: 4\n"), Caller{"root", true}).ok());
}

TEST_F(SchedulingTest, AHigherPriorityJobPreemptsALowerOneAtItsNextCheckpoint) {
  Register("w1");
  Heartbeat("w1");
  const std::string low = Submit(Job("low", kCheckpoints));
  Start(low);
  const std::string high = Submit(Job("high", "priority: 5\n"));
  EXPECT_EQ(Get(low).state(), v1::RUNNING) << "not before its checkpoint";
  EXPECT_THAT(Get(high).reason(),
              HasSubstr(absl::StrCat("preempting ", low, " (priority 0, at its next checkpoint)")));

  Checkpoint(low, "w1", 5);
  v1::Job preempted = Get(low);
  EXPECT_EQ(preempted.state(), v1::PENDING);
  EXPECT_EQ(preempted.preemptions(), 1);
  EXPECT_EQ(preempted.restarts(), 0) << "a preemption spends no restart";
  EXPECT_TRUE(preempted.attempts(0).preempted());
  EXPECT_THAT(preempted.attempts(0).reason(), HasSubstr(absl::StrCat("job ", high, " (higher priority)")));
  EXPECT_EQ(Host(high), "") << "waits until the preempted trainers are gone";

  Exit(low, "w1", 143);  // Its trainers stop (SIGTERM).
  Heartbeat("w1");
  ASSERT_EQ(Host(high), "w1");
  Start(high);
  Exit(high, "w1");
  Heartbeat("w1");
  EXPECT_EQ(Host(low), "w1") << "the preempted job comes back once the node is free";
  EXPECT_EQ(Get(low).attempts_size(), 2);
}

TEST_F(SchedulingTest, AJobThatMayBeKilledIsPreemptedAtOnceAndOneWithoutCheckpointsNever) {
  Register("w1");
  Register("w2");
  Heartbeat("w1");
  Heartbeat("w2");
  const std::string killable = Submit(Job("killable", "preemption: kill\n"));
  Start(killable);
  const std::string keeps = Submit(Job("keeps"));  // No checkpoints: never loses work.
  Start(keeps);
  const std::string high = Submit(
      absl::StrReplaceAll(Job("high", "priority: 9\n"), {{"nodes: \"1\"", "nodes: \"2\""}}));
  EXPECT_EQ(Get(killable).state(), v1::RUNNING)
      << "freeing one node of the two it needs would be for nothing";
  EXPECT_EQ(Get(high).state(), v1::PENDING);

  const std::string one = Submit(Job("one", "priority: 9\n"));
  EXPECT_EQ(Get(killable).state(), v1::RUNNING) << "the 2-node job ahead holds the queue";
  ASSERT_TRUE(coordinator_->Cancel(high).ok());
  EXPECT_EQ(Get(killable).state(), v1::PENDING) << "preempted at once for the 1-node job";
  EXPECT_EQ(Get(keeps).state(), v1::RUNNING);
  EXPECT_EQ(Get(killable).preemptions(), 1);
  const std::string host = Get(killable).attempts(0).ranks(0).worker();
  Exit(killable, host, 143);
  Heartbeat(host);
  EXPECT_EQ(Host(one), host);
}

// Among equal priorities, a preemption takes the job that loses the least training:
// the one checkpointed a minute ago, although it started first (the older rule, the
// most recently started first, took the other); the loss is shown, and the newest
// checkpoint survives a coordinator restart (decision 188).
TEST_F(SchedulingTest, AmongEqualPrioritiesTheJobWhoseCheckpointIsNewestIsPreempted) {
  Register("w1");
  Register("w2");
  Heartbeat("w1");  // With free ports for the rendezvous stores.
  Heartbeat("w2");
  auto beat = [&](absl::Duration d) {  // Time passes; both workers stay alive.
    for (absl::Duration left = d; left > absl::ZeroDuration(); left -= absl::Seconds(1)) {
      clock_.Advance(absl::Seconds(1));
      Heartbeat("w1");
      Heartbeat("w2");
    }
  };
  const std::string recent = Submit(Job("recent", absl::StrCat("preemption: kill\n", kCheckpoints)));
  Start(recent);
  beat(absl::Seconds(2));
  const std::string stale = Submit(Job("stale", absl::StrCat("preemption: kill\n", kCheckpoints)));
  Start(stale);
  EXPECT_EQ(Get(stale).last_checkpoint_attempt(), 0) << "none reported yet";
  EXPECT_EQ(Get(stale).preemption_loss_ms(), 0) << "it has just started";
  beat(absl::Seconds(2));
  Checkpoint(stale, Host(stale), 40);  // Long ago.
  beat(absl::Minutes(9));
  Checkpoint(recent, Host(recent), 5000);  // A minute ago.
  beat(absl::Minutes(1));

  const v1::Job r = Get(recent), s = Get(stale);
  EXPECT_EQ(r.last_checkpoint_attempt(), 1);
  EXPECT_EQ(r.last_checkpoint_step(), 5000);
  EXPECT_EQ(s.last_checkpoint_step(), 40);
  ASSERT_TRUE(r.has_preemption_loss_ms());
  ASSERT_TRUE(s.has_preemption_loss_ms());
  EXPECT_EQ(r.preemption_loss_ms(), absl::ToInt64Milliseconds(absl::Minutes(1)));
  EXPECT_EQ(s.preemption_loss_ms(), absl::ToInt64Milliseconds(absl::Minutes(10)));
  EXPECT_LT(r.start_ms(), s.start_ms()) << "the recent one started first";

  // Survives a restart (the job rows keep the newest checkpoint).
  Open();
  for (const std::string& id : {recent, stale}) Heartbeat(Host(id), {Running(tasks_.at(id))});
  EXPECT_EQ(Get(recent).last_checkpoint_step(), 5000);
  EXPECT_EQ(Get(recent).last_checkpoint_ms(), r.last_checkpoint_ms());

  const std::string high = Submit(Job("high", "priority: 9\n"));
  EXPECT_EQ(Get(recent).state(), v1::PENDING) << "preempted: it loses 1 minute, not 10";
  EXPECT_EQ(Get(recent).preemptions(), 1);
  EXPECT_EQ(Get(stale).state(), v1::RUNNING);
  EXPECT_EQ(Get(stale).preemptions(), 0);
  EXPECT_FALSE(Get(recent).has_preemption_loss_ms()) << "not running: nothing to lose";
  EXPECT_TRUE(Get(recent).attempts(0).preempted());
  const std::string freed = r.attempts(0).ranks(0).worker();
  Exit(recent, freed, 143);
  Heartbeat(freed);
  EXPECT_EQ(Host(high), freed) << "on the node it freed";
}

// A `kill` job with preemption_notice_s is asked for a checkpoint before it is taken:
// it moves after the checkpoint it answers with, or, when none comes, once the notice
// runs out (decision 189).
TEST_F(SchedulingTest, AKillJobWithANoticeMovesAfterTheCheckpointItIsAskedFor) {
  Register("w1");
  Heartbeat("w1");
  const std::string asked = Submit(Job(
      "asked", absl::StrCat("preemption: kill\npreemption_notice_s: 30\n", kCheckpoints)));
  Start(asked);
  const std::string high = Submit(Job("high", "priority: 9\n"));
  EXPECT_EQ(Get(asked).state(), v1::RUNNING) << "asked for a checkpoint first";
  EXPECT_EQ(Get(asked).preemptions(), 0);
  const std::vector<v1::Task> tasks = Heartbeat("w1", {Running(tasks_.at(asked))});
  const v1::Task* task = TaskOf(asked, tasks);
  ASSERT_NE(task, nullptr);
  EXPECT_GT(task->notice_seq(), 0);
  EXPECT_THAT(task->notice(), HasSubstr(absl::StrCat("job ", high, " (higher priority)")));
  EXPECT_EQ(task->notice_deadline_ms(), absl::ToUnixMillis(clock_.Now() + absl::Seconds(30)));
  clock_.Advance(absl::Seconds(2));
  Heartbeat("w1", {Running(tasks_.at(asked))});
  Checkpoint(asked, "w1", 321);
  const v1::Job moved = Get(asked);
  EXPECT_EQ(moved.state(), v1::PENDING);
  EXPECT_EQ(moved.preemptions(), 1);
  EXPECT_THAT(moved.attempts(0).reason(), HasSubstr("moved after the checkpoint at step 321"));
}

TEST_F(SchedulingTest, AKillJobThatDoesNotAnswerItsNoticeMovesWhenTheNoticeRunsOut) {
  Register("w1");
  Heartbeat("w1");
  const std::string silent = Submit(Job(
      "silent", absl::StrCat("preemption: kill\npreemption_notice_s: 10\n", kCheckpoints)));
  Start(silent);
  Submit(Job("high", "priority: 9\n"));
  for (int s = 0; s < 9; ++s) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat("w1", {Running(tasks_.at(silent))});
    coordinator_->Tick();
  }
  EXPECT_EQ(Get(silent).state(), v1::RUNNING) << "9 s of its 10";
  clock_.Advance(absl::Seconds(1));
  Heartbeat("w1", {Running(tasks_.at(silent))});
  coordinator_->Tick();
  const v1::Job moved = Get(silent);
  EXPECT_EQ(moved.state(), v1::PENDING);
  EXPECT_EQ(moved.preemptions(), 1);
  EXPECT_THAT(moved.attempts(0).reason(),
              HasSubstr("no checkpoint within its preemption_notice_s (10s), so from its last one"));
}

TEST_F(SchedulingTest, AnOwnerPastItsQuotaWaitsWithTheReasonShown) {
  limits_.quotas = *ParseQuotas({"alice=1"});
  Open();
  for (const char* w : {"w1", "w2", "w3"}) {
    Register(w);
    Heartbeat(w);
  }
  auto first = Submit(Job("a1"), Caller{"alice", false});
  auto second = Submit(Job("a2"), Caller{"alice", false});
  auto bobs = Submit(Job("b1"), Caller{"bob", false});
  ASSERT_TRUE(first.ok() && second.ok() && bobs.ok());
  Start(first->id());
  EXPECT_EQ(Get(second->id()).state(), v1::PENDING);
  EXPECT_EQ(Get(second->id()).reason(),
            "waiting for quota: owner alice holds 1 of its 1 slot(s) (--quota); this job needs "
            "at least 1");
  EXPECT_FALSE(Host(bobs->id()).empty()) << "another owner's job is not held up";
  EXPECT_EQ(Host(second->id()), "") << "a node is free, but not alice's to take";
  // A quota raised while the coordinator runs (SIGHUP re-reads --quota-file): the
  // job that waited starts at once.
  coordinator_->SetQuotas(*ParseQuotas({"alice=2"}));
  EXPECT_FALSE(Host(second->id()).empty());
}

TEST_F(SchedulingTest, AJobWaitingForQuotaStartsWhenTheOwnersJobEnds) {
  limits_.quotas = *ParseQuotas({"*=1"});
  Open();
  Register("w1");
  Register("w2");
  Heartbeat("w1");
  Heartbeat("w2");
  auto first = Submit(Job("a1"), Caller{"alice", false});
  auto second = Submit(Job("a2"), Caller{"alice", false});
  ASSERT_TRUE(first.ok() && second.ok());
  Start(first->id());
  EXPECT_THAT(Get(second->id()).reason(), HasSubstr("waiting for quota: owner alice"));
  const std::string host = Host(first->id());
  Exit(first->id(), host);
  Heartbeat(host);
  EXPECT_EQ(Host(second->id()), host);
}

TEST_F(SchedulingTest, AWorkerThatLeavesIsForgottenAtOnceAndItsJobRestartsElsewhere) {
  Register("w1");
  Register("w2");
  Heartbeat("w1");
  Heartbeat("w2");
  const std::string id = Submit(Job("moves", "max_restarts: 1\n"));
  Start(id);
  const std::string host = Host(id);
  const std::string other = host == "w1" ? "w2" : "w1";

  v1::LeaveRequest leave;
  leave.set_worker(host);
  leave.set_incarnation("stale");
  EXPECT_THAT(coordinator_->Leave(leave), StatusIs(absl::StatusCode::kFailedPrecondition));
  leave.set_incarnation(Incarnation(host));
  // A reason cut to 256 bytes stays UTF-8 ("é" is 2 bytes, across the cut).
  leave.set_reason("received SIGTERM " + std::string(238, 'x') + "\xc3\xa9 and more");
  ASSERT_TRUE(coordinator_->Leave(leave).ok());
  EXPECT_TRUE(coordinator_->Leave(leave).ok()) << "idempotent";

  auto workers = coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).name(), other);
  const v1::Job job = Get(id);
  EXPECT_THAT(job.attempts(0).reason(), HasSubstr(absl::StrCat("worker ", host, " left (received SIGTERM")));
  EXPECT_TRUE(IsValidUtf8(job.attempts(0).reason())) << "cut before the 2-byte character";
  EXPECT_THAT(job.attempts(0).reason(), ::testing::EndsWith("xxx)"));
  EXPECT_EQ(Host(id), other) << "restarted on the worker that stayed";
}

TEST_F(SchedulingTest, AWorkerThatSaysItIsLeavingTakesNoRetryAndCostsOneRestart) {
  Register("w1");
  Register("w2");
  Register("w3");
  for (const char* w : {"w1", "w2", "w3"}) Heartbeat(w);
  const std::string id = Submit(Job("moves", "max_restarts: 1\n"));
  Start(id);
  const std::string host = Host(id);

  // What a --leave-on-exit agent sends at SIGTERM: the leaving heartbeat (trainers
  // still running), then the trainers' exits, then Leave.
  v1::HeartbeatRequest leaving;
  leaving.set_worker(host);
  leaving.set_incarnation(Incarnation(host));
  leaving.set_leaving("received SIGTERM");
  *leaving.add_tasks() = Running(tasks_.at(id));
  ASSERT_TRUE(coordinator_->Heartbeat(leaving).ok());
  v1::Job job = Get(id);
  EXPECT_THAT(job.attempts(0).reason(), HasSubstr(absl::StrCat("worker ", host, " is leaving (received SIGTERM)")));
  EXPECT_EQ(Get(id).attempts_size(), 1) << "no retry while its trainers still run";

  *leaving.mutable_tasks(0) = Report(tasks_.at(id), 143);  // Its trainers stopped.
  ASSERT_TRUE(coordinator_->Heartbeat(leaving).ok());
  const std::string retry_host = Host(id);
  EXPECT_FALSE(retry_host.empty());
  EXPECT_NE(retry_host, host) << "the retry is not placed on the leaving worker";
  v1::LeaveRequest leave;
  leave.set_worker(host);
  leave.set_incarnation(Incarnation(host));
  ASSERT_TRUE(coordinator_->Leave(leave).ok());
  job = Get(id);
  EXPECT_EQ(job.restarts(), 1) << "one restart for one node leaving";
  EXPECT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(Host(id), retry_host);
  EXPECT_NE(job.state(), v1::FAILED);
}

}  // namespace
}  // namespace ddp
