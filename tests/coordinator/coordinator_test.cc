// The coordinator's state machine, driven directly with a FakeClock: registration,
// heartbeats and their expiry, rendezvous with last call, rank assignment, the FIFO
// queue, restarts and recovery. Real SQLite store, no sockets, no sleeps.
#include "coordinator/core/coordinator.h"

#include <sqlite3.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/contract/exit_codes.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/store/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/coordinator/coordinator_harness.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string JobYaml(const std::string& extra = "", const std::string& nodes = "2") {
  return absl::StrCat("name: demo\nnodes: \"", nodes,
                      "\"\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                      "train: {batch_size: 4}\n",
                      extra);
}

class CountingListener final : public EventHub::Listener {
 public:
  void Notify() override { ++notified; }
  std::atomic<int> notified{0};
};

// The shared harness (coordinator_harness.h), with the timing these tests were
// written for (the defaults are faster): 500ms RPC, 1s interval, 10s heartbeat
// timeout, so the start timeout is 10s. Workers heartbeat right after registering,
// as agents do.
class CoordinatorTest : public testing::TimedCoordinatorHarness {
 protected:
  std::vector<std::string> LogTexts(const std::string& job_id) {
    std::vector<std::string> out;
    for (const auto& l : hub_->Logs(job_id, 0, std::nullopt, 100)) {
      out.push_back(absl::StrCat(l.seq(), " ", l.text()));
    }
    return out;
  }

  // Brings a 2-node job to RUNNING on w1 and w2 (or `a` and `b`); returns their tasks.
  std::pair<v1::Task, v1::Task> StartOnTwoWorkers(const std::string& id,
                                                  const std::string& a = "w1",
                                                  const std::string& b = "w2") {
    auto t1 = TaskOf(id, Heartbeat(a));
    auto t2 = TaskOf(id, Heartbeat(b));
    Heartbeat(a, {Report(t1)});
    Heartbeat(b, {Report(t2)});
    EXPECT_EQ(Get(id).state(), v1::RUNNING);
    return {t1, t2};
  }

  // The task of job `id` among `tasks` (a copy; an empty task, and a failure, if none).
  static v1::Task TaskOf(const std::string& id, const std::vector<v1::Task>& tasks) {
    if (const v1::Task* t = CoordinatorHarness::TaskOf(id, tasks)) return *t;
    ADD_FAILURE() << "no task of " << id;
    return v1::Task();
  }
};

TEST_F(CoordinatorTest, TimeoutsMustBeOrdered) {
  CoordinatorOptions o;
  o.heartbeat_interval = absl::Seconds(20);
  EXPECT_THAT(ValidateTimeouts(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("--heartbeat-interval (20s) must be "
                                                      "shorter than --heartbeat-timeout (2.5s)")));
  o = CoordinatorOptions();
  o.rpc_deadline = absl::Seconds(2);
  EXPECT_THAT(ValidateTimeouts(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("--rpc-deadline")));
  EXPECT_TRUE(ValidateTimeouts(CoordinatorOptions()).ok());
}

TEST_F(CoordinatorTest, SubmitRejectsBadSpecsAndStoresNothing) {
  v1::SubmitJobRequest req;
  req.set_spec_yaml("name: bad\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 0}\n");
  req.set_source_name("bad.yaml");
  EXPECT_THAT(coordinator_->Submit(req),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.yaml:4: train.batch_size: must be > 0")));
  // Rendezvous timeout must exceed the heartbeat timeout (10s).
  req.set_spec_yaml(JobYaml("rdzv: {timeout_s: 5}\n"));
  EXPECT_THAT(coordinator_->Submit(req),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rdzv.timeout_s")));
  EXPECT_TRUE(coordinator_->ListJobs(10).empty());
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->jobs.empty());
}

TEST_F(CoordinatorTest, ASubmissionTheStoreCannotWriteFailsAndLeavesNothingBehind) {
  Register("w1");
  Register("w2");
  memory().FailWrites(absl::UnavailableError("disk full"));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(JobYaml());
  EXPECT_THAT(coordinator_->Submit(req),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("could not store the job (disk full); nothing was queued")));
  EXPECT_TRUE(coordinator_->ListJobs(10).empty());
  EXPECT_TRUE(Heartbeat("w1").empty()) << "nothing was scheduled";
  memory().FailWrites(absl::OkStatus());
  const std::string id = Submit(JobYaml());
  EXPECT_EQ(coordinator_->ListJobs(10).size(), 1u);
  EXPECT_EQ(TaskOf(id, Heartbeat("w1")).job_id(), id);
}

// The same on SQLite itself: a trigger refuses every insert into `jobs`.
class CoordinatorOnSqliteTest : public CoordinatorTest {
 protected:
  CoordinatorOnSqliteTest() { sqlite_ = true; }
};

TEST_F(CoordinatorOnSqliteTest, ASubmissionTheDatabaseCannotWriteFailsAndLeavesNothingBehind) {
  Register("w1");
  Register("w2");
  // Every insert into `jobs` fails, as on a full disk.
  RunSql("CREATE TRIGGER refuse BEFORE INSERT ON jobs BEGIN"
         " SELECT RAISE(FAIL, 'database or disk is full'); END;");
  v1::SubmitJobRequest req;
  req.set_spec_yaml(JobYaml());
  EXPECT_THAT(coordinator_->Submit(req),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("could not store the job (sqlite: step: database or disk is "
                                 "full); nothing was queued")));
  EXPECT_TRUE(coordinator_->ListJobs(10).empty());
  EXPECT_TRUE(Heartbeat("w1").empty()) << "nothing was scheduled";

  RunSql("DROP TRIGGER refuse;");
  const std::string id = Submit(JobYaml());
  EXPECT_EQ(coordinator_->ListJobs(10).size(), 1u);
  EXPECT_EQ(TaskOf(id, Heartbeat("w1")).job_id(), id);
}

TEST_F(CoordinatorTest, ALiveRdzvIdCannotBeReused) {
  Submit(JobYaml("rdzv_id: shared\n"));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(JobYaml("rdzv_id: shared\n"));
  EXPECT_THAT(coordinator_->Submit(req),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rdzv_id 'shared' is in use")));
}

TEST_F(CoordinatorTest, UnknownJobIsNotFound) {
  EXPECT_THAT(coordinator_->GetJob("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job 'nope' not found")));
  EXPECT_THAT(coordinator_->Cancel("nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CoordinatorTest, StaleOrUnknownWorkersAreRejected) {
  v1::HeartbeatRequest req;
  req.set_worker("ghost");
  req.set_incarnation("x");
  EXPECT_THAT(coordinator_->Heartbeat(req),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("register first")));
  Register("w1", 1, "old");
  Register("w1", 1, "new");  // The agent restarted.
  req.set_worker("w1");
  req.set_incarnation("old");
  EXPECT_THAT(coordinator_->Heartbeat(req),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale worker")));
  v1::ReportEventsRequest events;
  events.set_worker("w1");
  events.set_incarnation("old");
  EXPECT_THAT(coordinator_->ReportEvents(events),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(CoordinatorTest, AnEventBatchResentAfterItWasAppliedIsStoredOnceAcrossARestart) {
  Register("w1");
  const std::string id = Submit(JobYaml("", "1"));
  auto report = [&](int64_t batch_seq, const std::string& text) {
    v1::ReportEventsRequest req;
    req.set_worker("w1");
    req.set_incarnation(incarnations_["w1"]);
    req.set_batch_seq(batch_seq);
    v1::ReportedEvent* e = req.add_events();
    e->set_job_id(id);
    e->set_attempt(1);
    e->mutable_log()->set_stream("stdout");
    e->mutable_log()->set_text(text);
    return coordinator_->ReportEvents(req);
  };
  auto lines = [&] {
    std::vector<std::string> out;
    for (const auto& l : hub_->Logs(id, 0, std::nullopt, 100)) out.push_back(l.text());
    return out;
  };
  EXPECT_TRUE(report(1, "first").ok());
  EXPECT_TRUE(report(1, "first").ok()) << "a repeat is answered OK";
  EXPECT_TRUE(report(2, "second").ok());
  EXPECT_TRUE(report(2, "second").ok());
  EXPECT_THAT(lines(), ElementsAre("first", "second"));
  // The coordinator crashes after storing batch 2 but before its reply arrived: the
  // agent re-sends it to the restarted coordinator, which knows the number too.
  ASSERT_TRUE(coordinator_->Flush().ok());
  Open();  // Recovers.
  EXPECT_TRUE(report(2, "second").ok());
  EXPECT_TRUE(report(3, "third").ok());
  EXPECT_THAT(lines(), ElementsAre("first", "second", "third"));
  // A restarted agent numbers its batches from 1 again.
  Register("w1", 1, "w1-inc2");
  EXPECT_TRUE(report(1, "after restart").ok());
  EXPECT_THAT(lines(), ElementsAre("first", "second", "third", "after restart"));
  // And that incarnation's numbers are what a restart remembers from now on.
  Open();  // Recovers.
  EXPECT_TRUE(report(1, "after restart").ok());
  EXPECT_THAT(lines(), ElementsAre("first", "second", "third", "after restart"));
}

TEST_F(CoordinatorTest, FinishedJobsKeepNoFeedInMemoryYetShowTheirMetricsAndLogs) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml());
  auto [t1, t2] = StartOnTwoWorkers(id);
  v1::TrainerEvent step;
  step.mutable_step()->set_global_step(7);
  ASSERT_TRUE(ReportEvents("w1", id, /*attempt=*/1, /*rank=*/0, {step}).ok());
  ASSERT_TRUE(ReportLines("w1", id, {"hello"}).ok());
  EXPECT_EQ(hub_->stats().feeds, 1u) << "a live job's feed";
  Heartbeat("w1", {Report(t1, 0)});
  Heartbeat("w2", {Report(t2, 0)});
  ASSERT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_EQ(hub_->stats().feeds, 0u) << "finished and unwatched";

  v1::Job job = Get(id);
  ASSERT_EQ(job.metrics_size(), 1) << "reloaded from SQLite";
  EXPECT_EQ(job.metrics(0).global_step(), 7);
  EXPECT_EQ(coordinator_->ListJobs(10).size(), 1u);
  EXPECT_THAT(LogTexts(id), ElementsAre("1 hello"));
  EXPECT_EQ(hub_->stats().feeds, 0u) << "reads keep nothing";
}

TEST_F(CoordinatorTest, EventsOfUnknownJobsAreDroppedAndWatchingOneLeavesNothing) {
  Register("w1");
  EXPECT_TRUE(ReportLines("w1", "ghost", {"boo"}).ok());
  EXPECT_EQ(hub_->stats().feeds, 0u);
  auto stored = store_->ReadLogs("ghost", 0, std::nullopt, 100);
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->empty()) << "nothing stored that retention would never delete";
  auto listener = std::make_shared<CountingListener>();
  hub_->Subscribe("ghost", listener);
  EXPECT_EQ(hub_->stats().watched_jobs, 1u);
  hub_->Unsubscribe("ghost", listener.get());
  EXPECT_EQ(hub_->stats().watched_jobs, 0u);
  EXPECT_EQ(hub_->stats().feeds, 0u);
}

TEST_F(CoordinatorTest, AFinishedJobsFeedIsFreedWhenItsLastListenerLeaves) {
  Register("w1");
  const std::string id = Submit(JobYaml("", "1"));
  const v1::Task task = TaskOf(id, Heartbeat("w1"));
  Heartbeat("w1", {Report(task)});
  auto listener = std::make_shared<CountingListener>();
  hub_->Subscribe(id, listener);
  ASSERT_TRUE(ReportLines("w1", id, {"a", "b"}).ok());
  Heartbeat("w1", {Report(task, 0)});
  ASSERT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_GT(listener->notified, 0);
  EXPECT_EQ(hub_->stats().feeds, 1u) << "still watched";
  hub_->Unsubscribe(id, listener.get());
  EXPECT_EQ(hub_->stats().feeds, 0u);
  // A late line (a stopping trainer's last words) continues the numbering from SQLite.
  ASSERT_TRUE(ReportLines("w1", id, {"c"}).ok());
  EXPECT_EQ(hub_->stats().feeds, 0u);
  EXPECT_THAT(LogTexts(id), ElementsAre("1 a", "2 b", "3 c"));
}

TEST_F(CoordinatorTest, RanksFollowWorkerNameOrderAndLocalRanksAreContiguous) {
  Register("w3", 2);
  Register("w1", 2);
  Register("w2", 2);
  const std::string id = Submit(JobYaml("nproc_per_node: 2\n", "3"));
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::RENDEZVOUS);
  ASSERT_EQ(job.attempts_size(), 1);
  const v1::Attempt& a = job.attempts(0);
  EXPECT_EQ(a.world_size(), 6);
  std::vector<std::string> workers;
  for (const auto& r : a.ranks()) {
    workers.push_back(r.worker());
    EXPECT_EQ(r.rank(), r.group_rank() * 2 + r.local_rank());
  }
  EXPECT_THAT(workers, ElementsAre("w1", "w1", "w2", "w2", "w3", "w3"));
  EXPECT_EQ(a.master_addr(), "10.0.0.1");  // Node 0 = w1 hosts the store.
  // The worker that hosts rank 0 is handed ranks 0 and 1 with the store's port.
  auto tasks = Heartbeat("w1");
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_THAT(tasks[0].ranks(), ElementsAre(0, 1));
  EXPECT_EQ(tasks[0].world_size(), 6);
  EXPECT_EQ(tasks[0].master_port(), a.master_port());
}

TEST_F(CoordinatorTest, JobRunsWhenEveryRankIsUpAndSucceedsWhenAllExitZero) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml());
  auto [t1, t2] = StartOnTwoWorkers(id);
  Heartbeat("w1", {Report(t1, 0)});
  EXPECT_EQ(Get(id).state(), v1::RUNNING);  // Rank 1 still runs.
  Heartbeat("w2", {Report(t2, 0)});
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.reason(), "all 2 ranks exited 0");
  EXPECT_TRUE(Heartbeat("w1").empty()) << "nothing left to run";
}

TEST_F(CoordinatorTest, SecondJobWaitsInTheQueueUntilTheFirstEnds) {
  Register("w1");
  Register("w2");
  const std::string first = Submit(JobYaml());
  const std::string second = Submit(JobYaml());
  EXPECT_EQ(Get(first).state(), v1::RENDEZVOUS);
  v1::Job waiting = Get(second);
  EXPECT_EQ(waiting.state(), v1::PENDING);
  EXPECT_EQ(waiting.queue_position(), 1);
  EXPECT_THAT(waiting.reason(), HasSubstr("waiting for 2 node(s)"));
  auto [t1, t2] = StartOnTwoWorkers(first);
  EXPECT_EQ(Get(second).state(), v1::PENDING);
  // The first job's trainers exit: their slots free up and the second forms.
  Heartbeat("w1", {Report(t1, 0)});
  Heartbeat("w2", {Report(t2, 0)});
  EXPECT_EQ(Get(first).state(), v1::SUCCEEDED);
  EXPECT_EQ(Get(second).state(), v1::RENDEZVOUS);
}

TEST_F(CoordinatorTest, ElasticRendezvousWaitsOutTheLastCallForMoreNodes) {
  Register("w1");
  const std::string id = Submit(JobYaml("rdzv: {last_call_s: 5}\n", "1:3"));
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::RENDEZVOUS);
  EXPECT_TRUE(job.attempts().empty()) << "gathering: no attempt yet";
  EXPECT_THAT(job.reason(), HasSubstr("1 of up to 3 nodes"));
  clock_.Advance(absl::Seconds(2));
  Register("w2");
  Heartbeat("w2");
  coordinator_->Tick();
  EXPECT_TRUE(Get(id).attempts().empty()) << "the window is still open";
  clock_.Advance(absl::Seconds(3));
  coordinator_->Tick();
  job = Get(id);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).world_size(), 2) << "formed with the two nodes present";
}

TEST_F(CoordinatorTest, ElasticRendezvousFormsAtOnceWhenMaxNodesAreThere) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("rdzv: {last_call_s: 30}\n", "1:2"));
  ASSERT_EQ(Get(id).attempts_size(), 1);
  EXPECT_EQ(Get(id).attempts(0).world_size(), 2);
}

TEST_F(CoordinatorTest, ARankOfALostWorkerShowsLostOnceItsAttemptEnded) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 0\n"));
  auto [t1, t2] = StartOnTwoWorkers(id);
  const v1::Job running = Get(id);
  for (const auto& r : running.attempts(0).ranks()) {
    EXPECT_FALSE(r.lost()) << "rank " << r.rank() << " of a running attempt";
  }
  clock_.Advance(absl::Seconds(6));
  Heartbeat("w1", {Report(t1)});
  clock_.Advance(absl::Seconds(5));  // w2 silent for 11s > 10s.
  Heartbeat("w1", {Report(t1)});
  coordinator_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.attempts(0).state(), v1::FAILED);
  std::map<std::string, v1::RankAssignment> by_worker;
  for (const auto& r : job.attempts(0).ranks()) by_worker[r.worker()] = r;
  // w2's rank: no exit was ever reported, and nobody runs it any more.
  EXPECT_FALSE(by_worker["w2"].exited());
  EXPECT_TRUE(by_worker["w2"].lost()) << "not `running`: its worker is gone";
  // w1's rank is still being stopped by a live worker: not lost.
  EXPECT_FALSE(by_worker["w1"].lost());
  Heartbeat("w1", {Report(t1, /*exit_code=*/143)});
  const v1::Job ended = Get(id);
  for (const auto& r : ended.attempts(0).ranks()) {
    if (r.worker() == "w1") {
      EXPECT_TRUE(r.exited());
      EXPECT_FALSE(r.lost()) << "its last state is known";
    } else {
      EXPECT_TRUE(r.lost());
    }
  }
}

TEST_F(CoordinatorTest, MissedHeartbeatsFailTheAttemptAndTheJobRestarts) {
  Register("w1");
  Register("w2");
  Register("w3");
  const std::string id = Submit(JobYaml("max_restarts: 1\n"));
  v1::Job job = Get(id);
  ASSERT_EQ(job.attempts_size(), 1);
  // w1 and w2 were chosen (name order); w3 stands by.
  auto [t1, t2] = StartOnTwoWorkers(id);
  clock_.Advance(absl::Seconds(6));
  Heartbeat("w1", {Report(t1)});
  Heartbeat("w3");
  clock_.Advance(absl::Seconds(5));  // w2 silent for 11s > 10s.
  Heartbeat("w1", {Report(t1)});
  Heartbeat("w3");
  coordinator_->Tick();
  job = Get(id);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).state(), v1::FAILED);
  EXPECT_THAT(job.attempts(0).reason(), HasSubstr("worker w2 lost: no heartbeat for 11.0s"));
  EXPECT_EQ(job.restarts(), 1);
  // w1 is told to stop its trainers; once they are gone, attempt 2 forms on w1 + w3.
  EXPECT_TRUE(Heartbeat("w1", {Report(t1)}).empty());
  EXPECT_EQ(Get(id).state(), v1::PENDING);
  Heartbeat("w1", {Report(t1, /*exit_code=*/143)});
  job = Get(id);
  ASSERT_EQ(job.attempts_size(), 2);
  std::set<std::string> workers;
  for (const auto& r : job.attempts(1).ranks()) workers.insert(r.worker());
  EXPECT_THAT(workers, ElementsAre("w1", "w3"));
  EXPECT_EQ(job.attempts(0).ranks(0).exit_code(), 143) << "the stopped trainer's exit is kept";
  auto workers_view = coordinator_->ListWorkers({});
  ASSERT_TRUE(workers_view.ok()) << workers_view.status();
  ASSERT_EQ(workers_view->workers_size(), 3);
  EXPECT_FALSE(workers_view->workers(1).alive());
}

TEST_F(CoordinatorTest, ARestartWaitsUntilEveryRankOfTheAttemptBeforeItIsGone) {
  // Two slots each: w1 keeps a free slot while its rank of attempt 1 stops, and w3 is
  // free, so only the rule keeps attempt 2 from starting that rank's number again.
  Register("w1", 2);
  Register("w2", 2);
  Register("w3", 2);
  const std::string id = Submit(JobYaml("max_restarts: 1\n"));
  auto [t1, t2] = StartOnTwoWorkers(id);
  clock_.Advance(absl::Seconds(6));
  Heartbeat("w1", {Report(t1)});
  Heartbeat("w3");
  clock_.Advance(absl::Seconds(5));  // w2 silent for 11s: lost, its rank with it.
  Heartbeat("w1", {Report(t1)});
  Heartbeat("w3");
  coordinator_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_THAT(job.reason(), HasSubstr("waiting for 1 rank(s) of attempt 1 to exit"));
  EXPECT_TRUE(Heartbeat("w1", {Report(t1)}).empty()) << "w1 stops its rank";
  EXPECT_TRUE(Heartbeat("w3").empty()) << "nothing starts while it stops";
  ASSERT_EQ(Get(id).attempts_size(), 1);
  Heartbeat("w1", {Report(t1, /*exit_code=*/143)});
  job = Get(id);
  ASSERT_EQ(job.attempts_size(), 2) << "the exit reported frees the restart";
  EXPECT_EQ(job.attempts(1).ranks_size(), 2);
}

TEST_F(CoordinatorTest, APermanentExitFailsTheJobWithoutRestarting) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 3\n"));
  auto [t1, t2] = StartOnTwoWorkers(id);
  // The trainer explains itself in an error event before it exits.
  v1::TrainerEvent error;
  error.mutable_error()->set_message("data.csv.path: cannot open 'x.csv'");
  ASSERT_TRUE(ReportEvents("w2", id, /*attempt=*/1, /*rank=*/1, {error}).ok());
  Heartbeat("w2", {Report(t2, /*exit_code=*/2)});
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.reason(), HasSubstr("rank 1 on w2 exited with code 2 (permanent error): "
                                      "data.csv.path: cannot open 'x.csv'"));
}

TEST_F(CoordinatorTest, APermanentFailureBeatsARetryableOneReportedWithIt) {
  Register("w1", 2);
  const std::string id = Submit(JobYaml("nproc_per_node: 2\nmax_restarts: 3\n", "1"));
  const v1::Task task = TaskOf(id, Heartbeat("w1"));
  Heartbeat("w1", {Report(task)});
  v1::TaskStatus status = Report(task, /*exit_code=*/1);  // Rank 0: a peer died.
  status.mutable_ranks(1)->set_exit_code(2);             // Rank 1: bad data.
  Heartbeat("w1", {status});
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.reason(), HasSubstr("rank 1 on w1 exited with code 2 (permanent error)"));
}

TEST_F(CoordinatorTest, APermanentExitReportedAfterARetryableFailureCancelsTheRestart) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 3\n"));
  auto [t1, t2] = StartOnTwoWorkers(id);
  Heartbeat("w1", {Report(t1, /*exit_code=*/1)});
  ASSERT_EQ(Get(id).state(), v1::PENDING) << "restarting";
  Heartbeat("w2", {Report(t2, /*exit_code=*/2)});
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.reason(), HasSubstr("rank 1 on w2 exited with code 2 (permanent error)"));
  EXPECT_TRUE(Heartbeat("w1").empty());
}

TEST_F(CoordinatorTest, AJobThatEndsBeforeItWasSeenRunningHasAStartTime) {
  Register("w1");
  const std::string id = Submit(JobYaml("", "1"));
  const v1::Task task = TaskOf(id, Heartbeat("w1"));
  Heartbeat("w1", {Report(task, 0)});  // Started and finished between two heartbeats.
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_NE(job.start_ms(), 0);
}

TEST_F(CoordinatorTest, RetryableFailuresStopAtMaxRestarts) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 1\n"));
  for (int attempt = 1; attempt <= 2; ++attempt) {
    auto [t1, t2] = StartOnTwoWorkers(id);
    Heartbeat("w1", {Report(t1, /*exit_code=*/1)});
    Heartbeat("w2", {Report(t2, /*exit_code=*/1)});
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.attempts_size(), 2);
  EXPECT_THAT(job.reason(), HasSubstr("(no restarts left of 1)"));
}

TEST_F(CoordinatorTest, TrainersThatNeverStartFailTheAttemptAfterTheStartTimeout) {
  Register("w1");
  Register("w2");
  // rdzv.timeout_s (the trainers' own rendezvous) is not what the coordinator waits.
  const std::string id = Submit(JobYaml("max_restarts: 1\nrdzv: {timeout_s: 120}\n"));
  auto t1 = Heartbeat("w1");
  ASSERT_EQ(t1.size(), 1u);
  // Both workers stay alive, but w2 holds its task and never reports a trainer up.
  for (int i = 0; i < 4; ++i) {
    Heartbeat("w1", {Report(t1[0])});
    Heartbeat("w2");
    coordinator_->Tick();
    EXPECT_EQ(Get(id).state(), v1::RENDEZVOUS) << "after " << i * 2 << "s";
    clock_.Advance(absl::Seconds(2));
  }
  EXPECT_EQ(StartTimeout(options_), absl::Seconds(10));  // max(5 x 1s, 10s).
  clock_.Advance(absl::Seconds(2));
  Heartbeat("w1", {Report(t1[0])});
  Heartbeat("w2");
  coordinator_->Tick();  // 10s: the start timeout.
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::PENDING) << "retryable: " << job.reason();
  EXPECT_EQ(job.restarts(), 1);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).state(), v1::FAILED);
  EXPECT_THAT(job.attempts(0).reason(),
              HasSubstr("rendezvous timed out: trainers on w2 not running within 10s (the start "
                        "timeout)"));
}

TEST_F(CoordinatorTest, TheStartTimeoutIsAFewHeartbeatsWithAFloor) {
  CoordinatorOptions o;
  EXPECT_EQ(StartTimeout(o), absl::Seconds(10));  // 5 x 500ms is below the floor.
  o.heartbeat_interval = absl::Seconds(3);
  EXPECT_EQ(StartTimeout(o), absl::Seconds(15));
  o.start_timeout = absl::Seconds(4);
  EXPECT_EQ(StartTimeout(o), absl::Seconds(4));  // --start-timeout wins.
}

TEST_F(CoordinatorTest, ANodeFaultQuarantinesTheWorkerAndTheRetryRunsElsewhere) {
  Register("w1");
  Register("w2");
  Register("w3");
  const std::string id = Submit(JobYaml("max_restarts: 2\n"));
  auto t1 = TaskOf(id, Heartbeat("w1"));
  v1::TaskStatus fault;
  fault.set_job_id(id);
  fault.set_attempt(1);
  fault.set_error("workdir /jobs/x does not exist on this node");
  fault.set_node_fault(true);
  auto after = Heartbeat("w1", {fault});
  EXPECT_TRUE(after.empty()) << "its attempt failed; the retry is not placed on it";
  v1::Job job = Get(id);
  ASSERT_EQ(job.attempts_size(), 2) << job.reason();
  EXPECT_EQ(job.restarts(), 1);
  std::set<std::string> nodes;
  for (const auto& r : job.attempts(1).ranks()) nodes.insert(r.worker());
  EXPECT_THAT(nodes, ::testing::ElementsAre("w2", "w3"));
  auto listed = coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(listed.ok());
  const v1::Worker& w1 = listed->workers(0);
  ASSERT_EQ(w1.name(), "w1");
  EXPECT_TRUE(w1.alive());
  EXPECT_EQ(w1.quarantined_until_ms(), absl::ToUnixMillis(clock_.Now() + absl::Seconds(30)));
  EXPECT_THAT(w1.quarantine_reason(),
              HasSubstr("workdir /jobs/x does not exist on this node"));
  EXPECT_EQ(listed->workers(1).quarantined_until_ms(), 0);
  // Reporting the failed task again (each heartbeat carries it) changes nothing.
  Heartbeat("w1", {fault});
  // After 30s the quarantine lifts by itself, and w1 takes work again.
  clock_.Advance(absl::Seconds(31));
  for (const char* w : {"w1", "w2", "w3"}) Heartbeat(w);
  coordinator_->Tick();
  listed = coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->workers(0).quarantined_until_ms(), 0);
  EXPECT_EQ(listed->workers(0).quarantine_reason(), "");
}

TEST_F(CoordinatorTest, ARankExitingWithTheNodeFaultCodeQuarantinesItsWorker) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 2\n"));
  auto [t1, t2] = StartOnTwoWorkers(id);
  Heartbeat("w2", {Report(t2, kExitNodeFault)});
  auto listed = coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->workers(0).quarantined_until_ms(), 0);
  EXPECT_THAT(listed->workers(1).quarantine_reason(),
              HasSubstr(absl::StrCat("rank 1 of ", id, " attempt 1 exited with code 3 (node "
                                     "fault)")));
  EXPECT_EQ(Get(id).state(), v1::PENDING) << "waits: w2 is quarantined, w1 alone is too few";
}

TEST_F(CoordinatorTest, CancelStopsTheTrainersAndFreesTheSlots) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml());
  auto [t1, t2] = StartOnTwoWorkers(id);
  auto cancelled = coordinator_->Cancel(id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_TRUE(Heartbeat("w1", {Report(t1)}).empty()) << "w1 must stop its trainer";
  EXPECT_THAT(coordinator_->Cancel(id),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already finished")));
  // Until the trainer is gone its slot stays taken.
  const std::string next = Submit(JobYaml());
  EXPECT_EQ(Get(next).state(), v1::PENDING);
  Heartbeat("w1", {Report(t1, 143)});
  Heartbeat("w2", {Report(t2, 143)});
  EXPECT_EQ(Get(next).state(), v1::RENDEZVOUS);
}

TEST_F(CoordinatorTest, TrainersHandedOutButNotYetReportedHoldTheirSlotsAfterACancel) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml());
  // Both workers are handed their task; neither has reported it yet.
  const v1::Task t1 = TaskOf(id, Heartbeat("w1"));
  TaskOf(id, Heartbeat("w2"));
  auto cancelled = coordinator_->Cancel(id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->attempts(0).live_trainers(), 2) << "they may be starting right now";
  const std::string next = Submit(JobYaml());
  EXPECT_EQ(Get(next).state(), v1::PENDING) << "not on top of the cancelled trainers";

  // w1 started its trainer and is told to stop it; w2 never got its task.
  EXPECT_TRUE(Heartbeat("w1", {Report(t1)}).empty());
  EXPECT_TRUE(Heartbeat("w2").empty());
  EXPECT_EQ(Get(id).attempts(0).live_trainers(), 1);
  EXPECT_EQ(Get(next).state(), v1::PENDING);
  Heartbeat("w1", {Report(t1, /*exit_code=*/143)});
  EXPECT_EQ(Get(id).attempts(0).live_trainers(), 0);
  EXPECT_EQ(Get(next).state(), v1::RENDEZVOUS);
}

TEST_F(CoordinatorTest, ATaskHandedOutBeforeItsAttemptFailedKeepsItsSlotUntilShownGone) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 1\n"));
  const v1::Task t1 = TaskOf(id, Heartbeat("w1"));
  const v1::Task t2 = TaskOf(id, Heartbeat("w2"));
  // w2's trainer fails at once, before w1 has reported starting its own.
  Heartbeat("w2", {Report(t2, /*exit_code=*/1)});
  v1::Job job = Get(id);
  ASSERT_EQ(job.state(), v1::PENDING);
  EXPECT_EQ(job.attempts_size(), 1) << "w1 may be starting attempt 1's trainer";
  EXPECT_TRUE(Heartbeat("w1", {Report(t1)}).empty());
  EXPECT_EQ(Get(id).attempts_size(), 1);
  Heartbeat("w1", {Report(t1, /*exit_code=*/143)});
  job = Get(id);
  EXPECT_EQ(job.attempts_size(), 2);
  EXPECT_EQ(job.state(), v1::RENDEZVOUS);
}

TEST_F(CoordinatorTest, ARestartedCoordinatorRecoversJobsRankTablesAndMetrics) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml());
  auto [t1, t2] = StartOnTwoWorkers(id);
  v1::TrainerEvent step;
  step.mutable_step()->set_global_step(7);
  step.mutable_step()->set_loss(0.25);
  ASSERT_TRUE(ReportEvents("w1", id, /*attempt=*/1, /*rank=*/0, {step}).ok());

  Open();  // A new coordinator on the same state directory, recovered.
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::RUNNING);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).ranks(1).worker(), "w2");
  EXPECT_EQ(job.attempts(0).ranks(1).pid(), 1001);
  ASSERT_EQ(job.metrics_size(), 1);
  EXPECT_EQ(job.metrics(0).global_step(), 7);
  EXPECT_DOUBLE_EQ(job.metrics(0).loss(), 0.25);
  // The workers check in with their running trainers and the job carries on.
  Heartbeat("w1", {Report(t1, 0)});
  Heartbeat("w2", {Report(t2, 0)});
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
}

TEST_F(CoordinatorTest, AJobWhoseStoredSpecNoLongerParsesIsRecoveredAsFailed) {
  const std::string id = Submit(JobYaml());  // PENDING: no workers.
  ASSERT_TRUE(coordinator_->Flush().ok()) << "its reason is written after it is visible";
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->jobs.size(), 1u);
  v1::Job job = stored->jobs[0].job;
  job.set_spec_yaml("name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                    "train: {batch_size: 0}\n");  // As if written by another version.
  ASSERT_TRUE(store_->SaveJob(job, stored->jobs[0].seq).ok());

  Open();  // Recovers.
  job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("stored spec no longer parses: "));
  EXPECT_THAT(job.reason(), HasSubstr("train.batch_size: must be > 0"));
  EXPECT_NE(job.end_ms(), 0);
  ASSERT_EQ(coordinator_->ListJobs(10).size(), 1u) << "listed, not hidden";
  stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->jobs[0].job.state(), v1::FAILED) << "and stored so";
}

TEST_F(CoordinatorTest, WorkersThatDoNotReturnAfterRecoveryAreLost) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml("max_restarts: 0\n"));
  StartOnTwoWorkers(id);
  Open();  // Recovers.
  clock_.Advance(absl::Seconds(11));
  coordinator_->Tick();
  EXPECT_EQ(Get(id).state(), v1::FAILED);
  EXPECT_THAT(Get(id).reason(), HasSubstr("lost: no heartbeat"));
}

TEST_F(CoordinatorTest, RetentionKeepsTheJobsThatEndedLastNotTheLastSubmitted) {
  retention_.retain_jobs = 1;
  Open();
  for (const char* w : {"w1", "w2", "w3", "w4"}) Register(w);
  const std::string long_job = Submit(JobYaml());   // Submitted first, on w1 + w2.
  const std::string short_job = Submit(JobYaml());  // Submitted second, on w3 + w4.
  auto [l1, l2] = StartOnTwoWorkers(long_job, "w1", "w2");
  auto [s1, s2] = StartOnTwoWorkers(short_job, "w3", "w4");
  clock_.Advance(absl::Seconds(1));
  Heartbeat("w3", {Report(s1, 0)});
  Heartbeat("w4", {Report(s2, 0)});
  clock_.Advance(absl::Seconds(1));
  Heartbeat("w1", {Report(l1, 0)});
  Heartbeat("w2", {Report(l2, 0)});
  ASSERT_EQ(Get(short_job).state(), v1::SUCCEEDED);
  ASSERT_EQ(Get(long_job).state(), v1::SUCCEEDED);

  clock_.Advance(absl::Minutes(1));
  coordinator_->Tick();

  EXPECT_EQ(Get(long_job).state(), v1::SUCCEEDED) << "it ended last: the newest finished job";
  EXPECT_THAT(coordinator_->GetJob(short_job), StatusIs(absl::StatusCode::kNotFound));
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->jobs.size(), 1u);
  EXPECT_EQ(stored->jobs[0].job.id(), long_job);
}

TEST_F(CoordinatorTest, AHeartbeatWithNothingNewWritesNothingAndSchedulesNothing) {
  for (const char* w : {"w1", "w2", "w3"}) Register(w);
  const std::string running = Submit(JobYaml());
  auto [t1, t2] = StartOnTwoWorkers(running);
  const std::string waiting = Submit(JobYaml());          // Needs w1 or w2 back.
  const std::string too_big = Submit(JobYaml("", "5"));  // Never fits.
  ASSERT_EQ(Get(waiting).state(), v1::PENDING);
  ASSERT_TRUE(Get(too_big).unschedulable());
  Heartbeat("w3");
  ASSERT_TRUE(coordinator_->Flush().ok());
  const Coordinator::Stats before = coordinator_->stats();

  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    Heartbeat("w1", {Report(t1)});  // The same trainers, still running.
    Heartbeat("w2", {Report(t2)});
    Heartbeat("w3");                // Idle.
  }
  ASSERT_TRUE(coordinator_->Flush().ok());
  const Coordinator::Stats after = coordinator_->stats();
  EXPECT_EQ(after.heartbeats, before.heartbeats + 30);
  EXPECT_EQ(after.store.rows_staged, before.store.rows_staged) << "no store write";
  EXPECT_EQ(after.store.commits, before.store.commits);
  EXPECT_EQ(after.scheduling_passes, before.scheduling_passes) << "no scheduling pass";

  // Something new does both: w1's trainer exits, failing the attempt (max_restarts 0).
  Heartbeat("w1", {Report(t1, /*exit_code=*/1)});
  ASSERT_TRUE(coordinator_->Flush().ok());
  EXPECT_GT(coordinator_->stats().store.rows_staged, after.store.rows_staged);
  EXPECT_GT(coordinator_->stats().scheduling_passes, after.scheduling_passes);
}

TEST_F(CoordinatorTest, OneRankStartingWritesThatRanksRowOnly) {
  for (const char* w : {"w1", "w2", "w3", "w4"}) Register(w);
  const std::string id = Submit(JobYaml("", "4"));
  std::map<std::string, v1::Task> tasks;
  for (const char* w : {"w1", "w2", "w3", "w4"}) tasks[w] = TaskOf(id, Heartbeat(w));
  ASSERT_TRUE(coordinator_->Flush().ok());
  const int64_t rows = coordinator_->stats().store.rows_staged;
  Heartbeat("w2", {Report(tasks["w2"])});
  ASSERT_TRUE(coordinator_->Flush().ok());
  EXPECT_EQ(coordinator_->stats().store.rows_staged, rows + 1);
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->jobs[0].job.attempts(0).ranks(1).pid(), 1001);
}

TEST_F(CoordinatorTest, TasksAreHandedOutOnlyOnceTheirAttemptIsStored) {
  Register("w1");
  const std::string id = Submit(JobYaml("", "1"));
  const v1::Task task = TaskOf(id, Heartbeat("w1"));
  // No Flush(): the reply itself waited for the attempt's commit.
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->jobs.size(), 1u);
  ASSERT_EQ(stored->jobs[0].job.attempts_size(), 1);
  EXPECT_EQ(stored->jobs[0].job.attempts(0).master_port(), task.master_port());
  EXPECT_EQ(stored->jobs[0].job.attempts(0).ranks(0).worker(), "w1");
}

TEST_F(CoordinatorTest, AnAcknowledgedCancelIsAlreadyStored) {
  Register("w1");
  const std::string id = Submit(JobYaml("", "1"));
  ASSERT_TRUE(coordinator_->Cancel(id).ok());
  // No Flush(): Cancel answered once its rows were committed.
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->jobs.size(), 1u);
  EXPECT_EQ(stored->jobs[0].job.state(), v1::CANCELLED);
  EXPECT_EQ(stored->jobs[0].job.attempts(0).state(), v1::CANCELLED);
}

TEST_F(CoordinatorTest, AJobTheClusterCannotHoldIsSkippedWithItsReasonUntilItCan) {
  Register("w1");
  Register("w2");
  const std::string big = Submit(JobYaml("", "3"));
  const std::string small = Submit(JobYaml());
  v1::Job job = Get(big);
  EXPECT_EQ(job.state(), v1::PENDING);
  EXPECT_TRUE(job.unschedulable());
  EXPECT_THAT(job.reason(), HasSubstr("unschedulable: needs 3 node(s) with 1 slot(s) each; the "
                                      "cluster has 2 such node(s) alive"));
  EXPECT_EQ(Get(small).state(), v1::RENDEZVOUS) << "the job behind it starts";
  auto [t1, t2] = StartOnTwoWorkers(small);

  Register("w3");  // The cluster can hold it now: it waits its turn, first in line.
  job = Get(big);
  EXPECT_FALSE(job.unschedulable());
  EXPECT_THAT(job.reason(), HasSubstr("waiting for 3 node(s) with 1 free slot(s); 1 available"));
  const std::string third = Submit(JobYaml("", "1"));
  Heartbeat("w3");
  EXPECT_EQ(Get(third).state(), v1::PENDING) << "FIFO: behind a job that fits";
  Heartbeat("w1", {Report(t1, 0)});
  Heartbeat("w2", {Report(t2, 0)});
  EXPECT_EQ(Get(big).state(), v1::RENDEZVOUS);
  EXPECT_EQ(Get(big).attempts(0).world_size(), 3);
}

TEST_F(CoordinatorTest, ARendezvousTimeoutNamesAFewWorkersAndCountsTheRest) {
  for (int i = 0; i < 8; ++i) Register(absl::StrCat("w", i));
  const std::string id = Submit(JobYaml("", "8"));
  for (int step = 0; step < 4; ++step) {
    clock_.Advance(absl::Seconds(3));
    for (int i = 0; i < 8; ++i) Heartbeat(absl::StrCat("w", i));  // None starts.
    coordinator_->Tick();
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("rendezvous timed out: trainers on w0, w1, w2, w3, w4 and "
                                      "3 more not running"));
}

TEST_F(CoordinatorTest, TheStallWatchdogNamesTheStalledRankAndKeepsBlamingItAfterItsPeerExits) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(
      "name: stall\nnodes: 2\nmax_restarts: 1\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
      "train: {batch_size: 4, stall_timeout_s: 5}\n");
  auto [t1, t2] = StartOnTwoWorkers(id);
  auto step = [&](const std::string& worker, int rank) {
    v1::TrainerEvent e;
    e.mutable_step();
    EXPECT_TRUE(ReportEvents(worker, id, /*attempt=*/1, rank, {e}).ok());
  };
  step("w1", 0);
  step("w2", 1);
  // Rank 1 goes silent and its agent finds the process stopped; rank 0 still
  // reports for a while (then it, too, would wait for rank 1 in a collective).
  v1::TaskStatus stopped = Report(t2);
  stopped.mutable_ranks(0)->set_stopped(true);
  for (int s = 1; s <= 4; ++s) {
    clock_.Advance(absl::Seconds(1));
    step("w1", 0);
    Heartbeat("w1", {Report(t1)});
    Heartbeat("w2", {stopped});
    coordinator_->Tick();
    EXPECT_EQ(Get(id).state(), v1::RUNNING) << "after " << s << "s";
  }
  clock_.Advance(absl::Seconds(2));  // Rank 1 silent for 6 s > 5 s.
  coordinator_->Tick();
  v1::Job job = Get(id);
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).state(), v1::FAILED);
  EXPECT_THAT(job.attempts(0).reason(),
              HasSubstr("rank 1 on w2 stalled: no progress for 6.0s (stall timeout 5s, "
                        "train.stall_timeout_s); its process is stopped"));
  EXPECT_EQ(job.restarts(), 1);
  // The healthy peer's collective times out afterwards: it exits 1, and the
  // attempt's reason still names the stalled rank.
  Heartbeat("w1", {Report(t1, 1)});
  job = Get(id);
  EXPECT_THAT(job.attempts(0).reason(), HasSubstr("rank 1 on w2 stalled"));
  EXPECT_EQ(job.restarts(), 1);
}

TEST_F(CoordinatorTest, ListWorkersPagesInNameOrderAndSummarizesTheCluster) {
  for (int i = 0; i < 7; ++i) Register(absl::StrCat("w", i), 2);
  const std::string id = Submit(JobYaml("nproc_per_node: 2\n", "2"));
  v1::ListWorkersRequest req;
  req.set_limit(3);
  std::vector<std::string> names;
  int pages = 0;
  while (true) {
    auto page = coordinator_->ListWorkers(req);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    EXPECT_LE(page->workers_size(), 3);
    for (const auto& w : page->workers()) names.push_back(w.name());
    EXPECT_EQ(page->summary().workers(), 7);
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(names, ElementsAre("w0", "w1", "w2", "w3", "w4", "w5", "w6"));

  req = v1::ListWorkersRequest();
  req.set_summary_only(true);
  auto summary = coordinator_->ListWorkers(req);
  ASSERT_TRUE(summary.ok());
  EXPECT_TRUE(summary->workers().empty());
  EXPECT_EQ(summary->summary().alive(), 7);
  EXPECT_EQ(summary->summary().slots(), 14);
  EXPECT_EQ(summary->summary().free_slots(), 10) << "the job holds 2 nodes of 2 slots";
  EXPECT_EQ(summary->summary().busy_workers(), 2);
  auto all = coordinator_->ListWorkers({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->workers_size(), 7);
  EXPECT_THAT(all->workers(0).jobs(), ElementsAre(id));
  EXPECT_EQ(all->workers(0).free_slots(), 0);

  req = v1::ListWorkersRequest();
  req.set_limit(-1);
  EXPECT_THAT(coordinator_->ListWorkers(req),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("limit: must be >= 0")));
}

// Heartbeat rate scaling (decision 162).
// A history the store cannot give is an error, not an empty history (which would read
// as a job that never stepped: an empty plot, an empty TensorBoard export).
TEST_F(CoordinatorTest, AMetricHistoryTheStoreCannotReadIsAnErrorNotAnEmptyHistory) {
  Register("w1");
  Register("w2");
  const std::string id = Submit(JobYaml());
  StartOnTwoWorkers(id);
  v1::TrainerEvent step;
  step.mutable_step()->set_global_step(3);
  step.mutable_step()->set_loss(0.5);
  ASSERT_TRUE(ReportEvents("w1", id, /*attempt=*/1, /*rank=*/0, {step}).ok());
  ASSERT_TRUE(coordinator_->Flush().ok());
  auto read = coordinator_->GetJob(id, /*metric_history=*/true, Caller{});
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->history_size(), 1);
  EXPECT_EQ(read->history(0).global_step(), 3);

  memory().FailHistoryReads(absl::UnavailableError("the database is away"));
  read = coordinator_->GetJob(id, /*metric_history=*/true, Caller{});
  EXPECT_THAT(read.status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("job '", id, "': its metric history could not be "
                                              "read from the state store"))));
  EXPECT_THAT(read.status(), StatusIs(absl::StatusCode::kUnavailable,
                                      HasSubstr("the database is away")));
  auto plain = coordinator_->GetJob(id, /*metric_history=*/false, Caller{});
  ASSERT_TRUE(plain.ok()) << "a read without history does not touch it: " << plain.status();
  EXPECT_EQ(plain->state(), v1::RUNNING);
  ASSERT_EQ(plain->metrics_size(), 1) << "the latest metrics still come from the hub";

  memory().FailHistoryReads(absl::OkStatus());
  read = coordinator_->GetJob(id, /*metric_history=*/true, Caller{});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->history_size(), 1) << "nothing was lost meanwhile";
}

}  // namespace
}  // namespace ddp
