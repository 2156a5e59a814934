// The job state machine alone: every transition of job_lifecycle.h's diagram, as a
// table of (state before, event, state after), with no workers, queue, store or lock.
#include "coordinator/core/job_lifecycle.h"

#include <signal.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);
constexpr absl::Duration kStart = absl::Seconds(30);  // The start timeout.

JobSpec Spec(int min_nodes, int max_nodes, int max_restarts) {
  JobSpec spec;
  spec.name = "demo";
  spec.nodes = {min_nodes, max_nodes};
  spec.nproc_per_node = 1;
  spec.max_restarts = max_restarts;
  spec.rdzv.timeout_s = 30;
  spec.rdzv.last_call_s = 5;
  return spec;
}

std::vector<NodeOffer> Nodes(int n) {
  std::vector<NodeOffer> nodes;
  for (int i = 1; i <= n; ++i) {
    nodes.push_back({absl::StrCat("w", i), absl::StrCat("10.0.0.", i), 1, 0, {}});
  }
  return nodes;
}

// What worker w<i> reports for its rank (i - 1) of attempt `attempt`.
v1::TaskStatus Report(int i, int pid, bool exited = false, int code = 0, int signal = 0,
                      int attempt = 1) {
  v1::TaskStatus s;
  s.set_job_id("job-1");
  s.set_attempt(attempt);
  v1::LocalRankStatus* r = s.add_ranks();
  r->set_rank(i - 1);
  r->set_pid(pid);
  r->set_exited(exited);
  r->set_exit_code(code);
  r->set_signal(signal);
  return s;
}

std::string W(int i) { return absl::StrCat("w", i); }

// The states the table starts from: a 2-node job (max_restarts 1) on w1 and w2.
JobRecord Pending() {
  return NewJob("job-1", 1, Spec(2, 2, 1), "job-1", "name: demo\n", "/work", kT0);
}
JobRecord Elastic() {
  return NewJob("job-1", 1, Spec(1, 3, 1), "job-1", "name: demo\n", "/work", kT0);
}
JobRecord Gathering() {
  JobRecord j = Elastic();
  OpenLastCall(j, kT0 + absl::Seconds(5), 1);
  return j;
}
JobRecord Formed() {
  JobRecord j = Pending();
  FormAttempt(j, Nodes(2), 40001, kT0, kStart);
  return j;
}
JobRecord Running() {
  JobRecord j = Formed();
  ApplyReport(j, W(1), Report(1, 101), kT0);
  ApplyReport(j, W(2), Report(2, 102), kT0);
  return j;
}
// The same job running a user's program (a command job): torchrun's exit rules.
JobRecord CommandRunning() {
  JobSpec spec = Spec(2, 2, 1);
  spec.command = {"python3", "train.py"};
  JobRecord j = NewJob("job-1", 1, spec, "job-1", "name: demo\n", "/work", kT0);
  FormAttempt(j, Nodes(2), 40001, kT0, kStart);
  ApplyReport(j, W(1), Report(1, 101), kT0);
  ApplyReport(j, W(2), Report(2, 102), kT0);
  return j;
}
JobRecord NoRestartsLeft() {
  JobRecord j = Running();
  j.job.set_restarts(1);
  return j;
}
// Attempt 1 failed retryably (rank 0 exited 1) while rank 1 still runs.
JobRecord Restarting() {
  JobRecord j = Running();
  ApplyReport(j, W(1), Report(1, 101, true, 1), kT0);
  return j;
}
JobRecord Unschedulable() {
  JobRecord j = Pending();
  MarkUnschedulable(j, "unschedulable: needs 2 node(s)");
  return j;
}
JobRecord Succeeded() {
  JobRecord j = Running();
  ApplyReport(j, W(1), Report(1, 101, true, 0), kT0);
  ApplyReport(j, W(2), Report(2, 102, true, 0), kT0);
  return j;
}

struct Transition {
  const char* name;
  std::function<JobRecord()> from;
  std::function<JobDelta(JobRecord&)> event;
  v1::JobState state;        // The job's state after.
  const char* reason;        // A substring of its reason after.
  int restarts = 0;
  bool finished = false;     // The delta says the job finished.
  int ended_attempt = 0;     // The delta says this attempt ended.
  bool formed = false;       // The delta says an attempt formed.
};

const Transition kTransitions[] = {
    {"PendingWaitsWithItsReason", Pending,
     [](JobRecord& j) { return Wait(j, "waiting for 2 node(s) with 1 free slot(s); 1 available"); },
     v1::PENDING, "1 available"},
    {"PendingIsMarkedUnschedulable", Pending,
     [](JobRecord& j) { return MarkUnschedulable(j, "unschedulable: needs 2 node(s)"); },
     v1::PENDING, "unschedulable: needs 2 node(s)"},
    {"PendingOpensALastCall", Elastic,
     [](JobRecord& j) { return OpenLastCall(j, kT0 + absl::Seconds(5), 1); }, v1::RENDEZVOUS,
     "rendezvous: 1 of up to 3 nodes; last call ends in 5s"},
    {"PendingForms", Pending,
     [](JobRecord& j) { return FormAttempt(j, Nodes(2), 40001, kT0, kStart); },
     v1::RENDEZVOUS, "attempt 1: starting 2 trainers on w1, w2", 0, false, 0, true},
    {"UnschedulableFormsOnceTheClusterCanHoldIt", Unschedulable,
     [](JobRecord& j) { return FormAttempt(j, Nodes(2), 40001, kT0, kStart); }, v1::RENDEZVOUS,
     "attempt 1: starting 2 trainers", 0, false, 0, true},
    {"GatheringFormsWhenTheLastCallEnds", Gathering,
     [](JobRecord& j) { return FormAttempt(j, Nodes(2), 40001, kT0, kStart); }, v1::RENDEZVOUS,
     "attempt 1: starting 2 trainers", 0, false, 0, true},
    {"GatheringGoesBackToPendingWhenNodesLeave", Gathering,
     [](JobRecord& j) { return Wait(j, "waiting for 1 node(s)"); }, v1::PENDING,
     "waiting for 1 node(s)"},
    {"FormedWaitsForEveryRank", Formed,
     [](JobRecord& j) { return ApplyReport(j, W(1), Report(1, 101), kT0); }, v1::RENDEZVOUS,
     "attempt 1: starting"},
    {"FormedRunsWhenEveryRankIsUp", Formed,
     [](JobRecord& j) {
       ApplyReport(j, W(1), Report(1, 101), kT0);
       return ApplyReport(j, W(2), Report(2, 102), kT0);
     },
     v1::RUNNING, "attempt 1: 2 ranks running"},
    {"FormedFailsForGoodWhenAWorkerCannotStartTrainers", Formed,
     [](JobRecord& j) {
       v1::TaskStatus s = Report(2, 0);
       s.set_error("workdir /work: no such directory");
       return ApplyReport(j, W(2), s, kT0);
     },
     v1::FAILED, "worker w2 could not start trainers: workdir /work", 0, true, 1},
    {"FormedTimesOutAtItsDeadline", Formed,
     [](JobRecord& j) {
       ApplyReport(j, W(1), Report(1, 101), kT0);
       return TimeOutRendezvous(j, kT0 + absl::Seconds(30));
     },
     v1::PENDING, "rendezvous timed out: trainers on w2 not running within 30s (the start timeout)",
     1, false, 1},
    {"FormedDoesNotTimeOutBeforeItsDeadline", Formed,
     [](JobRecord& j) { return TimeOutRendezvous(j, kT0 + absl::Seconds(29)); },
     v1::RENDEZVOUS, "attempt 1: starting"},
    {"RunningSucceedsWhenEveryRankExitsZero", Running,
     [](JobRecord& j) {
       ApplyReport(j, W(1), Report(1, 101, true, 0), kT0);
       return ApplyReport(j, W(2), Report(2, 102, true, 0), kT0);
     },
     v1::SUCCEEDED, "all 2 ranks exited 0", 0, true, 1},
    {"RunningGoesOnWhileARankStillRuns", Running,
     [](JobRecord& j) { return ApplyReport(j, W(1), Report(1, 101, true, 0), kT0); },
     v1::RUNNING, "2 ranks running"},
    {"RunningRestartsAfterARetryableExit", Running,
     [](JobRecord& j) { return ApplyReport(j, W(2), Report(2, 102, true, 1), kT0); },
     v1::PENDING, "restarting (1 of 1) after attempt 1 failed: rank 1 on w2 exited with code 1",
     1, false, 1},
    {"RunningRestartsAfterASignal", Running,
     [](JobRecord& j) { return ApplyReport(j, W(2), Report(2, 102, true, 0, 9), kT0); },
     v1::PENDING, "rank 1 on w2 was killed by SIGKILL", 1, false, 1},
    {"RunningFailsForGoodOnAPermanentExit", Running,
     [](JobRecord& j) { return ApplyReport(j, W(2), Report(2, 102, true, 2), kT0); },
     v1::FAILED, "rank 1 on w2 exited with code 2 (permanent error)", 0, true, 1},
    {"ACommandJobsExitCode2IsJustAFailureWorthARestart", CommandRunning,
     [](JobRecord& j) { return ApplyReport(j, W(2), Report(2, 102, true, 2), kT0); },
     v1::PENDING, "restarting (1 of 1) after attempt 1 failed: rank 1 on w2 exited with code 2",
     1, false, 1},
    {"ACommandJobRestartsAfterASignal", CommandRunning,
     [](JobRecord& j) { return ApplyReport(j, W(1), Report(1, 101, true, 0, 15), kT0); },
     v1::PENDING, "rank 0 on w1 was killed by SIGTERM", 1, false, 1},
    {"ACommandJobSucceedsWhenEveryRankExitsZero", CommandRunning,
     [](JobRecord& j) {
       ApplyReport(j, W(1), Report(1, 101, true, 0), kT0);
       return ApplyReport(j, W(2), Report(2, 102, true, 0), kT0);
     },
     v1::SUCCEEDED, "all 2 ranks exited 0", 0, true, 1},
    {"RunningFailsWhenNoRestartsAreLeft", NoRestartsLeft,
     [](JobRecord& j) { return ApplyReport(j, W(1), Report(1, 101, true, 1), kT0); },
     v1::FAILED, "(no restarts left of 1)", 1, true, 1},
    {"RunningRestartsWhenAWorkerIsLost", Running,
     [](JobRecord& j) {
       return FailAttempt(j, "worker w2 lost: no heartbeat for 10.1s", true, kT0);
     },
     v1::PENDING, "after attempt 1 failed: worker w2 lost", 1, false, 1},
    {"APermanentExitWhileWaitingToRestartFailsTheJob", Restarting,
     [](JobRecord& j) { return ApplyReport(j, W(2), Report(2, 102, true, 2), kT0); },
     v1::FAILED, "rank 1 on w2 exited with code 2 (permanent error)", 0, true},
    {"ARetryableExitWhileWaitingToRestartOnlyShowsTheExit", Restarting,
     [](JobRecord& j) { return ApplyReport(j, W(2), Report(2, 102, true, 143), kT0); },
     v1::PENDING, "restarting (1 of 1)", 1},
    {"RunningKeepsATrainersErrorInItsRankRow", Running,
     [](JobRecord& j) { return RecordRankError(j, 1, 1, "data.csv.path: cannot open"); },
     v1::RUNNING, "2 ranks running"},
    {"PendingIsCancelled", Pending, [](JobRecord& j) { return *Cancel(j, kT0); },
     v1::CANCELLED, "cancelled by user", 0, true},
    {"GatheringIsCancelled", Gathering, [](JobRecord& j) { return *Cancel(j, kT0); },
     v1::CANCELLED, "cancelled by user", 0, true},
    {"RunningIsCancelled", Running, [](JobRecord& j) { return *Cancel(j, kT0); },
     v1::CANCELLED, "cancelled by user", 0, true, 1},
};

class TransitionTest : public ::testing::TestWithParam<Transition> {};

TEST_P(TransitionTest, EndsInTheExpectedStateAndSaysSo) {
  const Transition& t = GetParam();
  JobRecord job = t.from();
  const JobDelta delta = t.event(job);
  EXPECT_EQ(job.job.state(), t.state) << JobStateName(job.job.state());
  EXPECT_THAT(job.job.reason(), HasSubstr(t.reason));
  EXPECT_EQ(job.job.restarts(), t.restarts);
  EXPECT_EQ(delta.finished, t.finished);
  EXPECT_EQ(delta.finished, IsTerminal(job.job.state()) && !IsTerminal(t.from().job.state()));
  EXPECT_EQ(delta.ended_attempt, t.ended_attempt);
  EXPECT_EQ(delta.formed, t.formed);
  EXPECT_EQ(Queued(job), job.job.state() == v1::PENDING || job.gathering);
  if (t.ended_attempt != 0) {
    EXPECT_EQ(ActiveAttempt(job), nullptr) << "the attempt that ended is no longer active";
    EXPECT_THAT(delta.attempt_rows, ::testing::Contains(t.ended_attempt));
  }
  if (job.job.state() != t.from().job.state() || job.job.reason() != t.from().job.reason()) {
    EXPECT_TRUE(delta.job_row) << "a changed state or reason is stored";
  }
}

INSTANTIATE_TEST_SUITE_P(JobLifecycle, TransitionTest, ::testing::ValuesIn(kTransitions),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(JobLifecycleTest, AFinishedJobCannotBeCancelled) {
  JobRecord job = Succeeded();
  EXPECT_THAT(Cancel(job, kT0), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("already finished (SUCCEEDED)")));
}

TEST(JobLifecycleTest, AnUnchangedWaitReasonWritesNothing) {
  JobRecord job = Pending();
  EXPECT_TRUE(Wait(job, "waiting").job_row);
  EXPECT_TRUE(Wait(job, "waiting").empty());
}

TEST(JobLifecycleTest, OneRankReportedInABigAttemptWritesThatRanksRowOnly) {
  JobRecord job = NewJob("job-1", 1, Spec(4096, 4096, 0), "job-1", "", "/w", kT0);
  std::vector<NodeOffer> nodes;
  for (int i = 0; i < 4096; ++i) {
    nodes.push_back({absl::StrFormat("w%04d", i), "10.0.0.1", 1, 0, {}});
  }
  const JobDelta formed = FormAttempt(job, nodes, 40001, kT0, kStart);
  EXPECT_EQ(formed.rank_rows.size(), 4096u) << "a new rank table is written whole";
  EXPECT_THAT(job.job.reason(),
              HasSubstr("starting 4096 trainers on w0000, w0001, w0002, w0003, w0004 and "
                        "4091 more"));
  v1::TaskStatus s;
  s.set_job_id("job-1");
  s.set_attempt(1);
  s.add_ranks()->set_rank(17);
  s.mutable_ranks(0)->set_pid(4242);
  const JobDelta delta = ApplyReport(job, "w0017", s, kT0);
  EXPECT_THAT(delta.rank_rows, ElementsAre(std::make_pair(1, 17)));
  EXPECT_FALSE(delta.job_row);
  EXPECT_EQ(job.ranks_up, 1);
  EXPECT_TRUE(ApplyReport(job, "w0017", s, kT0).empty()) << "the same report again: nothing";
  EXPECT_TRUE(ApplyReport(job, "w0018", s, kT0).empty()) << "rank 17 is not w0018's";
}

TEST(JobLifecycleTest, ARestoredJobWhoseSpecNoLongerParsesFailsShowingWhy) {
  JobRecord job = Running();
  job.job.set_spec_yaml("name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                        "train: {batch_size: 0}\n");
  const JobDelta delta = RestoreJob(job, kT0);
  EXPECT_EQ(job.job.state(), v1::FAILED);
  EXPECT_THAT(job.job.reason(), HasSubstr("stored spec no longer parses: "));
  EXPECT_TRUE(delta.finished);
  EXPECT_EQ(job.job.attempts(0).state(), v1::FAILED);
}

TEST(JobLifecycleTest, ARestoredRunningJobCountsItsRanksAgain) {
  JobRecord job = Running();
  job.ranks_up = job.ranks_exited = 0;
  job.job.set_spec_yaml("name: demo\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                        "train: {batch_size: 4}\n");
  EXPECT_TRUE(RestoreJob(job, kT0).empty());
  EXPECT_EQ(job.ranks_up, 2);
  ApplyReport(job, W(1), Report(1, 101, true, 0), kT0);
  ApplyReport(job, W(2), Report(2, 102, true, 0), kT0);
  EXPECT_EQ(job.job.state(), v1::SUCCEEDED);
}

TEST(JobLifecycleTest, ARestoredCommandJobWatchesOnlyTheRanksThatReport) {
  JobRecord job = CommandRunning();
  job.job.set_spec_yaml("name: demo\ncommand: [python3, train.py]\n");
  job.stall = StallWatch();  // As a record freshly loaded from the store has it.
  EXPECT_TRUE(RestoreJob(job, kT0).empty());
  // Rank 0 reports every second; rank 1 (a program that reports from rank 0 only) never.
  for (int t = 0; t <= 100; ++t) job.stall.Progress(0, 2, true, kT0 + absl::Seconds(t));
  EXPECT_FALSE(job.stall.Find(kT0 + absl::Seconds(100), absl::Seconds(5)).has_value());
}

TEST(JobLifecycleTest, ListSomeNamesAFewAndCountsTheRest) {
  EXPECT_EQ(ListSome({}), "");
  EXPECT_EQ(ListSome({"a", "b"}), "a, b");
  EXPECT_EQ(ListSome({"a", "b", "c", "d", "e", "f", "g"}), "a, b, c, d, e and 2 more");
  EXPECT_EQ(ListSome({"a", "b", "c"}, 1), "a and 2 more");
}

TEST(JobLifecycleTest, ReportsOfUnknownAttemptsChangeNothing) {
  JobRecord job = Running();
  EXPECT_TRUE(ApplyReport(job, W(1), Report(1, 5, false, 0, 0, /*attempt=*/7), kT0).empty());
  EXPECT_THAT(RecordRankError(job, 9, 0, "x").rank_rows, IsEmpty());
}

// Live recovery (max_recoveries): a running 2-node job that may recover twice.
JobRecord Recoverable() {
  JobSpec spec = Spec(2, 2, 1);
  spec.max_recoveries = 2;
  spec.recovery_timeout_s = 20;
  JobRecord j = NewJob("job-1", 1, spec, "job-1", "name: demo\n", "/work", kT0);
  FormAttempt(j, Nodes(2), 40001, kT0, kStart);
  ApplyReport(j, W(1), Report(1, 101), kT0);
  ApplyReport(j, W(2), Report(2, 102), kT0);
  return j;
}

TEST(LiveRecoveryLifecycleTest, AKilledRankIsReplacedInANewGenerationOfTheSameAttempt) {
  JobRecord j = Recoverable();
  ASSERT_EQ(j.job.state(), v1::RUNNING);
  EXPECT_EQ(j.job.max_recoveries(), 2);
  // Rank 1 killed: not a failure of the attempt, a recovery to begin.
  JobDelta d = ApplyReport(j, W(2), Report(2, 102, true, 0, SIGKILL), kT0 + absl::Seconds(1));
  EXPECT_TRUE(d.recover);
  EXPECT_EQ(d.ended_attempt, 0);
  EXPECT_EQ(j.job.attempts(0).state(), v1::RUNNING);
  EXPECT_EQ(LiveRecoveryRefusal(j), "");
  d = BeginRecovery(j, "10.0.0.1", 40002, kT0 + absl::Seconds(1));
  const v1::Attempt& a = j.job.attempts(0);
  EXPECT_EQ(a.generation(), 1);
  EXPECT_EQ(a.master_port(), 40002);
  EXPECT_EQ(j.job.recoveries(), 1);
  ASSERT_EQ(a.recoveries_size(), 1);
  EXPECT_EQ(a.recoveries(0).outcome(), "recovering");
  EXPECT_THAT(a.recoveries(0).cause(), HasSubstr("rank 1 on w2 was killed by SIGKILL (pid 102)"));
  EXPECT_THAT(a.recoveries(0).ranks(), ElementsAre(1));
  EXPECT_EQ(a.ranks(1).pid(), 0);
  EXPECT_FALSE(a.ranks(1).exited());
  EXPECT_EQ(a.ranks(1).generation(), 1);
  EXPECT_EQ(a.ranks(0).pid(), 101) << "the survivor keeps its process";
  EXPECT_TRUE(Recovering(a));
  EXPECT_EQ(j.recovery_deadline, kT0 + absl::Seconds(21));
  EXPECT_THAT(j.job.reason(), HasSubstr("live recovery 1 (1 of 2): replacing rank 1"));
  // The dead process's exit, reported again, is of generation 0: ignored.
  d = ApplyReport(j, W(2), Report(2, 102, true, 0, SIGKILL), kT0 + absl::Seconds(2));
  EXPECT_THAT(d.rank_rows, IsEmpty());
  EXPECT_FALSE(d.recover);
  // The replacement comes up, and rank 0 reports the state moved.
  v1::TaskStatus up = Report(2, 202);
  up.mutable_ranks(0)->set_generation(1);
  ApplyReport(j, W(2), up, kT0 + absl::Seconds(2));
  EXPECT_EQ(j.job.attempts(0).ranks(1).pid(), 202);
  d = FinishRecovery(j, 1, 1, 0, 45, kT0 + absl::Milliseconds(2500));
  EXPECT_TRUE(d.job_row);
  EXPECT_FALSE(Recovering(j.job.attempts(0)));
  EXPECT_EQ(j.job.attempts(0).recoveries(0).outcome(), "recovered");
  EXPECT_EQ(j.job.attempts(0).recoveries(0).source_rank(), 0);
  EXPECT_EQ(j.job.attempts(0).recoveries(0).global_step(), 45);
  EXPECT_EQ(j.job.attempts(0).recoveries(0).end_ms() - j.job.attempts(0).recoveries(0).start_ms(),
            1500);
  EXPECT_EQ(j.recovery_deadline, absl::InfiniteFuture());
  // A stale `recovered` (another generation) changes nothing.
  EXPECT_TRUE(FinishRecovery(j, 1, 7, 0, 45, kT0).empty());
}

TEST(LiveRecoveryLifecycleTest, ASecondFaultDuringARecoveryFailsTheAttemptNamingIt) {
  JobRecord j = Recoverable();
  ApplyReport(j, W(2), Report(2, 102, true, 0, SIGKILL), kT0);
  BeginRecovery(j, "10.0.0.1", 40002, kT0);
  JobDelta d = ApplyReport(j, W(1), Report(1, 101, true, 1), kT0 + absl::Seconds(1));
  EXPECT_EQ(d.ended_attempt, 1);
  EXPECT_FALSE(d.recover);
  EXPECT_EQ(j.job.state(), v1::PENDING);
  EXPECT_EQ(j.job.restarts(), 1);
  const v1::Attempt& a = j.job.attempts(0);
  EXPECT_EQ(a.state(), v1::FAILED);
  EXPECT_THAT(a.reason(), HasSubstr("live recovery 1 failed: a second fault during it: rank 0 on "
                                    "w1 exited with code 1"));
  EXPECT_THAT(a.reason(), HasSubstr("falling back to a restart from the last checkpoint"));
  EXPECT_THAT(a.recoveries(0).outcome(), HasSubstr("failed: live recovery 1 failed"));
  EXPECT_NE(a.recoveries(0).end_ms(), 0);
}

TEST(LiveRecoveryLifecycleTest, RecoveryIsRefusedWhereItCannotWork) {
  JobRecord off = Running();  // max_recoveries 0: the attempt fails as it always did.
  JobDelta d = ApplyReport(off, W(2), Report(2, 102, true, 0, SIGKILL), kT0);
  EXPECT_FALSE(d.recover);
  EXPECT_EQ(d.ended_attempt, 1);

  JobRecord spent = Recoverable();
  spent.job.set_recoveries(2);
  EXPECT_EQ(LiveRecoveryRefusal(spent), "no recoveries left of max_recoveries 2");
  d = ApplyReport(spent, W(2), Report(2, 102, true, 0, SIGKILL), kT0);
  EXPECT_FALSE(d.recover);
  EXPECT_EQ(d.ended_attempt, 1);

  JobRecord permanent = Recoverable();  // Exit 2: a restart cannot cure it, nor a recovery.
  d = ApplyReport(permanent, W(2), Report(2, 102, true, 2), kT0);
  EXPECT_FALSE(d.recover);
  EXPECT_EQ(permanent.job.state(), v1::FAILED);

  JobRecord starting = Recoverable();
  starting.job.mutable_attempts(0)->set_state(v1::RENDEZVOUS);
  EXPECT_EQ(LiveRecoveryRefusal(starting), "the attempt was not running yet");

  JobRecord lost = Recoverable();  // A node's loss needs a survivor on another node.
  EXPECT_EQ(NodeRecoveryRefusal(lost, "w2"), "");
  ApplyReport(lost, W(1), Report(1, 101, true, 0, SIGKILL), kT0);
  EXPECT_EQ(NodeRecoveryRefusal(lost, "w2"), "no rank survived to hand its state over");

  // A recovery refused before it began is named as such, and not counted.
  JobRecord refused = Recoverable();
  FailRecovery(refused, "worker w2 lost: no spare worker has room for its 1 rank(s)", kT0);
  EXPECT_THAT(refused.job.attempts(0).reason(),
              HasSubstr("live recovery 1 failed: worker w2 lost: no spare worker"));
  EXPECT_EQ(refused.job.recoveries(), 0);
}

}  // namespace
}  // namespace ddp
