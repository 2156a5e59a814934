// What a job may touch on a node: paths against the allowed roots, and the
// environment trainers inherit.
#include "worker/agent/job_sandbox.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using ::ddp::testing::StatusIs;
using ::testing::HasSubstr;

class JobPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::canonical(testing::MakeTempDir("sandbox")).string();
    root_ = base_ + "/root";
    fs::create_directories(root_ + "/job");
    fs::create_symlink(base_, root_ + "/job/up");
    auto roots = CanonicalRoots({root_});
    ASSERT_TRUE(roots.ok());
    roots_ = *roots;
  }
  absl::Status Check(const std::string& csv, const std::string& checkpoint = "") {
    JobSpec spec;
    spec.data.kind = DataSpec::Kind::kCsv;
    spec.data.csv.path = csv;
    spec.checkpoint.dir = checkpoint;
    return CheckJobPaths(spec, root_ + "/job", "job-1", base_ + "/agent/job-1", roots_);
  }
  std::string base_, root_;
  std::vector<std::string> roots_;
};

TEST_F(JobPathsTest, PathsInsideTheRootsPassAndEscapesAreNamed) {
  EXPECT_TRUE(Check("data.csv", "ckpt/{job_id}").ok());
  EXPECT_TRUE(Check(root_ + "/other/x.csv").ok()) << "anywhere under the root";
  EXPECT_TRUE(Check("x.csv", base_ + "/agent/job-1/ckpt").ok()) << "the agent's dir for this job";
  EXPECT_THAT(Check("../../x.csv"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("data.csv.path: ../../x.csv resolves to " + base_ + "/x.csv")));
  EXPECT_THAT(Check("/etc/passwd"), StatusIs(absl::StatusCode::kPermissionDenied,
                                             HasSubstr("(--allow-root " + root_ + ")")));
  EXPECT_THAT(Check("up/secret.csv"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("up/secret.csv resolves to " + base_ + "/secret.csv")))
      << "a symlink out of the root";
  EXPECT_THAT(Check("x.csv", "new/../../../elsewhere"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("checkpoint.dir")))
      << "`..` through a directory that does not exist yet";
  EXPECT_THAT(Check("x.csv", base_ + "/agent/job-2"),
              StatusIs(absl::StatusCode::kPermissionDenied))
      << "another job's directory is not this job's";
  EXPECT_THAT(Check(root_ + "x/a.csv"), StatusIs(absl::StatusCode::kPermissionDenied))
      << "a sibling whose name starts like the root is not inside it";
}

TEST_F(JobPathsTest, TokenFilesAreCheckedLikeEveryDataPath) {
  JobSpec spec;
  spec.model.kind = ModelSpec::Kind::kGpt;
  spec.data.kind = DataSpec::Kind::kTokens;
  spec.data.tokens.path = "train.bin";
  spec.data.validation.has_tokens = true;
  spec.data.validation.tokens.path = "val.bin";
  EXPECT_TRUE(CheckJobPaths(spec, root_ + "/job", "job-1", "", roots_).ok());
  spec.data.tokens.path = "/etc/passwd";
  EXPECT_THAT(CheckJobPaths(spec, root_ + "/job", "job-1", "", roots_),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("data.tokens.path")));
  spec.data.tokens.path = "train.bin";
  spec.data.validation.tokens.path = "../../val.bin";
  EXPECT_THAT(CheckJobPaths(spec, root_ + "/job", "job-1", "", roots_),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("data.validation.tokens.path: ../../val.bin")));
}

TEST_F(JobPathsTest, NoRootsMeansNoRestriction) {
  JobSpec spec;
  spec.data.csv.path = "/etc/passwd";
  EXPECT_TRUE(CheckJobPaths(spec, "/", "j", "", {}).ok());
  EXPECT_THAT(CanonicalRoots({base_ + "/missing"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an existing directory")));
}

TEST(TrainerBaseEnvTest, PassesOnlyTheAllowlistAndWhatTheOperatorNames) {
  std::vector<std::string> vars = {"PATH=/usr/bin",   "HOME=/root",      "AWS_SECRET=x",
                                   "LC_ALL=C",        "NCCL_DEBUG=INFO", "MY_VAR=1",
                                   "MY_OTHER=2",      "SSH_AUTH_SOCK=/s"};
  std::vector<char*> env;
  for (auto& v : vars) env.push_back(v.data());
  env.push_back(nullptr);
  auto out = TrainerBaseEnv(env.data(), {"MY_*"});
  EXPECT_EQ(out.count("AWS_SECRET"), 0u);
  EXPECT_EQ(out.count("SSH_AUTH_SOCK"), 0u);
  EXPECT_EQ(out["PATH"], "/usr/bin");
  EXPECT_EQ(out["LC_ALL"], "C");
  EXPECT_EQ(out["NCCL_DEBUG"], "INFO");
  EXPECT_EQ(out["MY_VAR"], "1");
  EXPECT_EQ(out["MY_OTHER"], "2");
}

}  // namespace
}  // namespace ddp
