// Coordinators in standby over a real PostgreSQL server (docs/high-availability.md):
// two ddp-coordinator processes share one store, two ddp-workers and ddpctl are given
// both addresses. The leader is killed, paused, or loses the store mid-job; the job
// goes on in its first attempt and ends SUCCEEDED, and the workers and ddpctl follow
// whichever coordinator leads.
#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/process.h"
#include "tests/common/ports.h"
#include "tests/common/postgres_server.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;
using testing::PostgresServer;
using ::testing::HasSubstr;

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

class StandbyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pg = PostgresServer::Start();
    ASSERT_TRUE(pg.ok()) << pg.status();
    pg_ = std::move(*pg);
    auto cluster = LocalCluster::Start({.heartbeat_timeout = absl::Seconds(5),
                                        .store_uri = pg_->uri(),
                                        .coordinators = 2});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      for (int i = 0; i < cluster_->coordinators(); ++i) {
        std::cerr << "---- coordinator " << i << " ----\n" << cluster_->coordinator_log(i);
      }
    }
    cluster_.reset();  // Before the store goes.
    pg_.reset();
  }

  // A job of two ranks that trains for `epochs` epochs of ~310 steps.
  std::string Submit(int epochs, int max_recoveries = 0) {
    const std::string spec =
        absl::StrCat(cluster_->dir(), "/job", epochs, "-", max_recoveries, ".yaml");
    testing::WriteFile(spec, absl::StrCat(R"(name: standby
nodes: 2
max_recoveries: )", max_recoveries, R"(
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: )", epochs, R"(, batch_size: 32, threads: 1}
metrics: {every_steps: 20}
)"));
    CtlResult r = cluster_->Ctl({"submit", spec});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::string(absl::StripAsciiWhitespace(r.out));
  }

  // Running on both ranks, past `step`.
  static std::function<bool(const v1::Job&)> SteppedPast(int64_t step) {
    return [step](const v1::Job& j) {
      if (j.state() != v1::RUNNING || j.metrics_size() != 2) return false;
      for (const auto& m : j.metrics()) {
        if (m.global_step() <= step) return false;
      }
      return true;
    };
  }

  // The job ended SUCCEEDED in its first attempt: no restart, no recovery.
  void ExpectSucceededUntouched(const std::string& id) {
    auto done = cluster_->WaitFor(id, Ended, absl::Minutes(10));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
    EXPECT_EQ(done->attempts_size(), 1) << done->reason();
    EXPECT_EQ(done->restarts(), 0);
    EXPECT_EQ(done->recoveries(), 0);
  }

  std::unique_ptr<PostgresServer> pg_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(StandbyTest, TheStandbyTakesOverFromAKilledLeaderAndTheJobCarriesOn) {
  LocalCluster& c = *cluster_;
  auto leader = c.Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int standby = 1 - *leader;
  EXPECT_TRUE(c.WaitForCoordinatorLog(standby, "standby: this coordinator is a standby",
                                      absl::Seconds(10)))
      << "the standby knows who leads";
  // A standby answers every call by naming the leader.
  CtlResult asked = testing::RunCapture({testing::BinDir() + "/ddpctl", "list", "--coordinator",
                                absl::StrCat("127.0.0.1:", c.coordinator_port(standby))},
                               absl::Seconds(30));
  EXPECT_NE(asked.exit_code, 0);
  EXPECT_THAT(asked.err, HasSubstr(absl::StrCat("not the leader: this coordinator is a standby; "
                                                "the leader is at 127.0.0.1:",
                                                c.coordinator_port(*leader))));

  const std::string id = Submit(8);
  auto watch = c.CtlAsync({"watch", id});  // Given both addresses.
  ASSERT_TRUE(watch.ok()) << watch.status();
  testing::OutputCollector watched((*watch)->stdout_fd());
  ASSERT_TRUE(c.WaitFor(id, SteppedPast(100)).ok());

  const absl::Time killed = absl::Now();
  c.coordinator(*leader)->Signal(SIGKILL);
  auto next = c.Leader(absl::Seconds(30));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, standby);
  std::cerr << "the standby served " << absl::Now() - killed << " after the kill\n";
  EXPECT_TRUE(c.WaitForCoordinatorLog(standby, "leading: took the lease with epoch 2",
                                      absl::Seconds(5)));
  ExpectSucceededUntouched(id);

  // ddpctl watch followed the new leader to the end.
  const std::string out = watched.Finish(absl::Minutes(2));
  const ExitStatus watch_exit = (*watch)->Wait();
  EXPECT_EQ(watch_exit.exit_code, 0) << out;
  EXPECT_THAT(out, HasSubstr("SUCCEEDED"));
}

TEST_F(StandbyTest, ALeaderStoppedWithSigtermHandsOverAndNoRankIsTouched) {
  LocalCluster& c = *cluster_;
  const std::string id = Submit(10);
  ASSERT_TRUE(c.WaitFor(id, SteppedPast(100)).ok());
  auto first = c.GetJob(id);
  ASSERT_TRUE(first.ok()) << first.status();
  // Twice: each coordinator in turn stops (releasing its lease) and comes back as the
  // standby.
  int64_t past = 100;
  for (int round = 0; round < 2; ++round) {
    auto leader = c.Leader();
    ASSERT_TRUE(leader.ok()) << leader.status();
    const absl::Time stopped = absl::Now();
    c.coordinator(*leader)->Signal(SIGTERM);
    // Until it has taken the signal, the leader serves on, as it should.
    ASSERT_TRUE(c.WaitForCoordinatorLog(*leader, "released the lease", absl::Seconds(10)))
        << c.coordinator_log(*leader);
    auto next = c.Leader(absl::Seconds(30));
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_NE(*next, *leader);
    std::cerr << "round " << round << ": the standby served " << absl::Now() - stopped
              << " after the SIGTERM\n";
    const ExitStatus exited = c.coordinator(*leader)->Wait();
    EXPECT_TRUE(exited.ok()) << "a clean stop: " << exited.ToString() << "\n" << c.coordinator_log(*leader);
    past += 150;
    ASSERT_TRUE(c.WaitFor(id, SteppedPast(past)).ok()) << "training goes on under the new leader";
    ASSERT_TRUE(c.StartCoordinatorAt(*leader).ok());
  }
  ExpectSucceededUntouched(id);
  auto job = c.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(job->attempts(0).ranks(i).pid(), first->attempts(0).ranks(i).pid())
        << "the same trainer processes throughout: nothing fenced, nothing restarted";
  }
}

// The job's recovery policy and counters are in the shared store: the standby that
// takes over from a killed leader replaces a killed rank live, as the leader would.
TEST_F(StandbyTest, TheStandbyThatTakesOverReplacesAKilledRankLive) {
  LocalCluster& c = *cluster_;
  const std::string id = Submit(6, /*max_recoveries=*/2);
  auto running = c.WaitFor(id, SteppedPast(60));
  ASSERT_TRUE(running.ok()) << running.status();
  const v1::Attempt first = running->attempts(0);
  auto leader = c.Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  c.coordinator(*leader)->Signal(SIGKILL);
  auto next = c.Leader(absl::Seconds(30));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(*next, *leader);
  auto back = c.WaitFor(id, SteppedPast(running->metrics(0).global_step() + 20));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->max_recoveries(), 2);
  CtlResult shown = c.Ctl({"get", id});
  EXPECT_THAT(shown.out, HasSubstr("0 of 2 (live)")) << shown.out;

  ASSERT_EQ(::kill(first.ranks(1).pid(), SIGKILL), 0);
  auto done = c.WaitFor(id, Ended, absl::Minutes(10));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts(), 0);
  EXPECT_EQ(done->recoveries(), 1);
  ASSERT_EQ(done->attempts_size(), 1) << done->ShortDebugString();
  const v1::Attempt& a = done->attempts(0);
  ASSERT_EQ(a.recoveries_size(), 1);
  EXPECT_EQ(a.recoveries(0).outcome(), "recovered") << a.ShortDebugString();
  EXPECT_EQ(a.ranks(0).pid(), first.ranks(0).pid()) << "the survivor kept its process";
  EXPECT_NE(a.ranks(1).pid(), first.ranks(1).pid());
}

TEST_F(StandbyTest, BadStoreFlagsAndDatabasesAreClearErrorsAndChangeNothing) {
  const std::string coordinator = testing::BinDir() + "/ddp-coordinator";
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {coordinator, "--listen", "127.0.0.1:0"});
    return testing::RunCapture(args, absl::Seconds(60));
  };
  CtlResult r = run({"--store", "mysql://db/ddp"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not a PostgreSQL URI"));
  r = run({"--store", pg_->uri(), "--state-dir", cluster_->dir() + "/sqlite"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--state-dir and --store: give one"));
  r = run({"--store", pg_->uri(), "--lease-renew", "2s"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("at most half of --lease-ttl"));
  auto closed = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(closed.ok());
  r = run({"--store", absl::StrCat("postgresql://ddp:secret@127.0.0.1:", *closed, "/ddp"),
           "--store-wait", "1s"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("cannot reach the PostgreSQL store at 127.0.0.1:",
                                            *closed, "/ddp")));
  EXPECT_THAT(r.err, HasSubstr("waited --store-wait 1s"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("secret")));
  ASSERT_TRUE(pg_->CreateDatabase("newer").ok());
  ASSERT_TRUE(pg_->Query("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                         "INSERT INTO meta VALUES ('schema_version', '99')",
                         "newer")
                  .ok());
  r = run({"--store", pg_->uri("newer")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("schema version 99, newer than this ddp-coordinator's"));
  EXPECT_EQ(pg_->Query("SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                       "'public'",
                       "newer")
                .value_or("?"),
            "1\n")
      << "nothing created";
}

TEST_F(StandbyTest, AWorkerIsNeverTakenByACoordinatorOfAnotherStore) {
  LocalCluster& c = *cluster_;
  auto leader = c.Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  // Another cluster's coordinator, on a database of its own.
  ASSERT_TRUE(pg_->CreateDatabase("other").ok());
  auto port = ::ddp::testing::ClaimPort();
  ASSERT_TRUE(port.ok());
  const std::string other = absl::StrCat("127.0.0.1:", *port);
  SpawnOptions o;
  o.argv = {testing::BinDir() + "/ddp-coordinator", "--listen", other, "--store",
            pg_->uri("other"), "--heartbeat-timeout=5s"};
  o.capture_stderr = true;
  auto z = Subprocess::Spawn(o);
  ASSERT_TRUE(z.ok()) << z.status();
  testing::OutputCollector z_log((*z)->stderr_fd());
  ASSERT_TRUE(z_log.WaitFor("leading on", absl::Seconds(30))) << z_log.text();
  // A worker given the cluster's leader and, by mistake, the other coordinator.
  SpawnOptions w;
  w.argv = {testing::BinDir() + "/ddp-worker", "--coordinator",
            absl::StrCat("127.0.0.1:", c.coordinator_port(*leader), ",", other), "--name",
            "w9", "--work-dir", c.dir() + "/w9", "--health-listen", "127.0.0.1:0"};
  w.capture_stderr = true;
  auto w9 = Subprocess::Spawn(w);
  ASSERT_TRUE(w9.ok()) << w9.status();
  testing::OutputCollector w9_log((*w9)->stderr_fd());
  ASSERT_TRUE(c.WaitForWorkers(3).ok()) << "w9 joined the cluster through its leader";
  // The leader dies; w9 knows no standby, only the other coordinator.
  c.coordinator(*leader)->Signal(SIGKILL);
  EXPECT_TRUE(w9_log.WaitFor("must be a coordinator of the same store", absl::Seconds(30)))
      << w9_log.text();
  CtlResult listed = testing::RunCapture(
      {testing::BinDir() + "/ddpctl", "workers", "--coordinator", other}, absl::Seconds(30));
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, ::testing::Not(HasSubstr("w9")))
      << "the other coordinator kept no record of it";
  EXPECT_EQ(pg_->Query("SELECT count(*) FROM workers", "other").value_or("?"), "0\n");
  (*w9)->Terminate(absl::Seconds(5));
  (*z)->Terminate(absl::Seconds(5));
}

TEST_F(StandbyTest, APausedLeaderIsDeposedWritesNothingAndStepsDownWhenResumed) {
  LocalCluster& c = *cluster_;
  auto leader = c.Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int standby = 1 - *leader;
  const std::string id = Submit(8);
  ASSERT_TRUE(c.WaitFor(id, SteppedPast(100)).ok());

  c.coordinator(*leader)->Signal(SIGSTOP);
  // Not asked before it is stopped: a thread of it could still answer for a moment.
  ASSERT_TRUE(testing::WaitUntilStopped(c.coordinator(*leader)->pid(), absl::Seconds(10)));
  auto next = c.Leader(absl::Seconds(30));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(*next, standby);
  ASSERT_TRUE(c.WaitFor(id, SteppedPast(400)).ok()) << "the new leader follows the job";
  const std::string rows_before = pg_->Query("SELECT count(*) FROM metrics").value_or("?");

  c.coordinator(*leader)->Signal(SIGCONT);
  EXPECT_TRUE(c.WaitForCoordinatorLog(*leader, "stepping down", absl::Seconds(10)));
  EXPECT_TRUE(c.WaitForCoordinatorLog(*leader, "standby: this coordinator is a standby",
                                      absl::Seconds(20)))
      << "it executed itself again as a standby";
  const std::string log = c.coordinator_log(*leader);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("the leader is at 127.0.0.1:", c.coordinator_port(standby))));
  ExpectSucceededUntouched(id);
  // Every row is the new leader's: the lease's epoch is its, and the job's final row
  // came after the old leader stepped down.
  EXPECT_EQ(pg_->Query("SELECT epoch, address FROM lease").value_or("?"),
            absl::StrCat("2|127.0.0.1:", c.coordinator_port(standby), "\n"));
  EXPECT_EQ(pg_->Query(absl::StrCat("SELECT state, restarts FROM jobs WHERE id = '", id, "'"))
                .value_or("?"),
            absl::StrCat(static_cast<int>(v1::SUCCEEDED), "|0\n"));
  EXPECT_NE(pg_->Query("SELECT count(*) FROM metrics").value_or("?"), rows_before)
      << "the new leader kept storing the job's metrics";
}

TEST_F(StandbyTest, TrainingRidesOutTwentySecondsWithoutTheStoreAndAllIsConsistentAfter) {
  LocalCluster& c = *cluster_;
  const std::string id = Submit(30);
  auto running = c.WaitFor(id, SteppedPast(60));
  ASSERT_TRUE(running.ok()) << running.status();
  std::vector<pid_t> trainers;
  for (const auto& r : running->attempts(0).ranks()) trainers.push_back(r.pid());
  ASSERT_EQ(trainers.size(), 2u);

  ASSERT_TRUE(pg_->Stop().ok());
  const absl::Time stopped = absl::Now();
  // Without the store the coordinators serve what they can or say clearly why not.
  absl::SleepFor(absl::Seconds(5));
  CtlResult get = c.Ctl({"get", id}, absl::Seconds(30));
  if (get.exit_code == 0) {
    EXPECT_THAT(get.out, HasSubstr(id));
  } else {
    EXPECT_THAT(get.err, ::testing::AnyOf(HasSubstr("not the leader"), HasSubstr("store")))
        << get.err;
  }
  absl::SleepFor(absl::Seconds(20) - (absl::Now() - stopped));  // The outage itself.
  for (pid_t pid : trainers) EXPECT_EQ(::kill(pid, 0), 0) << "trainer " << pid << " kept running";
  ASSERT_TRUE(pg_->Restart().ok());

  ExpectSucceededUntouched(id);
  auto job = c.GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(job->attempts(0).ranks(i).pid(), trainers[static_cast<size_t>(i)])
        << "the same processes trained to the end";
  }
  EXPECT_EQ(job->epoch_history_size(), 30) << "every epoch's summary stored once";
}

}  // namespace
}  // namespace ddp
