// Live recovery on a real cluster (docs/recovery.md): a coordinator, ddp-worker
// processes and the real ddp-trainer on Gloo over loopback. A rank killed with
// SIGKILL is replaced while the other ranks keep their processes and their state, and
// the job ends exactly where an uninterrupted run of the same job ends: the same
// number of optimizer steps and bit-identical parameters (every rank's `done` line
// carries an FNV-1a hash of its parameters).
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
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

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

// Three ranks, no checkpoint: whatever a failure costs, no file gives it back.
std::string Spec(const std::string& dir, const std::string& name, int max_recoveries,
                 int max_restarts = 0, int epochs = 2) {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  testing::WriteFile(path, absl::StrCat("name: ", name, R"(
nodes: 3
max_restarts: )", max_restarts, R"(
max_recoveries: )", max_recoveries, R"(
recovery_timeout_s: 60
model: {mlp: {hidden: [64, 64]}}
data: {synthetic: {samples: 12000, features: 32, classes: 10}}
train: {epochs: )", epochs, R"(, batch_size: 32, threads: 1, seed: 7}
metrics: {every_steps: 5}
)"));
  return path;
}

std::string Submit(LocalCluster& c, const std::string& spec) {
  CtlResult r = c.Ctl({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::string(absl::StripAsciiWhitespace(r.out));
}

struct Done {
  int64_t steps = -1;
  std::string fingerprint;
  std::vector<double> train_loss;  // Each epoch's, from the job's epoch history.
};

std::vector<double> TrainLosses(LocalCluster& c, const std::string& id) {
  std::vector<double> out;
  auto job = c.GetJob(id);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return out;
  for (const v1::EpochSummary& e : job->epoch_history()) out.push_back(e.train_loss());
  return out;
}

// Each rank's last `done` line in the job's output: "[rank R] * done after N steps
// (parameters FP)".
std::map<int, Done> DoneLines(LocalCluster& c, const std::string& id) {
  CtlResult logs = c.Ctl({"logs", id});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  std::map<int, Done> out;
  static const std::regex kDone(
      R"(\[rank (\d+)\] \* done after (\d+) steps \(parameters ([0-9a-f]+)\))");
  for (auto it = std::sregex_iterator(logs.out.begin(), logs.out.end(), kDone);
       it != std::sregex_iterator(); ++it) {
    Done d;
    d.steps = std::stoll((*it)[2]);
    d.fingerprint = (*it)[3];
    out[std::stoi((*it)[1])] = d;
  }
  return out;
}

// Training is under way past `step` on every rank, and no recovery runs.
std::function<bool(const v1::Job&)> SteppedPast(int64_t step) {
  return [step](const v1::Job& j) {
    if (j.state() != v1::RUNNING || j.metrics_size() != 3 || j.attempts_size() == 0) return false;
    const v1::Attempt& a = j.attempts(j.attempts_size() - 1);
    if (a.recoveries_size() > 0 && a.recoveries(a.recoveries_size() - 1).end_ms() == 0) {
      return false;
    }
    for (const auto& m : j.metrics()) {
      if (m.global_step() <= step) return false;
    }
    for (const auto& r : a.ranks()) {
      if (r.pid() == 0) return false;
    }
    return true;
  };
}

// The reference: the same job, never interrupted.
Done Uninterrupted(LocalCluster& c) {
  const std::string id = Submit(c, Spec(c.dir(), "reference", 0));
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  EXPECT_TRUE(done.ok()) << done.status();
  if (!done.ok()) return {};
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  std::map<int, Done> lines = DoneLines(c, id);
  EXPECT_EQ(lines.size(), 3u);
  Done reference = lines[0];
  reference.train_loss = TrainLosses(c, id);
  return reference;
}

// Each epoch's train_loss is the uninterrupted run's: the lost ranks' steps before
// their deaths count (only the order of the sums differs).
void ExpectReferenceTrainLosses(LocalCluster& c, const std::string& id, const Done& reference) {
  const std::vector<double> train_loss = TrainLosses(c, id);
  ASSERT_EQ(train_loss.size(), reference.train_loss.size());
  ASSERT_FALSE(train_loss.empty());
  for (size_t e = 0; e < train_loss.size(); ++e) {
    EXPECT_NEAR(train_loss[e], reference.train_loss[e], 1e-12 * reference.train_loss[e])
        << "epoch " << e;
  }
}

// The job's end, which must be SUCCEEDED in its first attempt (a live recovery never
// starts a new one), with no restart and `recoveries` live recoveries.
absl::StatusOr<v1::Job> SucceededLive(LocalCluster& c, const std::string& id, int recoveries) {
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  if (!done.ok()) return done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts(), 0);
  EXPECT_EQ(done->recoveries(), recoveries);
  if (done->attempts_size() != 1) {
    return absl::InternalError(absl::StrCat("a live recovery never starts a new attempt: ",
                                            done->ShortDebugString()));
  }
  return done;
}

TEST(LiveRecoveryTest, KilledRanksAreReplacedLiveAndTheJobEndsBitIdenticalToAnUninterruptedRun) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  const Done reference = Uninterrupted(c);
  ASSERT_GT(reference.steps, 100);

  const std::string id = Submit(c, Spec(c.dir(), "live", 2));
  auto running = c.WaitFor(id, SteppedPast(40));
  ASSERT_TRUE(running.ok()) << running.status();
  const v1::Attempt first = running->attempts(0);
  std::map<int, int> pids;
  for (const auto& r : first.ranks()) pids[r.rank()] = r.pid();

  // Rank 1 dies mid-epoch; then rank 0, whose process hosts the store.
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  auto recovered = c.WaitFor(id, [&](const v1::Job& j) {
    return j.recoveries() == 1 && SteppedPast(running->metrics(0).global_step() + 10)(j);
  });
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  const v1::Attempt& once = recovered->attempts(0);
  ASSERT_EQ(once.recoveries_size(), 1);
  EXPECT_EQ(once.recoveries(0).outcome(), "recovered") << once.ShortDebugString();
  EXPECT_EQ(once.recoveries(0).ranks_size(), 1);
  EXPECT_EQ(once.recoveries(0).ranks(0), 1);
  EXPECT_THAT(once.recoveries(0).cause(), HasSubstr("killed by SIGKILL"));
  EXPECT_EQ(once.generation(), 1);
  const int replacement1 = once.ranks(1).pid();
  EXPECT_NE(replacement1, pids[1]);
  EXPECT_EQ(once.ranks(1).generation(), 1);
  EXPECT_EQ(once.ranks(0).pid(), pids[0]);
  EXPECT_EQ(once.ranks(2).pid(), pids[2]);
  EXPECT_EQ(once.ranks(1).worker(), first.ranks(1).worker());

  ASSERT_EQ(::kill(pids[0], SIGKILL), 0);
  auto done = SucceededLive(c, id, 2);
  ASSERT_TRUE(done.ok()) << done.status();
  const v1::Attempt& a = done->attempts(0);
  ASSERT_EQ(a.recoveries_size(), 2) << a.ShortDebugString();
  EXPECT_EQ(a.recoveries(1).outcome(), "recovered");
  EXPECT_EQ(a.recoveries(1).ranks(0), 0);
  // The store moved to a fresh port for each generation.
  EXPECT_NE(a.master_port(), first.master_port());
  // Rank 2 kept its process from the first step to the last; rank 1's replacement
  // kept its own through the second recovery.
  EXPECT_EQ(a.ranks(2).pid(), pids[2]);
  EXPECT_EQ(a.ranks(1).pid(), replacement1);
  EXPECT_NE(a.ranks(0).pid(), pids[0]);
  EXPECT_EQ(a.ranks(0).generation(), 2);

  // Exactly the steps of the uninterrupted run, and bit-identical parameters on
  // every rank, replacements included.
  std::map<int, Done> lines = DoneLines(c, id);
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& [rank, d] : lines) {
    EXPECT_EQ(d.steps, reference.steps) << "rank " << rank;
    EXPECT_EQ(d.fingerprint, reference.fingerprint) << "rank " << rank;
  }
  ExpectReferenceTrainLosses(c, id, reference);
  CtlResult logs = c.Ctl({"logs", id});
  EXPECT_THAT(logs.out, HasSubstr("[rank 0] * recovered: generation 1 formed"));
  EXPECT_THAT(logs.out, HasSubstr("[rank 0] * recovered: generation 2 formed"));
}

// What a coordinator keeps of a job's recovery policy and counters lives through a
// kill -9 of it: its successor (on the same state directory) replaces a killed rank
// live, and the next one (after a clean stop) still knows the recovery it counted.
TEST(LiveRecoveryTest, ARestartedCoordinatorKeepsTheJobsRecoveriesAndStillReplacesARankLive) {
  auto cluster = LocalCluster::Start({.workers = 4});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(4).ok());
  // 10 epochs (1,250 steps): long enough that two coordinator restarts and a recovery
  // come well before the end, however loaded the machine.
  const std::string id = Submit(c, Spec(c.dir(), "restarted", 2, 0, /*epochs=*/10));
  auto running = c.WaitFor(id, SteppedPast(20));
  ASSERT_TRUE(running.ok()) << running.status();
  const v1::Attempt first = running->attempts(0);
  std::map<int, int> pids;
  for (const auto& r : first.ranks()) pids[r.rank()] = r.pid();

  EXPECT_EQ(c.StopCoordinator(SIGKILL).signal, SIGKILL);
  ASSERT_TRUE(c.StartCoordinator().ok());
  auto back = c.WaitFor(id, SteppedPast(running->metrics(0).global_step() + 5));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->max_recoveries(), 2);
  CtlResult shown = c.Ctl({"get", id});
  EXPECT_THAT(shown.out, HasSubstr("0 of 2 (live)")) << shown.out;

  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  auto recovered = c.WaitFor(id, [&](const v1::Job& j) {
    return j.recoveries() == 1 && SteppedPast(back->metrics(0).global_step() + 5)(j);
  });
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->restarts(), 0);
  ASSERT_EQ(recovered->attempts_size(), 1);
  EXPECT_EQ(recovered->attempts(0).recoveries(0).outcome(), "recovered");
  const int replacement = recovered->attempts(0).ranks(1).pid();

  // The counter, the attempt's generation and its recovery record, from the store. A
  // clean stop this time: its store writer commits what is staged before it exits (a
  // SIGKILL within the group commit's window after the recovery ended would leave the
  // record "recovering", which is what a crash may lose).
  EXPECT_TRUE(c.StopCoordinator(SIGTERM).ok()) << "clean exit on SIGTERM";
  ASSERT_TRUE(c.StartCoordinator().ok());
  auto again = c.GetJob(id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->recoveries(), 1);
  EXPECT_EQ(again->max_recoveries(), 2);
  ASSERT_EQ(again->attempts_size(), 1);
  EXPECT_EQ(again->attempts(0).generation(), 1);
  ASSERT_EQ(again->attempts(0).recoveries_size(), 1);
  EXPECT_EQ(again->attempts(0).recoveries(0).outcome(), "recovered");
  EXPECT_EQ(again->attempts(0).recoveries(0).ranks(0), 1);
  shown = c.Ctl({"get", id});
  EXPECT_THAT(shown.out, HasSubstr("1 of 2 (live)")) << shown.out;

  auto done = SucceededLive(c, id, 1);
  ASSERT_TRUE(done.ok()) << done.status();
  const v1::Attempt& a = done->attempts(0);
  EXPECT_EQ(a.ranks(0).pid(), pids[0]);  // The survivors kept their processes
  EXPECT_EQ(a.ranks(2).pid(), pids[2]);  // through both restarts and the recovery.
  EXPECT_EQ(a.ranks(1).pid(), replacement);
}

TEST(LiveRecoveryTest, ASecondFaultDuringARecoveryFallsBackToARestartNamedInTheReason) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  const std::string id = Submit(c, Spec(c.dir(), "twice", 3, /*max_restarts=*/1));
  auto running = c.WaitFor(id, SteppedPast(20));
  ASSERT_TRUE(running.ok()) << running.status();
  const v1::Attempt first = running->attempts(0);
  ASSERT_EQ(::kill(first.ranks(1).pid(), SIGKILL), 0);
  // The replacement is up (its pid reported) but cannot have taken the state yet
  // when it dies too: the recovery has a second fault.
  auto replacing = c.WaitFor(id, [&](const v1::Job& j) {
    const v1::Attempt& a = j.attempts(0);
    return a.recoveries_size() == 1 && a.ranks(1).pid() != 0 &&
           a.ranks(1).pid() != first.ranks(1).pid();
  });
  ASSERT_TRUE(replacing.ok()) << replacing.status();
  ASSERT_EQ(::kill(replacing->attempts(0).ranks(1).pid(), SIGKILL), 0);
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->attempts_size(), 2) << done->ShortDebugString();
  EXPECT_EQ(done->restarts(), 1);
  const v1::Attempt& failed = done->attempts(0);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("live recovery 1 failed: a second fault during it: "
                                         "rank 1 on "));
  EXPECT_THAT(failed.reason(), HasSubstr("falling back to a restart from the last checkpoint"));
  ASSERT_EQ(failed.recoveries_size(), 1);
  EXPECT_THAT(failed.recoveries(0).outcome(), HasSubstr("failed: live recovery 1 failed"));
}

// The worker that ran the job's ranks on one node, with each trainer's pid.
std::string Spare(const v1::Attempt& a, const std::set<std::string>& workers) {
  std::set<std::string> left = workers;
  for (const auto& r : a.ranks()) left.erase(r.worker());
  return left.size() == 1 ? *left.begin() : "";
}

TEST(LiveRecoveryTest, ALostNodesRanksMoveToASpareWorkerAndTheJobEndsBitIdentical) {
  auto cluster = LocalCluster::Start({.workers = 4});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(4).ok());
  const Done reference = Uninterrupted(c);
  const std::string id = Submit(c, Spec(c.dir(), "node", 1));
  auto running = c.WaitFor(id, SteppedPast(40));
  ASSERT_TRUE(running.ok()) << running.status();
  const v1::Attempt first = running->attempts(0);
  const std::string spare = Spare(first, {"w1", "w2", "w3", "w4"});
  ASSERT_FALSE(spare.empty()) << first.ShortDebugString();
  // Rank 1's node goes: its agent killed, its trainer dies with it (PDEATHSIG), and
  // the coordinator hears nothing more from it.
  const std::string lost = first.ranks(1).worker();
  const int lost_index = lost[1] - '1';
  c.worker(lost_index).Signal(SIGKILL);
  auto done = SucceededLive(c, id, 1);
  ASSERT_TRUE(done.ok()) << done.status();
  const v1::Attempt& a = done->attempts(0);
  ASSERT_EQ(a.recoveries_size(), 1);
  EXPECT_EQ(a.recoveries(0).outcome(), "recovered");
  EXPECT_THAT(a.recoveries(0).cause(), HasSubstr(absl::StrCat("worker ", lost, " lost")));
  EXPECT_THAT(a.recoveries(0).cause(), HasSubstr("moved to spare worker " + spare));
  EXPECT_EQ(a.ranks(1).worker(), spare);
  EXPECT_EQ(a.ranks(0).pid(), first.ranks(0).pid());
  EXPECT_EQ(a.ranks(2).pid(), first.ranks(2).pid());
  std::map<int, Done> lines = DoneLines(c, id);
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& [rank, d] : lines) {
    EXPECT_EQ(d.steps, reference.steps) << "rank " << rank;
    EXPECT_EQ(d.fingerprint, reference.fingerprint) << "rank " << rank;
  }
  ExpectReferenceTrainLosses(c, id, reference);
}

TEST(LiveRecoveryTest, ALostNodeWithNoSpareFallsBackToARestartNamedInTheReason) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  const std::string id = Submit(c, Spec(c.dir(), "nospare", 2, /*max_restarts=*/1));
  auto running = c.WaitFor(id, SteppedPast(20));
  ASSERT_TRUE(running.ok()) << running.status();
  c.worker(2).Signal(SIGKILL);  // w3
  auto failed = c.WaitFor(id, [](const v1::Job& j) {
    return j.attempts_size() > 0 && j.attempts(0).state() == v1::FAILED;
  });
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_THAT(failed->attempts(0).reason(),
              HasSubstr("live recovery 1 failed: worker w3 lost: no heartbeat for "));
  EXPECT_THAT(failed->attempts(0).reason(), HasSubstr("no spare worker has room for its 1 rank(s)"));
  EXPECT_EQ(failed->recoveries(), 0) << "a recovery that never began is not counted";
  // The restart runs once a third node is back.
  ASSERT_TRUE(c.AddWorker("w4").ok());
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts(), 1);
}

// Each rank's "LIVE-RESULT rank R steps N params HASH" line (recovery_program).
std::map<int, Done> ProgramResults(LocalCluster& c, const std::string& id) {
  CtlResult logs = c.Ctl({"logs", id});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  std::map<int, Done> out;
  static const std::regex kLine(R"(LIVE-RESULT rank (\d+) steps (\d+) params ([0-9a-f]+))");
  for (auto it = std::sregex_iterator(logs.out.begin(), logs.out.end(), kLine);
       it != std::sregex_iterator(); ++it) {
    out[std::stoi((*it)[1])] = {std::stoll((*it)[2]), (*it)[3]};
  }
  return out;
}

// `notice_dir`: where each rank appends the step it was told to checkpoint at.
std::string ProgramSpec(const std::string& dir, const std::string& name, int max_recoveries,
                        const std::string& notice_dir = "") {
  const std::string path = absl::StrCat(dir, "/", name, ".yaml");
  testing::WriteFile(
      path, absl::StrCat("name: ", name, "\nnodes: 3\nmax_recoveries: ", max_recoveries,
                         "\ncommand: [", DDP_RECOVERY_PROGRAM, ", \"4000\"",
                         notice_dir.empty() ? "" : absl::StrCat(", \"", notice_dir, "\""),
                         "]\n"));
  return path;
}

TEST(LiveRecoveryTest, ALibddpProgramLosesARankAndEndsBitIdenticalToAnUninterruptedRun) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  const std::string ref_id = Submit(c, ProgramSpec(c.dir(), "program-reference", 0));
  auto ref = c.WaitFor(ref_id, Ended, absl::Minutes(5));
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->state(), v1::SUCCEEDED) << ref->reason();
  std::map<int, Done> reference = ProgramResults(c, ref_id);
  ASSERT_EQ(reference.size(), 3u);
  ASSERT_EQ(reference[0].steps, 4000);

  const std::string id = Submit(c, ProgramSpec(c.dir(), "program-live", 1));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    if (j.state() != v1::RUNNING || j.metrics_size() != 3) return false;
    for (const auto& m : j.metrics()) {
      if (m.global_step() < 400) return false;
    }
    return true;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  const v1::Attempt first = running->attempts(0);
  ASSERT_EQ(::kill(first.ranks(2).pid(), SIGKILL), 0);
  auto done = SucceededLive(c, id, 1);
  ASSERT_TRUE(done.ok()) << done.status();
  const v1::Attempt& a = done->attempts(0);
  ASSERT_EQ(a.recoveries_size(), 1);
  EXPECT_EQ(a.recoveries(0).outcome(), "recovered") << a.ShortDebugString();
  EXPECT_EQ(a.ranks(0).pid(), first.ranks(0).pid());
  EXPECT_EQ(a.ranks(1).pid(), first.ranks(1).pid());
  EXPECT_NE(a.ranks(2).pid(), first.ranks(2).pid());
  std::map<int, Done> results = ProgramResults(c, id);
  ASSERT_EQ(results.size(), 3u);
  for (const auto& [rank, d] : results) {
    EXPECT_EQ(d.steps, 4000) << "rank " << rank;
    EXPECT_EQ(d.fingerprint, reference[0].fingerprint) << "rank " << rank;
  }
}

// The preemption notice: a job whose periodic checkpoint is an epoch away, on 2 of 3
// workers. Once it has stepped well into its first epoch, `fault` takes one of its
// workers away with notice (a drain, a SIGTERM); the job checkpoints at once, moves to
// the spare worker, resumes there and SUCCEEDS. Returns the job's record.
std::string NoticeSpec(const std::string& dir) {
  const std::string path = dir + "/notice.yaml";
  testing::WriteFile(path, R"(name: notice
nodes: 2
max_restarts: 0
model: {mlp: {hidden: [256, 256]}}
data: {synthetic: {samples: 40000, features: 64, classes: 10}}
train: {epochs: 2, batch_size: 32, threads: 1}
metrics: {every_steps: 1}
checkpoint: {dir: "ckpt-{node}", every_epochs: 1}
)");
  return path;
}

struct Moved {
  v1::Job job;
  int64_t lost = -1;  // Steps trained in attempt 1 after the checkpoint attempt 2 resumed from.
};

Moved MoveWithNotice(LocalCluster& c, const std::function<void(const std::string& worker)>& fault) {
  Moved out;
  const std::string id = Submit(c, NoticeSpec(c.dir()));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    if (j.state() != v1::RUNNING || j.metrics_size() != 2) return false;
    for (const auto& m : j.metrics()) {
      if (m.global_step() < 100) return false;
    }
    return true;
  });
  EXPECT_TRUE(running.ok()) << running.status();
  if (!running.ok()) return out;
  EXPECT_LT(running->metrics(0).global_step(), running->metrics(0).steps() - 100)
      << "the epoch's checkpoint must be far away";
  fault(running->attempts(0).ranks(1).worker());
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  EXPECT_TRUE(done.ok()) << done.status();
  if (!done.ok()) return out;
  auto full = c.GetJob(id, /*history=*/true);
  EXPECT_TRUE(full.ok()) << full.status();
  if (!full.ok()) return out;
  out.job = *full;
  int64_t last_before = -1, first_after = -1;
  for (const v1::RankMetrics& m : full->history()) {
    if (m.attempt() == 1) last_before = std::max(last_before, m.global_step());
    if (m.attempt() == 2 && (first_after < 0 || m.global_step() < first_after)) {
      first_after = m.global_step();
    }
  }
  if (last_before >= 0 && first_after >= 0) out.lost = last_before + 1 - first_after;
  return out;
}

void ExpectMovedLosingAtMostOneStep(const Moved& m, const std::string& why) {
  const v1::Job& j = m.job;
  EXPECT_EQ(j.state(), v1::SUCCEEDED) << j.reason();
  ASSERT_EQ(j.attempts_size(), 2) << j.ShortDebugString();
  EXPECT_EQ(j.restarts(), 0) << "a move with notice is not a failure";
  EXPECT_TRUE(j.attempts(0).preempted()) << j.attempts(0).reason();
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr(why));
  EXPECT_THAT(j.attempts(0).reason(), HasSubstr("from the checkpoint of global step"));
  EXPECT_GE(m.lost, 0);
  EXPECT_LE(m.lost, 1) << "steps trained after the checkpoint the job resumed from";
}

TEST(PreemptionNoticeTest, ADrainCheckpointsAtOnceAndTheJobResumesElsewhereLosingAtMostOneStep) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  std::string drained;
  const Moved m = MoveWithNotice(c, [&](const std::string& worker) {
    drained = worker;
    CtlResult r = c.Ctl({"workers", "drain", worker});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  });
  ExpectMovedLosingAtMostOneStep(m, absl::StrCat("worker ", drained, " is draining"));
  for (const auto& r : m.job.attempts(1).ranks()) EXPECT_NE(r.worker(), drained);
}

TEST(PreemptionNoticeTest, ASigtermedWorkerCheckpointsItsJobAtOnceAndItResumesElsewhere) {
  auto cluster = LocalCluster::Start({.workers = 3});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(3).ok());
  std::string stopped;
  const Moved m = MoveWithNotice(c, [&](const std::string& worker) {
    stopped = worker;
    c.worker(worker[1] - '1').Signal(SIGTERM);
  });
  ExpectMovedLosingAtMostOneStep(m, absl::StrCat("worker ", stopped, " is stopping"));
  for (const auto& r : m.job.attempts(1).ranks()) EXPECT_NE(r.worker(), stopped);
}

TEST(PreemptionNoticeTest, ALibddpProgramIsAskedToCheckpointWhenItsWorkerDrains) {
  auto cluster = LocalCluster::Start({.workers = 4});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(4).ok());
  const std::string id = Submit(c, ProgramSpec(c.dir(), "program-notice", 0, c.dir()));
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 3 && j.metrics(0).global_step() >= 200;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string drained = running->attempts(0).ranks(1).worker();
  CtlResult r = c.Ctl({"workers", "drain", drained});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->attempts_size(), 2) << done->ShortDebugString();
  EXPECT_TRUE(done->attempts(0).preempted());
  EXPECT_THAT(done->attempts(0).reason(), HasSubstr(absl::StrCat("worker ", drained,
                                                                 " is draining")));
  // Every rank was told once, at the same step, the step rank 0 reported its checkpoint
  // at, and the job moved from it; each rank's own file says when it was told.
  std::map<int, std::string> told;
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream in(absl::StrCat(c.dir(), "/notice-rank", rank));
    told[rank] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(told[0].empty()) << "rank 0 was never told";
  for (const auto& [rank, steps] : told) EXPECT_EQ(steps, told[0]) << "rank " << rank;
  const int64_t at = std::atoll(told[0].c_str());
  EXPECT_EQ(told[0], absl::StrCat(at, "\n")) << "told more than once";
  EXPECT_GE(at, 200);
  EXPECT_THAT(done->attempts(0).reason(),
              HasSubstr(absl::StrCat("from the checkpoint of global step ", at)));
  // And every rank's line reached the job's log, although each was stopped soon after:
  // a rank prints it before the checkpoint's barrier, so before rank 0 reports the
  // checkpoint the job moves from (without that barrier a slow rank could be stopped
  // before it printed, which read as a lost line).
  CtlResult logs = c.Ctl({"logs", id});
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("NOTICE rank ", rank, " at step ", at)))
        << logs.out.substr(0, 4000);
  }
}

TEST(PreemptionNoticeTest, ACommandJobGetsItsNoticeSignalWithTheNoticeFileAndItsGrace) {
  auto cluster = LocalCluster::Start({.workers = 2});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_TRUE(c.WaitForWorkers(2).ok());
  const std::string path = c.dir() + "/signal.yaml";
  testing::WriteFile(path, R"(name: signal
nodes: 1
notice_signal: SIGUSR1
stop_grace_s: 2
command: [/bin/sh, -c, "trap 'echo GOT-USR1 $(cat $DDP_NOTICE_FILE) grace=$DDP_STOP_GRACE_S' USR1; echo NOTICE-BEFORE $(cat $DDP_NOTICE_FILE); while :; do sleep 0.1 & wait $!; done"]
)");
  const std::string id = Submit(c, path);
  auto running = c.WaitFor(id, [](const v1::Job& j) { return j.state() == v1::RUNNING; });
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string worker = running->attempts(0).ranks(0).worker();
  // Its first line is out: the trap is set.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  CtlResult logs;
  do {
    logs = c.Ctl({"logs", id});
  } while (logs.out.find("NOTICE-BEFORE") == std::string::npos && absl::Now() < deadline &&
           (absl::SleepFor(absl::Milliseconds(100)), true));
  EXPECT_THAT(logs.out, HasSubstr("NOTICE-BEFORE 0 0"));
  CtlResult r = c.Ctl({"workers", "drain", worker});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  do {
    logs = c.Ctl({"logs", id});
  } while (logs.out.find("GOT-USR1") == std::string::npos && absl::Now() < deadline &&
           (absl::SleepFor(absl::Milliseconds(100)), true));
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("GOT-USR1 1 0 worker ", worker,
                                               " is draining grace=2")));
  EXPECT_EQ(c.Ctl({"cancel", id}).exit_code, 0);
}

}  // namespace
}  // namespace ddp
