// Faults a real cluster must ride out: a coordinator process, ddp-worker processes
// and trainers (the real ddp-trainer on Gloo, or a test trainer script given to the
// workers with --trainer) over loopback, faults injected by data and signals.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;
using ::testing::HasSubstr;

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

std::string SubmitOk(LocalCluster& c, const std::string& spec) {
  CtlResult r = c.Ctl({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::string(absl::StripAsciiWhitespace(r.out));
}

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

// Every worker the coordinator knows, with whether it is alive.
std::map<std::string, bool> Workers(LocalCluster& c) {
  CtlResult r = c.Ctl({"workers", "-o", "json"});
  std::map<std::string, bool> out;
  v1::ListWorkersResponse resp;
  if (r.exit_code != 0 || !google::protobuf::util::JsonStringToMessage(r.out, &resp).ok()) {
    ADD_FAILURE() << "ddpctl workers failed: " << r.err;
    return out;
  }
  for (const auto& w : resp.workers()) out[w.name()] = w.alive();
  return out;
}

// breast_cancer.csv with its first line replaced by a header whose first name has a
// Latin-1 byte ("r\xe9dius"), as a spreadsheet exported in Latin-1 writes it.
std::string Latin1HeaderCsv(const std::string& dir) {
  std::ifstream in(testing::SourceDir() + "/data/breast_cancer.csv");
  std::stringstream all;
  all << in.rdbuf();
  std::string body = all.str();
  body = body.substr(body.find('\n') + 1);
  std::string header = "r\xE9" "dius";
  for (int i = 1; i < 30; ++i) absl::StrAppend(&header, ",f", i);
  absl::StrAppend(&header, ",diagnosis\n");
  const std::string path = dir + "/latin1.csv";
  testing::WriteFile(path, header + body);
  return path;
}

TEST(PoisonTest, ALatin1ByteInACsvHeaderFailsTheJobOnItsDataAndEveryWorkerStaysAlive) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string csv = Latin1HeaderCsv(c.dir());
  const std::string spec = c.dir() + "/latin1.yaml";
  testing::WriteFile(spec, absl::StrCat(R"(name: latin1
nodes: 2
max_restarts: 2
model: {mlp: {hidden: [16]}}
data: {csv: {path: )", csv, R"(, label_column: -1}}
train: {epochs: 1, batch_size: 8}
)"));
  const std::string id = SubmitOk(c, spec);
  auto job = c.WaitFor(id, Ended);
  ASSERT_TRUE(job.ok()) << job.status();
  // Bad data is permanent: FAILED at once, no restart, and the reason is the data's.
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->restarts(), 0);
  EXPECT_THAT(job->reason(), HasSubstr("(permanent error)"));
  EXPECT_THAT(job->reason(), HasSubstr(absl::StrCat(csv, ":1: column 1 is not a number: 'r",
                                                    kReplacement, "dius'")));
  // The agents' batches carrying that line went through, so nobody was lost...
  for (const auto& [name, alive] : Workers(c)) EXPECT_TRUE(alive) << name;
  CtlResult logs = c.Ctl({"logs", id});
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("'r", kReplacement, "dius'")));
  // ...and both still work: the next job runs on them to the end.
  const std::string good = c.dir() + "/good.yaml";
  testing::WriteFile(good, R"(name: good
nodes: 2
model: {mlp: {hidden: [16]}}
data: {synthetic: {samples: 256, features: 8, classes: 2}}
train: {epochs: 1, batch_size: 16}
)");
  auto next = c.WaitFor(SubmitOk(c, good), Ended);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->state(), v1::SUCCEEDED) << next->reason();
}

TEST(PoisonTest, ATrainerPrintingInvalidUtf8AndTenMegabyteLinesDoesNotDisturbItsWorker) {
  // For five seconds (more than twice the cluster's 2 s heartbeat timeout) every rank
  // prints 10 MB lines, Latin-1 bytes on stdout and stderr and an event with a torn
  // character, then exits 0.
  const std::string dir = testing::MakeTempDir("flood");
  const std::string trainer = dir + "/flooding-trainer.sh";
  testing::WriteFile(trainer, R"sh(#!/bin/sh
printf '{"type":"start","rank":%s,"model":"caf\351 \342\202"}\n' "$RANK" >&3
end=$(( $(date +%s) + 5 ))
while [ "$(date +%s)" -lt "$end" ]; do
  head -c 10000000 /dev/zero | tr '\0' x
  echo
  printf 'caf\351 on stdout\n'
  printf 'caf\351 on stderr\n' >&2
done
echo finished
)sh");
  ::chmod(trainer.c_str(), 0755);
  auto cluster = LocalCluster::Start({.trainer = trainer});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.dir() + "/flood.yaml";
  testing::WriteFile(spec, R"(name: flood
nodes: 2
max_restarts: 3
model: {mlp: {}}
data: {synthetic: {}}
train: {batch_size: 8}
)");
  const std::string id = SubmitOk(c, spec);
  auto job = c.WaitFor(id, Ended);
  ASSERT_TRUE(job.ok()) << job.status();
  // A worker declared lost would have failed the attempt and started another.
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  EXPECT_EQ(job->attempts_size(), 1) << job->reason();
  for (const auto& [name, alive] : Workers(c)) EXPECT_TRUE(alive) << name;
  CtlResult logs = c.Ctl({"logs", id, "--rank", "1"});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("caf", kReplacement, " on stdout")));
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("caf", kReplacement, " on stderr")));
  EXPECT_THAT(logs.out, HasSubstr(absl::StrCat(" [ddp-worker: line cut, ",
                                               10000000 - (16 << 10), " more bytes]")));
  EXPECT_THAT(logs.out, HasSubstr("finished"));
}

TEST(WorkerHealthTest, AWorkerIsNotServingWhileItCannotReachTheCoordinator) {
  auto cluster = LocalCluster::Start({.workers = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_THAT(c.WaitForWorkerHealth(0, /*serving=*/true), testing::IsOk());
  EXPECT_EQ(c.StopCoordinator(SIGKILL).signal, SIGKILL);
  EXPECT_THAT(c.WaitForWorkerHealth(0, /*serving=*/false), testing::IsOk());
  ASSERT_TRUE(c.StartCoordinator().ok());
  EXPECT_THAT(c.WaitForWorkerHealth(0, /*serving=*/true), testing::IsOk());
}

TEST(CoordinatorOutageTest, AJobRidesOutA45SecondCoordinatorOutageOnItsFirstAttempt) {
  // A restarted coordinator gives the workers it recovered one heartbeat timeout to
  // check in; the agents must be back within ReconnectBound() (2 s + 1 s + 100 ms
  // here), not after gRPC's default reconnect backoff of up to 120 s.
  auto cluster = LocalCluster::Start({.heartbeat_timeout = absl::Seconds(5)});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.dir() + "/outage.yaml";
  testing::WriteFile(spec, R"(name: outage
nodes: 2
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: 40, batch_size: 32, threads: 1}
metrics: {every_steps: 20}
)");
  const std::string id = SubmitOk(c, spec);
  ASSERT_TRUE(c.WaitFor(id, [](const v1::Job& j) {
                 return j.state() == v1::RUNNING && j.metrics_size() == 2;
               }).ok());
  EXPECT_EQ(c.StopCoordinator(SIGKILL).signal, SIGKILL);
  absl::SleepFor(absl::Seconds(45));  // The outage itself, not a wait for anything.
  ASSERT_TRUE(c.StartCoordinator().ok());
  auto done = c.WaitFor(id, Ended, absl::Minutes(10));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->attempts_size(), 1) << done->reason();
  EXPECT_EQ(done->restarts(), 0);
  EXPECT_EQ(done->epoch_history_size(), 40) << "every epoch's summary arrived, once";
}

TEST(QuarantineTest, ANodeMissingTheJobsWorkdirIsQuarantinedAndTheJobSucceedsElsewhere) {
  // Three workers, each running in its own directory; the job's workdir is
  // /proc/self/cwd/job, which each agent (and each trainer it starts) resolves in its
  // own directory. w2 and w3 have job/, w1 does not: w1 is a node without the
  // job's workdir, and it comes first in the scheduler's name order.
  auto cluster = LocalCluster::Start({.workers = 3, .worker_cwd_own_dir = true});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  for (const char* w : {"w2", "w3"}) {
    ASSERT_EQ(::mkdir(absl::StrCat(c.dir(), "/", w, "/job").c_str(), 0755), 0);
  }
  const std::string spec = c.dir() + "/quarantine.yaml";
  testing::WriteFile(spec, R"(name: quarantine
nodes: 2
max_restarts: 2
workdir: /proc/self/cwd/job
model: {mlp: {hidden: [16]}}
data: {synthetic: {samples: 256, features: 8, classes: 2}}
train: {epochs: 1, batch_size: 16}
)");
  const std::string id = SubmitOk(c, spec);
  auto job = c.WaitFor(id, Ended);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->reason();
  ASSERT_EQ(job->attempts_size(), 2) << job->reason();
  EXPECT_THAT(job->attempts(0).reason(), HasSubstr("worker w1 could not start trainers"));
  EXPECT_THAT(job->attempts(0).reason(), HasSubstr("does not exist on this node"));
  std::set<std::string> nodes;
  for (const auto& r : job->attempts(1).ranks()) nodes.insert(r.worker());
  EXPECT_THAT(nodes, ::testing::ElementsAre("w2", "w3"));
  // The node is shown quarantined, with its reason; the others are not.
  CtlResult table = c.Ctl({"workers"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, ::testing::ContainsRegex("w1 +quarantined "));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("w2 +alive "));
  EXPECT_THAT(table.out, HasSubstr("w1 is quarantined for another "));
  EXPECT_THAT(table.out, HasSubstr("workdir /proc/self/cwd/job does not exist on this node"));
  for (const auto& [name, alive] : Workers(c)) EXPECT_TRUE(alive) << name;
}

TEST(StallTest, AStoppedTrainerIsNamedByTheWatchdogAndTheJobRestartsAndSucceeds) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.dir() + "/stall.yaml";
  testing::WriteFile(spec, R"(name: stall
nodes: 2
max_restarts: 2
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: 4, batch_size: 32, threads: 1, stall_timeout_s: 8}
metrics: {every_steps: 10}
)");
  const std::string id = SubmitOk(c, spec);
  auto running = c.WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->attempts_size(), 1);
  const v1::RankAssignment stalled = running->attempts(0).ranks(1);
  ASSERT_GT(stalled.pid(), 0);
  ASSERT_EQ(::kill(stalled.pid(), SIGSTOP), 0);
  // Whatever happens below, never leave a stopped process behind (the agent kills
  // it when the attempt fails; this is for a test that fails before that).
  struct Resume {
    int pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{stalled.pid()};
  auto failed = c.WaitFor(id, [](const v1::Job& j) {
    return j.attempts_size() > 0 && j.attempts(0).state() == v1::FAILED;
  });
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_THAT(failed->attempts(0).reason(),
              HasSubstr(absl::StrCat("rank 1 on ", stalled.worker(),
                                     " stalled: no progress for ")));
  EXPECT_THAT(failed->attempts(0).reason(), HasSubstr("train.stall_timeout_s"));
  EXPECT_THAT(failed->attempts(0).reason(), HasSubstr("its process is stopped"));
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->restarts(), 1);
  // The healthy rank's later exit (its collective never completed) did not take the
  // blame: the failed attempt still names the stalled rank.
  EXPECT_THAT(done->attempts(0).reason(), HasSubstr("rank 1 on "));
  // The stopped trainer was killed with SIGKILL (it could not have run a SIGTERM
  // handler; the agent sends SIGKILL at once to a stopped process).
  EXPECT_EQ(done->attempts(0).ranks(1).signal(), SIGKILL) << done->attempts(0).ShortDebugString();
}

// A job long enough to lose a node in the middle of, checkpointing as it goes.
std::string ElasticJob(const std::string& dir, const std::string& nodes) {
  const std::string spec = dir + "/elastic.yaml";
  testing::WriteFile(spec, absl::StrCat("name: elastic\nnodes: \"", nodes, R"("
max_restarts: 2
model: {mlp: {hidden: [128, 128]}}
data: {synthetic: {samples: 20000, features: 64, classes: 10}}
train: {epochs: 2, batch_size: 32, threads: 1}
metrics: {every_steps: 10}
checkpoint: {dir: "ckpt-{node}", every_steps: 50}
)"));
  return spec;
}

bool Stepped(const v1::Job& j) {
  return j.state() == v1::RUNNING && j.metrics_size() == 2 && j.metrics(0).global_step() > 60;
}

TEST(ElasticTest, AnElasticJobLosingANodeWithNoReplacementFinishesOnTheOneLeft) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string id = SubmitOk(c, ElasticJob(c.dir(), "1:2"));
  auto running = c.WaitFor(id, Stepped);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->attempts(0).world_size(), 2);
  c.worker(1).Signal(SIGKILL);  // w2's agent; its trainer dies with it.
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->attempts_size(), 2) << done->reason();
  // Failed by w1's rank (its collective broke when w2's trainer died) or by w2's
  // loss, whichever the coordinator heard of first; the restart gathers nodes for
  // rdzv.last_call_s and forms on w1 alone (w2's slot never frees: it is lost).
  EXPECT_EQ(done->attempts(0).state(), v1::FAILED);
  EXPECT_EQ(done->attempts(1).world_size(), 1);
  EXPECT_EQ(done->attempts(1).ranks(0).worker(), "w1");
  // Resumed mid-epoch at the smaller world (a checkpoint every 50 of the epoch's 313
  // steps): the rest of the epoch is sharded over it, not started again (decision 191).
  CtlResult logs = c.Ctl({"logs", id, "--rank", "0"});
  EXPECT_THAT(logs.out, HasSubstr("checkpoint was taken at world size 2, batch size 32 x 1"));
  EXPECT_THAT(logs.out, HasSubstr("samples left of epoch 0 (of 20000) are sharded over world "
                                  "size 1"));
}

TEST(ElasticTest, AFixedJobLosingANodeRunsAgainOnceAReplacementJoins) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string id = SubmitOk(c, ElasticJob(c.dir(), "2"));
  ASSERT_TRUE(c.WaitFor(id, Stepped).ok());
  c.worker(1).Signal(SIGKILL);
  // The job waits for a second node once w2 is declared lost...
  auto waiting = c.WaitFor(id, [](const v1::Job& j) {
    return j.attempts_size() == 1 && j.attempts(0).state() == v1::FAILED;
  });
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  // ...and runs again on w1 and the replacement, started later.
  ASSERT_TRUE(c.AddWorker("w3").ok());
  auto done = c.WaitFor(id, Ended, absl::Minutes(5));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ASSERT_EQ(done->attempts_size(), 2) << done->reason();
  std::set<std::string> second;
  for (const auto& r : done->attempts(1).ranks()) second.insert(r.worker());
  EXPECT_EQ(second, (std::set<std::string>{"w1", "w3"}));
}

}  // namespace
}  // namespace ddp
