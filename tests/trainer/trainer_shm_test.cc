// Shared-memory collectives in real ddp-trainer processes: ranks of one node reduce
// through /dev/shm, multi-node jobs (simulated by GROUP_RANK / LOCAL_RANK on this
// machine) through the node leaders' Gloo group, every rank holds bit-identical
// parameters after every step, and a rank killed mid-collective fails its peers
// retryably without leaving a segment behind.
#include <signal.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/contract/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/trainer/trainer_harness.h"

namespace ddp {
namespace {

using testing::Event;
using testing::RankResult;
using ::testing::HasSubstr;

// Several buckets, gradient accumulation (no_sync) and a short last group.
constexpr char kJob[] = R"(name: shm
model: {mlp: {hidden: [96, 64, 32]}}
data: {synthetic: {samples: $SAMPLES, features: 24, classes: 5}, seed: 2}
rdzv: {timeout_s: 20}
train:
  epochs: $EPOCHS
  batch_size: 6
  grad_accum_steps: 2
  threads: 1
  bucket_cap_mb: 0.005
  first_bucket_cap_mb: 0.005
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
  intra_node_comm: $MODE
  collective_timeout_s: $TIMEOUT
metrics: {trace_buckets: true}
)";

std::string WriteJob(const std::string& dir, const std::string& mode, int samples = 800,
                     int epochs = 1, int timeout_s = 60) {
  testing::WriteFile(dir + "/job.yaml",
                     absl::StrReplaceAll(kJob, {{"$MODE", mode},
                                                {"$SAMPLES", absl::StrCat(samples)},
                                                {"$EPOCHS", absl::StrCat(epochs)},
                                                {"$TIMEOUT", absl::StrCat(timeout_s)}}));
  return dir + "/job.yaml";
}

// A job id of its own, so that its segments are told apart in /dev/shm.
std::string UniqueJobId(const std::string& name) {
  return absl::StrCat(name, "-", ::getpid(), "-", absl::ToUnixNanos(absl::Now()) % 1000000);
}

std::vector<std::string> SegmentsOf(const std::string& job_id) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (absl::StrContains(e.path().filename().string(), job_id)) found.push_back(e.path());
  }
  return found;
}

void ExpectAllSucceeded(const std::vector<RankResult>& results) {
  for (const RankResult& r : results) {
    EXPECT_TRUE(r.exit.ok()) << "rank " << r.rank << ": " << r.exit.ToString() << "\n"
                             << r.stderr_text;
  }
}

// global_step -> params_fingerprint, from a rank's trace events.
std::map<int, std::string> Fingerprints(const RankResult& r) {
  std::map<int, std::string> out;
  for (const Event& e : r.OfType("trace")) {
    out[static_cast<int>(e.Number("global_step"))] = e.String("params_fingerprint");
  }
  return out;
}

std::vector<double> Losses(const RankResult& r) {
  std::vector<double> out;
  for (const Event& e : r.OfType("step")) out.push_back(e.Number("loss"));
  return out;
}

void ExpectBitIdenticalAfterEveryStep(const std::vector<RankResult>& results) {
  ASSERT_FALSE(results.empty());
  const std::map<int, std::string> first = Fingerprints(results[0]);
  ASSERT_GT(first.size(), 10u);
  for (const RankResult& r : results) {
    EXPECT_EQ(Fingerprints(r), first) << "rank " << r.rank << " diverged from rank 0";
  }
}

TEST(TrainerShmTest, RanksOfOneNodeHoldBitIdenticalParametersAfterEveryStep) {
  const std::string dir = testing::MakeTempDir("shm-node");
  testing::TrainerLaunch launch = testing::LaunchOf(WriteJob(dir, "shm"), 3);
  launch.env["DDP_JOB_ID"] = UniqueJobId("shm-node");
  DDP_ASSERT_OK_AND_ASSIGN(auto results, testing::RunTrainers(launch));
  ExpectAllSucceeded(results);
  for (const RankResult& r : results) {
    ASSERT_EQ(r.OfType("start").size(), 1u);
    EXPECT_EQ(r.OfType("start")[0].String("intra_node_comm"), "shm");
  }
  ASSERT_GT(results[0].OfType("buckets")[0].fields.fields().at("buckets").list_value().values_size(),
            2);
  ExpectBitIdenticalAfterEveryStep(results);
  EXPECT_THAT(SegmentsOf(launch.env["DDP_JOB_ID"]), ::testing::IsEmpty());
}

TEST(TrainerShmTest, TwoNodesOfTwoRanksReduceThroughTheirLeaders) {
  // World 4 as 2 nodes x 2 local ranks: node reduce in shared memory, Gloo between
  // ranks 0 and 2, node broadcast. Same losses as Gloo among all four ranks.
  const std::string dir = testing::MakeTempDir("shm-hier");
  testing::TrainerLaunch launch = testing::LaunchOf(WriteJob(dir, "shm"), 4);
  launch.nproc_per_node = 2;
  launch.env["DDP_JOB_ID"] = UniqueJobId("shm-hier");
  DDP_ASSERT_OK_AND_ASSIGN(auto hierarchical, testing::RunTrainers(launch));
  ExpectAllSucceeded(hierarchical);
  for (const RankResult& r : hierarchical) {
    auto start = r.OfType("start");
    ASSERT_EQ(start.size(), 1u);
    EXPECT_EQ(start[0].String("intra_node_comm"), "shm");
    EXPECT_EQ(start[0].Number("group_rank"), r.rank / 2);
    EXPECT_EQ(start[0].Number("local_rank"), r.rank % 2);
  }
  ExpectBitIdenticalAfterEveryStep(hierarchical);
  EXPECT_THAT(SegmentsOf(launch.env["DDP_JOB_ID"]), ::testing::IsEmpty());

  const std::string gloo_dir = testing::MakeTempDir("shm-hier-gloo");
  testing::TrainerLaunch flat = testing::LaunchOf(WriteJob(gloo_dir, "gloo"), 4);
  flat.nproc_per_node = 2;
  DDP_ASSERT_OK_AND_ASSIGN(auto gloo, testing::RunTrainers(flat));
  ExpectAllSucceeded(gloo);
  EXPECT_EQ(gloo[0].OfType("start")[0].String("intra_node_comm"), "gloo");
  for (int rank = 0; rank < 4; ++rank) {
    // Another summation order (Gloo's ring over four ranks): equal up to rounding.
    const std::vector<double> a = Losses(hierarchical[rank]), b = Losses(gloo[rank]);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << "rank " << rank;
  }
}

// Runs a long job, SIGKILLs `victim` once it reported step 20, and checks that every
// other rank exits 1 (retryable) on its own, naming what failed, and that no segment
// of the job is left in /dev/shm.
void KillDuringTraining(int world, int per_node, int victim, const std::string& expected) {
  const std::string dir = testing::MakeTempDir("shm-kill");
  testing::TrainerLaunch launch =
      testing::LaunchOf(WriteJob(dir, "shm", /*samples=*/100000, /*epochs=*/5), world);
  launch.nproc_per_node = per_node;
  launch.env["DDP_JOB_ID"] = UniqueJobId("shm-kill");
  DDP_ASSERT_OK_AND_ASSIGN(auto group, testing::TrainerGroup::Start(launch));
  testing::TrainerGroup* g = group.get();
  auto results = group->Wait([&](int rank, const Event& e) {
    if (rank == victim && e.type() == "step" && e.Number("global_step") == 20) g->Kill(victim);
    return false;
  });
  ASSERT_EQ(static_cast<int>(results.size()), world);
  EXPECT_EQ(results[victim].exit.signal, SIGKILL);
  for (const RankResult& r : results) {
    if (r.rank == victim) continue;
    // Exited by itself (the harness would SIGKILL it after 5 minutes), retryably.
    EXPECT_EQ(r.exit.exit_code, kExitRetryable) << "rank " << r.rank << ": " << r.exit.ToString();
    auto errors = r.OfType("error");
    ASSERT_EQ(errors.size(), 1u) << r.stderr_text;
    EXPECT_TRUE(errors[0].fields.fields().at("retryable").bool_value());
    if (r.rank / per_node == victim / per_node) {  // The victim's own node sees it die.
      EXPECT_THAT(errors[0].String("message"), HasSubstr(expected)) << "rank " << r.rank;
    }
  }
  EXPECT_THAT(SegmentsOf(launch.env["DDP_JOB_ID"]), ::testing::IsEmpty());
}

TEST(TrainerShmTest, ARankKilledDuringSharedMemoryAllReducesFailsItsPeersRetryably) {
  KillDuringTraining(/*world=*/2, /*per_node=*/2, /*victim=*/1, "local rank 1");
}

TEST(TrainerShmTest, AKilledNodeLeaderFailsEveryNodeRetryably) {
  // Rank 2 leads node 1: its local peer sees it die in shared memory, node 0's leader
  // sees the leaders' Gloo connection break, and node 0's other rank hears of it
  // through the group abort or its leader's exit.
  KillDuringTraining(/*world=*/4, /*per_node=*/2, /*victim=*/2, "local rank 0");
}

TEST(TrainerShmTest, AHungRankFailsItsPeersAtTheCollectiveTimeout) {
  const std::string dir = testing::MakeTempDir("shm-hang");
  testing::TrainerLaunch launch = testing::LaunchOf(
      WriteJob(dir, "shm", /*samples=*/100000, /*epochs=*/5, /*timeout_s=*/25), 2);
  launch.env["DDP_JOB_ID"] = UniqueJobId("shm-hang");
  DDP_ASSERT_OK_AND_ASSIGN(auto group, testing::TrainerGroup::Start(launch));
  testing::TrainerGroup* g = group.get();
  auto results = group->Wait([&](int rank, const Event& e) {
    if (rank == 1 && e.type() == "step" && e.Number("global_step") == 10) {
      g->Signal(1, SIGSTOP);  // Alive, but never reaches its next all-reduce.
    }
    if (rank == 0 && e.type() == "error") g->Kill(1);
    return false;
  });
  EXPECT_EQ(results[0].exit.exit_code, kExitRetryable) << results[0].exit.ToString();
  auto errors = results[0].OfType("error");
  ASSERT_EQ(errors.size(), 1u) << results[0].stderr_text;
  EXPECT_THAT(errors[0].String("message"), HasSubstr("timed out after train.collective_timeout_s"));
  EXPECT_THAT(SegmentsOf(launch.env["DDP_JOB_ID"]), ::testing::IsEmpty());
}

}  // namespace
}  // namespace ddp
