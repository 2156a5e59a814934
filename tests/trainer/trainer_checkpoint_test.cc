// Checkpoints that survive losing a node, and saves that a kill cannot corrupt: real
// ddp-trainer processes on Gloo, "nodes" told apart by DDP_NODE and {node} in
// checkpoint.dir (each node its own directory, as without shared storage).
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

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

// 455 training rows, batch 8, 2 ranks: 28 steps per epoch; a checkpoint every 5 steps.
// The learning rate follows a cosine schedule after a warm-up, and gradients are
// clipped, so a resume must also restore where the schedule stands.
constexpr char kJob[] = R"(name: ckpt-test
model: {mlp: {hidden: [32]}}
data:
  csv: {path: $SRC/data/breast_cancer.csv, skip_rows: 1, label_column: -1, standardize: true}
  validation: {fraction: 0.2}
train: {epochs: 2, batch_size: 8, drop_last: true, threads: 1, optimizer: {name: adam, lr: 0.01},
        clip_grad_norm: 0.5, lr_schedule: {name: cosine, warmup: 7}}
checkpoint: {dir: "ckpt/{node}", every_steps: 5, keep: $KEEP, resume: $RESUME, async: $ASYNC}
)";

std::string Job(const std::string& dir, int keep = 2, const std::string& resume = "true",
                bool async = true) {
  testing::WriteFile(dir + "/job.yaml",
                     absl::StrReplaceAll(kJob, {{"$SRC", testing::SourceDir()},
                                                {"$KEEP", absl::StrCat(keep)},
                                                {"$RESUME", resume},
                                                {"$ASYNC", async ? "true" : "false"}}));
  return dir + "/job.yaml";
}

// Two nodes of one rank each, named `a` and `b`.
testing::TrainerLaunch TwoNodes(const std::string& spec, const std::string& a,
                                const std::string& b) {
  testing::TrainerLaunch launch = testing::LaunchOf(spec, 2);
  launch.nproc_per_node = 1;
  launch.nodes = {a, b};
  return launch;
}

std::map<std::pair<int, int>, double> Losses(const RankResult& r) {
  std::map<std::pair<int, int>, double> out;
  for (const Event& e : r.OfType("step")) {
    out[{static_cast<int>(e.Number("epoch")), static_cast<int>(e.Number("step"))}] =
        e.Number("loss");
  }
  return out;
}

// Global steps of the complete checkpoints in `dir`, oldest first.
std::vector<int> Held(const std::string& dir) {
  std::vector<int> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "checkpoint-") && absl::EndsWith(name, ".pt")) {
      steps.push_back(std::stoi(name.substr(11, 10)));
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<std::string> Temporaries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StrContains(name, ".tmp.")) names.push_back(name);
  }
  return names;
}

// An uninterrupted run of kJob, computed once.
const std::vector<RankResult>& Reference() {
  static const auto* reference = [] {
    const std::string dir = testing::MakeTempDir("ckpt-reference");
    auto results = testing::RunTrainers(TwoNodes(Job(dir), "a", "b"));
    return new std::vector<RankResult>(results.ok() ? *results : std::vector<RankResult>());
  }();
  return *reference;
}

void ExpectAllSucceeded(const std::vector<RankResult>& results) {
  ASSERT_FALSE(results.empty());
  for (const RankResult& r : results) {
    EXPECT_TRUE(r.exit.ok()) << "rank " << r.rank << ": " << r.exit.ToString() << "\n"
                             << r.stderr_text;
  }
}

// The resumed run's start says it resumed at `global_step`, and every loss from there
// on equals the uninterrupted run's.
void ExpectResumedLikeTheReference(const std::vector<RankResult>& resumed, int global_step) {
  ExpectAllSucceeded(Reference());
  ExpectAllSucceeded(resumed);
  for (int rank = 0; rank < 2; ++rank) {
    auto start = resumed[rank].OfType("start");
    ASSERT_EQ(start.size(), 1u);
    ASSERT_TRUE(start[0].fields.fields().at("resumed_from").has_struct_value())
        << "rank " << rank << " started fresh";
    const auto& from = start[0].fields.fields().at("resumed_from").struct_value().fields();
    EXPECT_EQ(from.at("global_step").number_value(), global_step);
    auto expected = Losses(Reference()[rank]);
    auto got = Losses(resumed[rank]);
    ASSERT_EQ(got.size(), 56u - global_step) << "every step after the checkpoint, no more";
    for (const auto& [at, loss] : got) {
      EXPECT_NEAR(loss, expected.at(at), 1e-6) << "epoch " << at.first << " step " << at.second;
    }
    EXPECT_EQ(resumed[rank].OfType("done")[0].String("params_fingerprint"),
              Reference()[rank].OfType("done")[0].String("params_fingerprint"));
  }
}

TEST(TrainerCheckpointTest, ARestartWhoseRankZeroHasNoCheckpointResumesFromAnotherRanks) {
  const std::string dir = testing::MakeTempDir("ckpt-lost-node");
  const std::string spec = Job(dir);
  // Nodes a (rank 0) and b (rank 1) each keep the checkpoints in ckpt/<node>; killed
  // once rank 0 has saved step 15.
  DDP_ASSERT_OK_AND_ASSIGN(auto group, testing::TrainerGroup::Start(TwoNodes(spec, "a", "b")));
  group->Wait([](int rank, const Event& e) {
    return rank == 0 && e.type() == "checkpoint" && e.Number("global_step") == 15;
  });
  const std::vector<int> on_b = Held(dir + "/ckpt/b");
  ASSERT_FALSE(on_b.empty()) << "node b kept no checkpoint of its own";
  ASSERT_LT(on_b.back(), 28) << "killed too late to test a mid-epoch resume";
  // keep: 2, plus at most the one a writer had renamed into place but not yet pruned
  // for when the SIGKILL landed (save, then prune: a crash never leaves fewer than
  // `keep`). EachWriterKeepsItsLastKCheckpoints checks exactly `keep` after a clean run.
  EXPECT_LE(on_b.size(), 3u) << "checkpoint.keep: 2";

  // The restart lands rank 0 on node c, which has never seen this job (and b keeps
  // rank 1): it resumes from b's newest checkpoint, not from scratch.
  DDP_ASSERT_OK_AND_ASSIGN(auto resumed, testing::RunTrainers(TwoNodes(spec, "c", "b")));
  ExpectResumedLikeTheReference(resumed, on_b.back());
  EXPECT_THAT(resumed[0].stderr_text, HasSubstr("(held by rank 1)"));
  EXPECT_FALSE(Held(dir + "/ckpt/c").empty()) << "node c keeps the checkpoints it takes part in";
}

// Both nodes' writers stop halfway through the save of step 15 and every rank is
// killed there (SIGKILL): the restart resumes from step 10, and no torn file is read.
// checkpoint.async (the default): the save is the writer thread's, so training went
// on past step 15 meanwhile, up to step 20's save, which waits for it (one in flight).
// async: false: every rank stopped at step 15.
void KillDuringASave(bool async) {
  const std::string dir = testing::MakeTempDir(async ? "ckpt-torn-async" : "ckpt-torn");
  const std::string spec = Job(dir, 2, "true", async);
  testing::TrainerLaunch launch = TwoNodes(spec, "a", "b");
  launch.env["DDP_DEBUG_CHECKPOINT_STALL"] = "15";
  DDP_ASSERT_OK_AND_ASSIGN(auto group, testing::TrainerGroup::Start(launch));
  std::set<int> stalled;
  double last_step = -1;  // Rank 0's last step event's global step.
  auto done = [&] { return stalled.size() == 2 && (!async || last_step >= 19); };
  auto results = group->Wait(
      [&](int rank, const Event& e) {
        if (rank == 0 && e.type() == "step") last_step = e.Number("global_step");
        return done();
      },
      absl::Minutes(2),
      [&](int rank, const std::string& line) {
        if (absl::StrContains(line, "DDP_DEBUG_CHECKPOINT_STALL=15: stopped halfway")) {
          stalled.insert(rank);
        }
        return done();
      });
  ASSERT_EQ(stalled.size(), 2u);
  if (async) {
    EXPECT_EQ(last_step, 19) << "trained on while step 15 was being written, up to step 20's "
                                "save, which waits for it";
  } else {
    EXPECT_EQ(last_step, 14) << "a synchronous save stops training";
  }
  for (const RankResult& r : results) {
    for (const Event& e : r.OfType("checkpoint")) {
      EXPECT_LT(e.Number("global_step"), 15) << "the torn save was never reported";
      EXPECT_EQ(e.fields.fields().at("async").bool_value(), async);
      EXPECT_GT(e.Number("write_ms"), 0);
      EXPECT_GE(e.Number("snapshot_ms"), 0);
    }
  }
  for (const std::string node : {"a", "b"}) {
    EXPECT_EQ(Held(dir + "/ckpt/" + node), (std::vector<int>{5, 10}))
        << "nothing of step 15 is visible on " << node;
    EXPECT_EQ(Temporaries(dir + "/ckpt/" + node).size(), 1u) << "the torn temporary, hidden";
  }

  DDP_ASSERT_OK_AND_ASSIGN(auto resumed, testing::RunTrainers(TwoNodes(spec, "a", "b")));
  ExpectResumedLikeTheReference(resumed, 10);
  EXPECT_TRUE(Temporaries(dir + "/ckpt/a").empty()) << "each writer cleans up its own leftover";
  EXPECT_TRUE(Temporaries(dir + "/ckpt/b").empty());
}

TEST(TrainerCheckpointTest, AKillDuringABackgroundSaveLeavesThePreviousCheckpointToResumeFrom) {
  KillDuringASave(/*async=*/true);
}

TEST(TrainerCheckpointTest, AKillDuringASynchronousSaveLeavesThePreviousCheckpoint) {
  KillDuringASave(/*async=*/false);
}

TEST(TrainerCheckpointTest, AnotherJobsCheckpointIsRefusedUnlessForced) {
  const std::string dir = testing::MakeTempDir("ckpt-foreign-job");
  testing::TrainerLaunch first = TwoNodes(Job(dir), "a", "b");
  first.env["DDP_JOB_ID"] = "job-one";
  DDP_ASSERT_OK_AND_ASSIGN(auto done, testing::RunTrainers(first));
  ExpectAllSucceeded(done);

  testing::TrainerLaunch second = TwoNodes(Job(dir), "a", "b");
  second.env["DDP_JOB_ID"] = "job-two";
  DDP_ASSERT_OK_AND_ASSIGN(auto refused, testing::RunTrainers(second));
  for (const RankResult& r : refused) {
    EXPECT_EQ(r.exit.exit_code, kExitPermanent) << r.exit.ToString() << "\n" << r.stderr_text;
    ASSERT_EQ(r.OfType("error").size(), 1u) << r.stderr_text;
    EXPECT_THAT(r.OfType("error")[0].String("message"),
                HasSubstr("was written by job job-one (attempt 0), and this is job job-two: "
                          "refusing to resume another job's checkpoint"));
    EXPECT_TRUE(r.OfType("step").empty());
  }

  testing::TrainerLaunch forced = TwoNodes(Job(dir, 2, "force"), "a", "b");
  forced.env["DDP_JOB_ID"] = "job-two";
  DDP_ASSERT_OK_AND_ASSIGN(auto resumed, testing::RunTrainers(forced));
  ExpectAllSucceeded(resumed);
  EXPECT_TRUE(resumed[0].OfType("start")[0].fields.fields().at("resumed_from").has_struct_value());
}

TEST(TrainerCheckpointTest, EachWriterKeepsItsLastKCheckpoints) {
  const std::string dir = testing::MakeTempDir("ckpt-keep");
  DDP_ASSERT_OK_AND_ASSIGN(auto results, testing::RunTrainers(TwoNodes(Job(dir, 3), "a", "b")));
  ExpectAllSucceeded(results);
  // Saves at 5, 10, ..., 55 and the end of each epoch (28, 56): the last three stay,
  // on both nodes, and nothing else.
  EXPECT_EQ(Held(dir + "/ckpt/a"), (std::vector<int>{50, 55, 56}));
  EXPECT_EQ(Held(dir + "/ckpt/b"), (std::vector<int>{50, 55, 56}));
  EXPECT_TRUE(Temporaries(dir + "/ckpt/a").empty());
}

TEST(TrainerCheckpointTest, NodesSharingADirectoryWriteItOnce) {
  const std::string dir = testing::MakeTempDir("ckpt-shared");
  // checkpoint.dir without {node}: both nodes see the same directory.
  testing::WriteFile(dir + "/job.yaml",
                     absl::StrReplaceAll(kJob, {{"$SRC", testing::SourceDir()}, {"$KEEP", "2"},
                                                {"$RESUME", "true"}, {"$ASYNC", "true"},
                                                {"ckpt/{node}", "ckpt"}}));
  DDP_ASSERT_OK_AND_ASSIGN(auto results,
                           testing::RunTrainers(TwoNodes(dir + "/job.yaml", "a", "b")));
  ExpectAllSucceeded(results);
  EXPECT_THAT(results[0].stderr_text, ::testing::Not(HasSubstr("is shared with a lower node")));
  EXPECT_THAT(results[1].stderr_text, HasSubstr("is shared with a lower node"));
  EXPECT_THAT(results[1].stderr_text, ::testing::Not(HasSubstr("kept on this node")));
  EXPECT_EQ(Held(dir + "/ckpt"), (std::vector<int>{55, 56}));
}

TEST(TrainerCheckpointTest, AnAttemptGivenUpOnWritesNoCheckpointOverANewerOnes) {
  const std::string dir = testing::MakeTempDir("ckpt-fenced");
  // Node c ran an earlier attempt and is gone (cut off): its directory is fenced too.
  std::filesystem::create_directories(dir + "/ckpt/c");
  testing::TrainerLaunch newer = TwoNodes(Job(dir), "a", "b");
  newer.env["DDP_ATTEMPT"] = "2";
  DDP_ASSERT_OK_AND_ASSIGN(auto done, testing::RunTrainers(newer));
  ExpectAllSucceeded(done);
  for (const char* node : {"a", "b", "c"}) {
    EXPECT_EQ(testing::ReadFile(absl::StrCat(dir, "/ckpt/", node, "/.fence")), "2\n") << node;
  }
  const std::vector<int> held = Held(dir + "/ckpt/a");

  // A rank of attempt 1 still running somewhere writes nothing there.
  testing::TrainerLaunch stale = TwoNodes(Job(dir), "a", "b");
  stale.env["DDP_ATTEMPT"] = "1";
  DDP_ASSERT_OK_AND_ASSIGN(auto refused, testing::RunTrainers(stale));
  bool told = false;
  for (const RankResult& r : refused) {
    EXPECT_NE(r.exit.exit_code, 0) << r.exit.ToString();
    EXPECT_TRUE(r.OfType("step").empty()) << "refused before training";
    for (const Event& e : r.OfType("error")) {
      told |= absl::StrContains(e.String("message"),
                                "fenced: attempt 2 of this job now owns checkpoint directory");
    }
  }
  EXPECT_TRUE(told) << refused[0].stderr_text;
  EXPECT_EQ(Held(dir + "/ckpt/a"), held);
}

// Decision 191: 480 synthetic samples, batch 8, two epochs, a checkpoint every step.
constexpr char kElasticJob[] = R"(name: elastic-order
model: {mlp: {hidden: [16]}}
data: {synthetic: {samples: 480, features: 8, classes: 3}}
train: {epochs: 2, batch_size: 8, threads: 1, max_steps: $MAX}
metrics: {every_steps: 1}
checkpoint: {dir: "ckpt/{node}", every_steps: 1}
)";

// Each rank's DDP_SAMPLE_LOG lines, "attempt rank epoch step global_step id...":
// the ids trained on per epoch over every rank, and the (global step, rank) pairs.
struct SampleLog {
  std::map<int, std::vector<int64_t>> ids_by_epoch;
  std::map<int, std::set<int>> ranks_by_step;
  std::map<int, int> epoch_of_step;
};

SampleLog ReadSampleLog(const std::string& dir) {
  SampleLog log;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(testing::ReadFile(absl::StrCat(dir, "/samples.rank", rank, ".txt")));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      int attempt, r, epoch, step, global_step;
      fields >> attempt >> r >> epoch >> step >> global_step;
      EXPECT_EQ(r, rank) << line;
      EXPECT_TRUE(log.ranks_by_step[global_step].insert(r).second)
          << "rank " << r << " took global step " << global_step << " twice";
      log.epoch_of_step[global_step] = epoch;
      for (int64_t id; fields >> id;) log.ids_by_epoch[epoch].push_back(id);
    }
  }
  return log;
}

TEST(TrainerCheckpointTest, AnElasticRestartAtAnotherWorldSizeSeesEachSampleOfTheEpochOnce) {
  const std::string dir = testing::MakeTempDir("ckpt-elastic-order");
  const std::string samples = dir + "/samples";
  std::filesystem::create_directories(samples);
  auto launch = [&](int max_steps, std::vector<std::string> nodes) {
    testing::WriteFile(dir + "/job.yaml",
                       absl::StrReplaceAll(kElasticJob, {{"$MAX", absl::StrCat(max_steps)}}));
    testing::TrainerLaunch l = testing::LaunchOf(dir + "/job.yaml", static_cast<int>(nodes.size()));
    l.nproc_per_node = 1;
    l.nodes = std::move(nodes);
    l.env["DDP_SAMPLE_LOG"] = samples;
    return l;
  };
  // 3 nodes: 160 samples a rank, 20 steps an epoch; stopped after 5 steps (120 samples).
  DDP_ASSERT_OK_AND_ASSIGN(auto first, testing::RunTrainers(launch(5, {"a", "b", "c"})));
  ExpectAllSucceeded(first);
  // Node c is gone: 2 nodes take the other 360 (180 a rank) from global step 5, and
  // stop after 6 of those steps (96 samples; 216 of the epoch done).
  DDP_ASSERT_OK_AND_ASSIGN(auto second, testing::RunTrainers(launch(11, {"a", "b"})));
  ExpectAllSucceeded(second);
  EXPECT_EQ(second[0].OfType("start")[0].fields.fields().at("resumed_from").struct_value()
                .fields().at("global_step").number_value(), 5);
  EXPECT_THAT(second[0].stderr_text,
              HasSubstr("checkpoint was taken at world size 3, batch size 8 x 1: the 360 "
                        "samples left of epoch 0 (of 480) are sharded over world size 2"));
  // c is back: 3 nodes take the last 264 (88 a rank, 11 steps), then a whole epoch.
  DDP_ASSERT_OK_AND_ASSIGN(auto third, testing::RunTrainers(launch(1000, {"a", "b", "c"})));
  ExpectAllSucceeded(third);
  EXPECT_THAT(third[0].stderr_text,
              HasSubstr("checkpoint was taken at world size 2, batch size 8 x 1: the 264 "
                        "samples left of epoch 0 (of 480) are sharded over world size 3"));
  const std::vector<Event> steps = third[0].OfType("step");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front().Number("epoch"), 0);
  EXPECT_EQ(steps.front().Number("step"), 11);
  EXPECT_EQ(steps.front().Number("steps"), 22) << "5 + 6 + 11 steps in the interrupted epoch";
  EXPECT_EQ(third[0].OfType("done")[0].Number("global_step"), 42);

  const SampleLog log = ReadSampleLog(samples);
  std::vector<int64_t> every(480);
  std::iota(every.begin(), every.end(), 0);
  for (int epoch : {0, 1}) {
    std::vector<int64_t> ids = log.ids_by_epoch.at(epoch);
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(ids, every) << "epoch " << epoch << ": every sample exactly once";
  }
  // Steps 0-4 and 11-41 on three ranks, 5-10 on two; nothing taken twice.
  ASSERT_EQ(log.ranks_by_step.size(), 42u);
  for (const auto& [global_step, ranks] : log.ranks_by_step) {
    const size_t world = global_step >= 5 && global_step < 11 ? 2 : 3;
    EXPECT_EQ(ranks.size(), world) << "global step " << global_step;
    EXPECT_EQ(log.epoch_of_step.at(global_step), global_step < 22 ? 0 : 1) << global_step;
  }
}

}  // namespace
}  // namespace ddp
