// The one launch path: which program a rank runs (the built-in trainer, or a command
// job's program resolved and checked against --allow-exec) and the environment it
// gets (torchrun's, exactly).
#include "worker/agent/launch_plan.h"

#include <sys/stat.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using ::ddp::testing::IsOkAndHolds;
using ::ddp::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class LaunchPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::canonical(testing::MakeTempDir("launch")).string();
    Executable(dir_ + "/bin/train");
    Executable(dir_ + "/work/scripts/run.sh");
    Executable(dir_ + "/bin-other/x");
    testing::WriteFile(dir_ + "/work/data.csv", "1,2\n");  // Not executable.
    fs::create_directories(dir_ + "/bin/subdir");
    fs::create_symlink(dir_ + "/bin/train", dir_ + "/work/train-link");
  }
  void Executable(const std::string& path) {
    testing::WriteFile(path, "#!/bin/sh\nexit 0\n");
    ::chmod(path.c_str(), 0755);
  }
  std::string dir_;
};

TEST_F(LaunchPlanTest, ANameIsLookedUpInThePathInOrder) {
  EXPECT_THAT(ResolveProgram("train", dir_ + "/work", "/nonexistent:" + dir_ + "/bin:/usr/bin"),
              IsOkAndHolds(dir_ + "/bin/train"));
  EXPECT_THAT(ResolveProgram("sh", dir_, "/usr/bin:/bin"), IsOkAndHolds("/usr/bin/sh"));
}

TEST_F(LaunchPlanTest, RelativePathsResolveAgainstTheWorkdir) {
  EXPECT_THAT(ResolveProgram("scripts/run.sh", dir_ + "/work", ""),
              IsOkAndHolds(dir_ + "/work/scripts/run.sh"));
  EXPECT_THAT(ResolveProgram("./scripts/../scripts/run.sh", dir_ + "/work", ""),
              IsOkAndHolds(dir_ + "/work/scripts/run.sh"));
  EXPECT_THAT(ResolveProgram(dir_ + "/bin/train", "/", ""), IsOkAndHolds(dir_ + "/bin/train"));
}

TEST_F(LaunchPlanTest, AMissingProgramNamesThePathSearched) {
  EXPECT_THAT(ResolveProgram("no-such-program", dir_, "/usr/bin:/bin"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("'no-such-program' is not in the worker's PATH "
                                       "(/usr/bin:/bin)"),
                             HasSubstr("give an absolute path"))));
  EXPECT_THAT(ResolveProgram("./missing.py", dir_ + "/work", "/usr/bin"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(dir_ + "/work/missing.py does not exist")));
}

TEST_F(LaunchPlanTest, NonExecutablesAndDirectoriesAreRefused) {
  EXPECT_THAT(ResolveProgram("./data.csv", dir_ + "/work", ""),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("is not an executable file")));
  EXPECT_THAT(ResolveProgram(dir_ + "/bin/subdir", "/", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
  // A directory of that name in the PATH is skipped, not run.
  EXPECT_THAT(ResolveProgram("subdir", "/", dir_ + "/bin"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not an executable file in")));
}

TEST_F(LaunchPlanTest, AllowExecAdmitsListedFilesAndDirectoriesOnly) {
  ExecPolicy policy;
  policy.allowed = {dir_ + "/bin", "/usr/bin/env"};
  EXPECT_THAT(CheckExecAllowed(dir_ + "/bin/train", policy, "w1"),
              IsOkAndHolds(dir_ + "/bin/train"));
  EXPECT_THAT(CheckExecAllowed("/usr/bin/env", policy, "w1"), IsOkAndHolds("/usr/bin/env"));
  // A symlink is admitted by where it leads, and that file is what runs: swapping the
  // link after the check changes nothing.
  EXPECT_THAT(CheckExecAllowed(dir_ + "/work/train-link", policy, "w1"),
              IsOkAndHolds(dir_ + "/bin/train"));
  // A prefix that is not a directory boundary admits nothing.
  EXPECT_THAT(CheckExecAllowed(dir_ + "/bin-other/x", policy, "w1"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("is not allowed on worker w1"),
                             HasSubstr("--allow-exec " + dir_ + "/bin-other/x"))));
  EXPECT_THAT(CheckExecAllowed(dir_ + "/work/scripts/run.sh", policy, "w1"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("--allow-exec")));
}

TEST_F(LaunchPlanTest, AnEmptyAllowListAdmitsNothingAndSaysWhichFlag) {
  EXPECT_THAT(CheckExecAllowed(dir_ + "/bin/train", ExecPolicy{}, "w2"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("worker w2 starts no programs of command jobs (no "
                                       "--allow-exec)"),
                             HasSubstr("ddp-worker --allow-exec " + dir_ + "/bin/train"))));
  ExecPolicy any;
  any.allow_all = true;
  EXPECT_THAT(CheckExecAllowed(dir_ + "/work/scripts/run.sh", any, "w2"),
              IsOkAndHolds(dir_ + "/work/scripts/run.sh"));
}

TEST_F(LaunchPlanTest, TheBuiltInTrainerIsTheCommandDdpTrainerSpec) {
  JobSpec spec;  // No command: the built-in trainer.
  LaunchOptions o;
  o.trainer_path = "/opt/ddp/bin/ddp-trainer";
  o.spec_path = "/var/ddp/job-1/attempt-2/job.yaml";
  DDP_ASSERT_OK_AND_ASSIGN(LaunchPlan plan, PlanLaunch(spec, o));
  EXPECT_FALSE(plan.command);
  EXPECT_EQ(plan.argv, (std::vector<std::string>{"/opt/ddp/bin/ddp-trainer", "--spec",
                                                 "/var/ddp/job-1/attempt-2/job.yaml"}));
}

TEST_F(LaunchPlanTest, ACommandRunsItsResolvedProgramWithItsArguments) {
  JobSpec spec;
  spec.command = {"train", "--epochs", "10"};
  LaunchOptions o;
  o.cwd = dir_ + "/work";
  o.path_var = dir_ + "/bin";
  o.worker = "w1";
  o.exec.allow_all = true;
  DDP_ASSERT_OK_AND_ASSIGN(LaunchPlan plan, PlanLaunch(spec, o));
  EXPECT_TRUE(plan.command);
  EXPECT_EQ(plan.argv, (std::vector<std::string>{dir_ + "/bin/train", "--epochs", "10"}));
  EXPECT_EQ(plan.executable, dir_ + "/bin/train");
  // Through a symlink under a restrictive policy: the link's target runs, under the
  // name the job gave.
  spec.command = {"./train-link"};
  o.exec.allowed = {dir_ + "/bin"};
  o.exec.allow_all = false;
  DDP_ASSERT_OK_AND_ASSIGN(plan, PlanLaunch(spec, o));
  EXPECT_EQ(plan.argv[0], dir_ + "/work/train-link");
  EXPECT_EQ(plan.executable, dir_ + "/bin/train");
  o.exec.allowed.clear();
  spec.command = {"train", "--epochs", "10"};
  o.exec.allow_all = false;
  EXPECT_THAT(PlanLaunch(spec, o), StatusIs(absl::StatusCode::kPermissionDenied,
                                            HasSubstr("--allow-exec")));
}

v1::Task TwoNodeTask() {
  v1::Task t;
  t.set_job_id("script-abcde");
  t.set_attempt(3);
  t.add_ranks(2);
  t.add_ranks(3);
  t.set_world_size(4);
  t.set_group_rank(1);
  t.set_group_world_size(2);
  t.set_master_addr("10.0.0.1");
  t.set_master_port(41234);
  t.set_restart_count(2);
  t.set_rdzv_id("my-run");
  (*t.mutable_env())["NCCL_DEBUG"] = "WARN";
  return t;
}

TEST_F(LaunchPlanTest, EveryRankGetsTorchrunsEnvironmentExactly) {
  JobSpec spec;
  spec.command = {"python3"};
  spec.max_restarts = 5;
  RankEnvOptions o;
  o.base_env = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/home/ddp"}};
  o.node = "w2";
  o.threads_per_rank = 4;
  const auto env = RankEnvironment(TwoNodeTask(), 1, spec, /*command=*/true, o);
  const std::map<std::string, std::string> expected = {
      {"PATH", "/usr/bin:/bin"},
      {"HOME", "/home/ddp"},
      {"NCCL_DEBUG", "WARN"},
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_RANK", "3"},
      {"ROLE_WORLD_SIZE", "4"},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "41234"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "5"},
      {"TORCHELASTIC_RUN_ID", "my-run"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"OMP_NUM_THREADS", "1"},
      {"DDP_EVENTS_FD", "3"},
      {"DDP_JOB_ID", "script-abcde"},
      {"DDP_ATTEMPT", "3"},
      {"DDP_NODE", "w2"},
  };
  EXPECT_EQ(env, expected);
}

TEST_F(LaunchPlanTest, TheJobChoosesItsThreadsAndPythonPathIsAppended) {
  JobSpec spec;
  spec.command = {"python3"};
  v1::Task task = TwoNodeTask();
  (*task.mutable_env())["OMP_NUM_THREADS"] = "8";
  (*task.mutable_env())["PYTHONPATH"] = "/home/u/lib";
  RankEnvOptions o;
  o.python_path = "/opt/ddp/share/ddp/python";
  auto env = RankEnvironment(task, 0, spec, /*command=*/true, o);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "8");
  EXPECT_EQ(env["PYTHONPATH"], "/home/u/lib:/opt/ddp/share/ddp/python");
  // The built-in trainer gets the node's cores per slot and no PYTHONPATH.
  task.mutable_env()->clear();
  o.threads_per_rank = 4;
  env = RankEnvironment(task, 0, JobSpec{}, /*command=*/false, o);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "4");
  EXPECT_EQ(env.count("PYTHONPATH"), 0u);
}

TEST_F(LaunchPlanTest, GlooListensOnTheAdvertisedInterfaceUnlessTheWorkerOrJobSaysElse) {
  JobSpec spec;
  spec.command = {"python3"};
  v1::Task task = TwoNodeTask();
  RankEnvOptions o;
  EXPECT_EQ(RankEnvironment(task, 0, spec, /*command=*/true, o).count("GLOO_SOCKET_IFNAME"), 0u);
  o.gloo_socket_ifname = "eth1";  // The interface of --advertise-addr.
  EXPECT_EQ(RankEnvironment(task, 0, spec, /*command=*/true, o)["GLOO_SOCKET_IFNAME"], "eth1");
  EXPECT_EQ(RankEnvironment(task, 0, JobSpec{}, /*command=*/false, o)["GLOO_SOCKET_IFNAME"],
            "eth1");
  o.base_env["GLOO_SOCKET_IFNAME"] = "bond0";  // The operator's, passed to ranks.
  EXPECT_EQ(RankEnvironment(task, 0, spec, /*command=*/true, o)["GLOO_SOCKET_IFNAME"], "bond0");
  (*task.mutable_env())["GLOO_SOCKET_IFNAME"] = "ib0";  // The job's own.
  EXPECT_EQ(RankEnvironment(task, 0, spec, /*command=*/true, o)["GLOO_SOCKET_IFNAME"], "ib0");
}

TEST_F(LaunchPlanTest, TheRunIdIsTheJobIdWithoutAnRdzvIdAndGpusAreTheWorkers) {
  v1::Task task = TwoNodeTask();
  task.clear_rdzv_id();
  task.add_gpu_uuids("GPU-a");
  task.add_gpu_uuids("GPU-b");
  (*task.mutable_env())["CUDA_VISIBLE_DEVICES"] = "0,1";  // Not the job's to choose.
  RankEnvOptions o;
  o.node_has_gpus = true;
  auto env = RankEnvironment(task, 1, JobSpec{}, /*command=*/true, o);
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "script-abcde");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-b");
  task.clear_gpu_uuids();
  env = RankEnvironment(task, 1, JobSpec{}, /*command=*/true, o);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "");
}

}  // namespace
}  // namespace ddp
