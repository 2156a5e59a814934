// Command jobs on a real cluster: users' own torchrun-style programs (a real PyTorch
// DDP script on Debian's python3-torch, Gloo) run once per rank with torchrun's
// environment and failure semantics, report live through DDP_EVENTS_FD, and leave
// no process behind when they fail or are cancelled.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using testing::CtlResult;
using testing::LocalCluster;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, with python3-torch.

bool Ended(const v1::Job& j) {
  return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
}

std::string SubmitOk(LocalCluster& c, const std::string& spec) {
  CtlResult r = c.Ctl({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::string(absl::StripAsciiWhitespace(r.out));
}

// Every live process (zombies aside) started for `job_id`'s attempt `attempt`: the
// ranks and whatever they started (DataLoader workers), found by the environment
// they inherit.
std::set<int> ProcessesOf(const std::string& job_id, int attempt) {
  std::set<int> out;
  const std::string want_job = absl::StrCat("DDP_JOB_ID=", job_id);
  const std::string want_attempt = absl::StrCat("DDP_ATTEMPT=", attempt);
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::string env;
    {
      std::error_code ec;
      const std::string path = absl::StrCat("/proc/", pid, "/environ");
      if (!fs::exists(path, ec)) continue;
      env = testing::ReadFile(path);
    }
    bool job = false, att = false;
    for (absl::string_view var : absl::StrSplit(env, '\0')) {
      job = job || var == want_job;
      att = att || var == want_attempt;
    }
    if (!job || !att) continue;
    const std::string stat = testing::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') continue;
    out.insert(pid);
  }
  ::closedir(proc);
  return out;
}

// Polls until no process of the attempt is left (or `timeout`); returns what is left.
std::set<int> WaitUntilGone(const std::string& job_id, int attempt,
                            absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  std::set<int> left = ProcessesOf(job_id, attempt);
  while (!left.empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    left = ProcessesOf(job_id, attempt);
  }
  return left;
}

class CommandJobTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> worker_flags = {}) {
    LocalCluster::Options o;
    o.worker_flags = std::move(worker_flags);
    auto cluster = LocalCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  // The example script, staged outside the source tree beside the data it reads.
  void StageScript() {
    const fs::path example = fs::path(cluster_->dir()) / "examples" / "pytorch";
    fs::create_directories(example);
    fs::copy_file(fs::path(testing::SourceDir()) / "examples/pytorch/train.py",
                  example / "train.py");
    std::error_code ec;
    fs::create_directory_symlink(fs::path(testing::SourceDir()) / "data",
                                 fs::path(cluster_->dir()) / "data", ec);
    example_ = example.string();
  }
  // A job running the example script with `args` (after --data ...), on `python`.
  std::string ScriptJob(const std::string& name, int max_restarts, const std::string& args,
                        const std::string& python = kPython) {
    const std::string path = absl::StrCat(example_, "/", name, ".yaml");
    testing::WriteFile(path, absl::StrCat("name: ", name, "\nnodes: 2\nmax_restarts: ",
                                          max_restarts, "\ncommand: [", python,
                                          ", train.py, --data, ../../data/breast_cancer.csv, ",
                                          args, "]\n"));
    return path;
  }
  std::string Job(const std::string& name, const std::string& body) {
    const std::string path = absl::StrCat(cluster_->dir(), "/", name, ".yaml");
    testing::WriteFile(path, absl::StrCat("name: ", name, "\n", body));
    return path;
  }
  v1::Job Finish(const std::string& id) {
    auto done = cluster_->WaitFor(id, Ended);
    EXPECT_TRUE(done.ok()) << done.status();
    return done.ok() ? *done : v1::Job();
  }
  std::unique_ptr<LocalCluster> cluster_;
  std::string example_;
};

TEST_F(CommandJobTest, APyTorchDdpScriptTrainsWhileWatchShowsEveryRankLive) {
  Start();
  StageScript();
  const std::string id = SubmitOk(*cluster_, ScriptJob("script", 0, "--epochs, 6"));
  ASSERT_FALSE(id.empty());
  CtlResult watch = cluster_->Ctl({"watch", id});
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  EXPECT_THAT(watch.err, HasSubstr(absl::StrCat("job ", id, " SUCCEEDED")));
  // Both ranks' loss, reported by the script through ddp_report, at several epochs.
  testing::WatchLines seen = testing::ParseWatch(watch.out);
  for (const auto& [rank, lines] : seen.lines) {
    for (const std::string& line : lines) EXPECT_THAT(line, HasSubstr(" loss "));
  }
  EXPECT_GE(seen.epochs[0].size(), 3u) << watch.out;
  EXPECT_GE(seen.epochs[1].size(), 3u) << watch.out;

  auto job = cluster_->GetJob(id, /*history=*/true);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  std::set<int> ranks_with_loss;
  for (const v1::RankMetrics& m : job->history()) {
    if (m.loss() > 0) ranks_with_loss.insert(m.rank());
  }
  EXPECT_EQ(ranks_with_loss, (std::set<int>{0, 1}));
  ASSERT_FALSE(job->epoch_history().empty()) << "the script's epoch lines";
  EXPECT_GE(job->epoch_history().rbegin()->val_accuracy(), 0.9);

  CtlResult get = cluster_->Ctl({"get", id});
  EXPECT_THAT(get.out, HasSubstr("exit 0"));
  // Each rank's own output, in its own log.
  for (int rank : {0, 1}) {
    CtlResult logs = cluster_->Ctl({"logs", id, "--rank", std::to_string(rank)});
    EXPECT_EQ(logs.exit_code, 0) << logs.err;
    EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("rank ", rank, "/2")));
  }
}

// The same script on PyPI's PyTorch 2.11, the project's second flavour (docs/torch.md):
// torch 2.x's init_process_group and DDP on ddp's torchrun environment.
TEST_F(CommandJobTest, APyTorch2ScriptFromTheVenvTrainsToSuccess) {
  const std::string python = DDP_TORCH2_PYTHON;
  if (::access(python.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "no PyTorch 2.x venv at " << python
                 << ": scripts/install_torch2.sh makes it (scripts/run_tests.sh does)";
  }
  Start();
  StageScript();
  const std::string id = SubmitOk(*cluster_, ScriptJob("script2", 0, "--epochs, 4", python));
  ASSERT_FALSE(id.empty());
  const v1::Job job = Finish(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_FALSE(job.epoch_history().empty()) << "the script's epoch lines";
  EXPECT_GE(job.epoch_history().rbegin()->val_accuracy(), 0.9);
  for (int rank : {0, 1}) {
    CtlResult logs = cluster_->Ctl({"logs", id, "--rank", std::to_string(rank)});
    EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("rank ", rank, "/2 (local rank 0) on ")));
    EXPECT_THAT(logs.out, HasSubstr(", torch 2.11.0")) << "the venv's torch ran it";
  }
}

TEST_F(CommandJobTest, EveryRankGetsTorchrunsEnvironmentAndAProgramThatReportsNothingRuns) {
  Start();
  const std::string id = SubmitOk(
      *cluster_, Job("env", "nodes: 2\nmax_restarts: 1\nrdzv_id: env-run\n"
                            "env: {MY_SETTING: 'a b'}\ncommand: [/usr/bin/env]\n"));
  const v1::Job job = Finish(id);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  for (int rank : {0, 1}) {
    CtlResult logs = cluster_->Ctl({"logs", id, "--rank", std::to_string(rank)});
    std::map<std::string, std::string> env;
    for (absl::string_view var : absl::StrSplit(logs.out, '\n')) {
      // One rank's output: `env` prints NAME=value lines.
      const size_t eq = var.find('=');
      if (eq != absl::string_view::npos) {
        env[std::string(var.substr(0, eq))] = std::string(var.substr(eq + 1));
      }
    }
    const v1::RankAssignment& row = job.attempts(0).ranks(rank);
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], "0");
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "1");
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank));
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], "2");
    EXPECT_EQ(env["ROLE_NAME"], "default");
    EXPECT_EQ(env["MASTER_ADDR"], job.attempts(0).master_addr());
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(job.attempts(0).master_port()));
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "1");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "env-run");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
    EXPECT_EQ(env["DDP_EVENTS_FD"], "3");
    EXPECT_EQ(env["DDP_JOB_ID"], id);
    EXPECT_EQ(env["DDP_NODE"], row.worker());
    EXPECT_EQ(env["MY_SETTING"], "a b");
  }
}

TEST_F(CommandJobTest, AKilledRankFailsTheAttemptAndTheNextOneResumesFromTheCheckpoint) {
  Start();
  StageScript();
  const std::string id =
      SubmitOk(*cluster_, ScriptJob("resume", 2, "--epochs, 12, --step-sleep, '0.02'"));
  // Past the second epoch's checkpoint, with DataLoader workers running.
  auto mid = cluster_->WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && !j.epoch_history().empty() &&
           j.epoch_history().rbegin()->epoch() >= 1;
  });
  ASSERT_TRUE(mid.ok()) << mid.status();
  ASSERT_EQ(mid->state(), v1::RUNNING) << mid->reason();
  EXPECT_GT(ProcessesOf(id, 1).size(), 2u) << "the ranks and their DataLoader workers";
  const int victim = mid->attempts(0).ranks(1).pid();
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  // The attempt fails: rank 0 is stopped too, and nothing of attempt 1 survives.
  auto second = cluster_->WaitFor(id, [](const v1::Job& j) { return j.attempts_size() >= 2; });
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(second->attempts(0).reason(), HasSubstr("rank 1 on w2 was killed by SIGKILL"));
  EXPECT_THAT(WaitUntilGone(id, 1), ::testing::IsEmpty());

  const v1::Job job = Finish(id);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.restarts(), 1);
  CtlResult get = cluster_->Ctl({"get", id});
  EXPECT_THAT(get.out, HasSubstr("signal 9 (SIGKILL)"));
  CtlResult logs = cluster_->Ctl({"logs", id});
  EXPECT_THAT(logs.out, HasSubstr("(restart count 1)"));
  EXPECT_THAT(logs.out, HasSubstr("resumed from epoch"));
}

TEST_F(CommandJobTest, CancelStopsEveryProcessOfTheJobDataLoaderWorkersIncluded) {
  Start();
  StageScript();
  const std::string id =
      SubmitOk(*cluster_, ScriptJob("cancelled", 0, "--epochs, 200, --step-sleep, '0.05'"));
  auto running = cluster_->WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  EXPECT_GT(ProcessesOf(id, 1).size(), 2u) << "the ranks and their DataLoader workers";
  CtlResult cancel = cluster_->Ctl({"cancel", id});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_THAT(WaitUntilGone(id, 1), ::testing::IsEmpty());
  EXPECT_EQ(Finish(id).state(), v1::CANCELLED);
}

// kill -9 of ddp-worker: its ranks die with it (PR_SET_PDEATHSIG), but what a rank
// started lives on with PPID 1. The worker restarted under the same name and work dir
// finds their process groups in its ledger, ends what is left, and says so.
TEST_F(CommandJobTest, ARestartedWorkerEndsWhatItsKilledPredecessorsRanksLeftBehind) {
  Start();
  const std::string work_dir = cluster_->dir() + "/node-x";
  auto start_worker = [&]() -> std::unique_ptr<Subprocess> {
    auto health = ::ddp::testing::ClaimPort();
    EXPECT_TRUE(health.ok());
    SpawnOptions o;
    o.argv = {testing::BinDir() + "/ddp-worker", "--coordinator", cluster_->address(),
              "--name", "node-x", "--slots", "1", "--cpus", "1", "--work-dir", work_dir,
              "--label", "pool=x", "--health-listen", absl::StrCat("127.0.0.1:", *health)};
    o.capture_stderr = true;
    auto proc = Subprocess::Spawn(o);
    EXPECT_TRUE(proc.ok()) << proc.status();
    return proc.ok() ? std::move(*proc) : nullptr;
  };
  std::unique_ptr<Subprocess> worker = start_worker();
  ASSERT_NE(worker, nullptr);
  auto log = std::make_unique<testing::OutputCollector>(worker->ReleaseStderr());
  ASSERT_TRUE(cluster_->WaitForWorkers(3).ok());
  const std::string pid_file = cluster_->dir() + "/child.pid";
  const std::string id = SubmitOk(
      *cluster_, Job("orphans", absl::StrCat("nodes: 1\nmax_restarts: 0\n"
                                             "node_selector: {pool: x}\n"
                                             "command: [/bin/sh, -c, \"sleep 300 & echo $! > ",
                                             pid_file, ".tmp && mv ", pid_file, ".tmp ",
                                             pid_file, "; wait\"]\n")));
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!fs::exists(pid_file) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(fs::exists(pid_file)) << "the rank never started its child";
  int child = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(testing::ReadFile(pid_file)), &child));
  struct KillAtEnd {
    int pid;
    ~KillAtEnd() { ::kill(pid, SIGKILL); }
  } guard{child};
  // The shell's `mv` may not have been reaped yet when the pid file appears: wait for
  // the rank and its child alone.
  const absl::Time settled = absl::Now() + absl::Seconds(10);
  while (ProcessesOf(id, 1).size() != 2u && absl::Now() < settled) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ProcessesOf(id, 1).size(), 2u) << "the rank and its child";

  worker->Signal(SIGKILL);
  worker->Wait();
  log->Finish(absl::Seconds(10));
  // The rank died with its worker; its child did not (the defect this guards).
  const absl::Time rank_gone = absl::Now() + absl::Seconds(10);
  while (ProcessesOf(id, 1) != std::set<int>{child} && absl::Now() < rank_gone) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ProcessesOf(id, 1), std::set<int>{child});

  worker = start_worker();
  ASSERT_NE(worker, nullptr);
  log = std::make_unique<testing::OutputCollector>(worker->ReleaseStderr());
  EXPECT_TRUE(log->WaitFor(absl::StrCat("the previous incarnation of this worker left 1 "
                                        "process(es) of job ", id, " attempt 1 rank 0"),
                           absl::Seconds(30)))
      << log->text();
  EXPECT_THAT(WaitUntilGone(id, 1), ::testing::IsEmpty());
  EXPECT_THAT(log->text(), HasSubstr(absl::StrCat("pids ", child, ")")));
  worker->Signal(SIGTERM);
  worker->Wait();
}

TEST_F(CommandJobTest, BadCommandsAreRefusedWithTheirReasonAndHarmNothingElse) {
  const std::string allowed = testing::MakeTempDir("allowed");
  Start({"--allow-exec", "/bin/sh", "--allow-exec", allowed});
  // Refused at submit: both kinds, and an empty argv; nothing is queued.
  const std::string both = Job("both", "command: [/bin/sh]\nmodel: {mlp: {}}\n"
                                       "data: {synthetic: {}}\ntrain: {batch_size: 4}\n");
  CtlResult r = cluster_->Ctl({"submit", both});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("both.yaml:3: model: a job runs either its own program"));
  r = cluster_->Ctl({"submit", Job("empty", "command: []\n")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("command: must not be empty"));
  EXPECT_THAT(cluster_->Ctl({"list"}).out, Not(HasSubstr("both")));

  // A program outside --allow-exec, and one that is not there: the job fails at once,
  // without restarts, saying why.
  const std::string outside =
      SubmitOk(*cluster_, Job("outside", "nodes: 2\nmax_restarts: 3\ncommand: [/usr/bin/env]\n"));
  v1::Job job = Finish(outside);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("is not allowed on worker w"));
  EXPECT_THAT(job.reason(), HasSubstr("--allow-exec /usr/bin/env"));
  EXPECT_EQ(job.restarts(), 0);
  const std::string missing = SubmitOk(
      *cluster_, Job("missing", "nodes: 1\nmax_restarts: 3\ncommand: [no-such-program-xyz]\n"));
  job = Finish(missing);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("'no-such-program-xyz' is not in the worker's PATH"));

  // A file that cannot be executed (no #! line): the job's fault, not the node's.
  const std::string plain = allowed + "/no-shebang.sh";
  testing::WriteFile(plain, "echo hi\n");
  ::chmod(plain.c_str(), 0755);
  const std::string noexec = SubmitOk(
      *cluster_, Job("noexec", absl::StrCat("nodes: 1\nmax_restarts: 2\ncommand: [", plain, "]\n")));
  job = Finish(noexec);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("Exec format error"));
  EXPECT_EQ(job.restarts(), 0);

  // Garbage on the events descriptor: shown once in the log, counted, never fatal;
  // the good line after it is shown live.
  const std::string script = allowed + "/report.sh";
  testing::WriteFile(script,
                     "#!/bin/sh\n"
                     "echo 'this is not json' >&3\n"
                     "echo '{\"type\": \"step\", \"loss\": 0.5, \"epoch\": 0, \"step\": 0}' >&3\n"
                     "echo '{\"type\": \"nonsense\"}' >&3\n"
                     "echo \"hello from rank $RANK\"\n");
  ::chmod(script.c_str(), 0755);
  const std::string garbage = SubmitOk(
      *cluster_, Job("garbage", absl::StrCat("nodes: 2\ncommand: [", script, "]\n")));
  job = Finish(garbage);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.metrics_size(), 2);
  EXPECT_DOUBLE_EQ(job.metrics(0).loss(), 0.5);
  EXPECT_DOUBLE_EQ(job.metrics(1).loss(), 0.5);
  CtlResult logs = cluster_->Ctl({"logs", garbage, "--rank", "1"});
  EXPECT_THAT(logs.out, HasSubstr("hello from rank 1"));
  EXPECT_THAT(logs.out, HasSubstr("is not an event (not a JSON object"));
  EXPECT_THAT(logs.out, HasSubstr("2 lines on DDP_EVENTS_FD in all were not events"));

  // A program's own exit code 3 is a failure worth a restart, not a node fault: the
  // workers stay in service.
  const std::string three = SubmitOk(
      *cluster_, Job("three", "nodes: 1\nmax_restarts: 1\ncommand: [/bin/sh, -c, 'exit 3']\n"));
  job = Finish(three);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.attempts_size(), 2);
  EXPECT_THAT(job.reason(), HasSubstr("exited with code 3"));
  EXPECT_THAT(cluster_->Ctl({"get", three}).out, HasSubstr("exit 3"));
  CtlResult workers = cluster_->Ctl({"workers"});
  EXPECT_THAT(workers.out, Not(HasSubstr("quarantined")));
}

TEST_F(CommandJobTest, TwoRanksOnOneNodeFormTheirGroupThroughTheEnvironment) {
  LocalCluster::Options o;
  o.workers = 1;
  o.slots = 2;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);
  StageScript();
  const std::string path = absl::StrCat(example_, "/local.yaml");
  testing::WriteFile(path, absl::StrCat("name: local\nnodes: 1\nnproc_per_node: 2\ncommand: [",
                                        kPython, ", train.py, --data, ../../data/breast_cancer.csv, "
                                        "--epochs, '3']\n"));
  const v1::Job job = Finish(SubmitOk(*cluster_, path));
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.attempts(0).ranks_size(), 2);
  EXPECT_EQ(job.attempts(0).ranks(1).local_rank(), 1);
  CtlResult logs = cluster_->Ctl({"logs", job.id(), "--rank", "1"});
  EXPECT_THAT(logs.out, HasSubstr("rank 1/2 (local rank 1)"));
}

TEST_F(CommandJobTest, ADrainMovesAProgramAfterItsNextCheckpointLineWithoutARestart) {
  LocalCluster::Options o;
  o.workers = 3;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);
  StageScript();
  const std::string id = SubmitOk(*cluster_, ScriptJob("moved", 0, "--epochs, 30, --step-sleep, '0.02'"));
  auto running = cluster_->WaitFor(id, [](const v1::Job& j) {
    return j.state() == v1::RUNNING && j.metrics_size() == 2;
  });
  ASSERT_TRUE(running.ok()) << running.status();
  const std::string victim = running->attempts(0).ranks(1).worker();
  CtlResult r = cluster_->Ctl({"workers", "drain", victim});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::Job job = Finish(id);
  EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.restarts(), 0) << "a move spends no restart (max_restarts: 0)";
  ASSERT_GE(job.attempts_size(), 2);
  EXPECT_THAT(job.attempts(0).reason(), HasSubstr("is draining: moving to other workers"));
  for (const v1::RankAssignment& rank : job.attempts(1).ranks()) {
    EXPECT_NE(rank.worker(), victim);
  }
  // The program resumed from its own checkpoint, and was told no restart happened.
  CtlResult logs = cluster_->Ctl({"logs", id});
  EXPECT_THAT(logs.out, HasSubstr("(restart count 0), continuing with epoch"));
}

TEST_F(CommandJobTest, OnlyAdminsSubmitCommandJobsWhenTheCoordinatorSaysSo) {
  LocalCluster::Options o;
  o.secure = true;
  o.coordinator_flags = {"--command-jobs", "admins"};
  o.worker_flags = {"--allow-exec", "/bin/sh"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster_ = std::move(*cluster);
  const std::string spec = Job("by-role", "nodes: 1\ncommand: [/bin/sh, -c, 'exit 0']\n");
  CtlResult user = cluster_->CtlAs("user", {"submit", spec});
  EXPECT_NE(user.exit_code, 0);
  EXPECT_THAT(user.err, HasSubstr("only role admin may submit a job that runs its own program"));
  CtlResult admin = cluster_->CtlAs("admin", {"submit", spec});
  ASSERT_EQ(admin.exit_code, 0) << admin.err;
  const std::string id(absl::StripAsciiWhitespace(admin.out));
  EXPECT_EQ(Finish(id).state(), v1::SUCCEEDED);
}

}  // namespace
}  // namespace ddp
