// `ddpctl tensorboard` on a job that really trained: a coordinator and two worker
// processes run a two-rank job to the end; ddpctl exports it, and TensorBoard's own
// reader (PyPI's tensorboard, EventAccumulator: tests/client/read_tensorboard.py) reads
// it back against the history `ddpctl get -o json` shows. The coordinator also writes
// the job's run live (--tensorboard-dir): TensorBoard reads the same points there.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using testing::CtlResult;
using testing::LocalCluster;

std::pair<int, std::string> Run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = p ? pclose(p) : -1;
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// The run as TensorBoard reads it.
google::protobuf::Struct ReadRun(const std::string& run_dir) {
  const std::string python = DDP_TOOLS_PYTHON;
  EXPECT_TRUE(std::filesystem::exists(python))
      << python << " is missing: scripts/install_test_tools.sh installs TensorBoard there";
  auto [rc, out] = Run(absl::StrCat(python, " ", testing::SourceDir(),
                                    "/tests/client/read_tensorboard.py ", run_dir, " 2>&1"));
  EXPECT_EQ(rc, 0) << out;
  google::protobuf::Struct run;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(out, &run).ok()) << out;
  return run;
}

// (step, value) pairs of one tag, in file order.
std::vector<std::pair<int64_t, double>> Series(const google::protobuf::Struct& run,
                                               const std::string& kind, const std::string& tag) {
  std::vector<std::pair<int64_t, double>> out;
  const auto& tags = run.fields().at(kind).struct_value().fields();
  auto it = tags.find(tag);
  if (it == tags.end()) return out;
  for (const auto& point : it->second.list_value().values()) {
    const auto& p = point.list_value().values();
    out.emplace_back(static_cast<int64_t>(p[0].number_value()), p[1].number_value());
  }
  return out;
}

TEST(TensorboardExportTest, EveryRanksLossAtEveryStoredStepReadsBackInTensorBoard) {
  const std::string live = testing::MakeTempDir("tensorboard_live");
  auto cluster = LocalCluster::Start({.coordinator_flags = {"--tensorboard-dir", live}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.dir() + "/tb.yaml";
  testing::WriteFile(spec, R"(name: tb
nodes: 2
model: {mlp: {hidden: [16]}}
data: {synthetic: {samples: 1024, features: 8, classes: 2}, validation: {fraction: 0.25}}
train: {epochs: 3, batch_size: 32, optimizer: {name: adam, lr: 0.01}}
)");
  CtlResult submit = c.Ctl({"submit", spec, "--watch"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id(absl::StripAsciiWhitespace(submit.out.substr(0, submit.out.find('\n'))));

  CtlResult get = c.Ctl({"get", id, "--history", "-o", "json"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok());
  ASSERT_GT(job.history_size(), 20);
  ASSERT_EQ(job.epoch_history_size(), 3);

  const std::string logdir = c.dir() + "/runs";
  CtlResult exported = c.Ctl({"tensorboard", id, logdir});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_THAT(exported.out, HasSubstr(absl::StrCat(job.history_size(), " points of 2 rank(s)")));
  EXPECT_THAT(exported.out, HasSubstr("tensorboard --logdir " + logdir));
  // Exported again (as one refreshes a running job): replaced, not added to.
  ASSERT_EQ(c.Ctl({"tensorboard", id, logdir}).exit_code, 0);

  const google::protobuf::Struct run = ReadRun(logdir + "/" + id);
  // Every stored point of every rank, as float32 (TensorBoard's simple_value), at its
  // global step, in the stored order.
  std::map<int, std::vector<std::pair<int64_t, double>>> want_loss, want_rate;
  for (const v1::RankMetrics& m : job.history()) {
    want_loss[m.rank()].emplace_back(m.global_step(), static_cast<float>(m.loss()));
    want_rate[m.rank()].emplace_back(m.global_step(), static_cast<float>(m.samples_per_s()));
  }
  ASSERT_EQ(want_loss.size(), 2u);
  for (const auto& [rank, points] : want_loss) {
    EXPECT_EQ(Series(run, "scalars", absl::StrCat("loss/rank", rank)), points) << "rank " << rank;
    EXPECT_EQ(Series(run, "scalars", absl::StrCat("samples_per_s/rank", rank)), want_rate[rank]);
    EXPECT_EQ(Series(run, "scalars", absl::StrCat("step_time_ms/rank", rank)).size(),
              points.size());
    EXPECT_EQ(Series(run, "scalars", absl::StrCat("comm_time_ms/rank", rank)).size(),
              points.size());
  }
  std::vector<std::pair<int64_t, double>> want_val;
  for (const v1::EpochSummary& e : job.epoch_history()) {
    want_val.emplace_back(e.epoch(), static_cast<float>(e.val_loss()));
  }
  EXPECT_EQ(Series(run, "scalars", "epoch/val_loss"), want_val);
  EXPECT_EQ(Series(run, "scalars", "epoch/train_loss").size(), 3u);
  EXPECT_EQ(Series(run, "scalars", "epoch/val_accuracy").size(), 3u);
  // The attempt as text, at its number.
  const auto& texts = run.fields().at("texts").struct_value().fields();
  ASSERT_TRUE(texts.count("attempts")) << get.out;
  const auto& attempts = texts.at("attempts").list_value().values();
  ASSERT_EQ(attempts.size(), 1);
  EXPECT_EQ(attempts[0].list_value().values(0).number_value(), 1);
  EXPECT_THAT(attempts[0].list_value().values(1).string_value(),
              HasSubstr("attempt 1: SUCCEEDED, world size 2"));

  // Bad input: a job the coordinator does not know, a DIR that is a file.
  CtlResult unknown = c.Ctl({"tensorboard", "no-such-job", logdir});
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("no-such-job"));
  testing::WriteFile(c.dir() + "/a-file", "x");
  CtlResult onto_file = c.Ctl({"tensorboard", id, c.dir() + "/a-file"});
  EXPECT_NE(onto_file.exit_code, 0);
  EXPECT_THAT(onto_file.err, HasSubstr("a-file"));
  EXPECT_TRUE(std::filesystem::exists(logdir + "/" + id + "/events.out.tfevents.ddpctl"))
      << "the export before is still there";

  const std::string dir = c.dir();
  cluster->reset();  // Stops the workers and the coordinator (which writes what it queued).
  std::filesystem::remove_all(dir);

  // The coordinator's own run of the job, written as the points were stored: one file
  // of its own, holding what the export holds (same tags, steps, values, wall times;
  // the attempt's text once it ended).
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(live + "/" + id)) {
    files.push_back(entry.path().filename());
  }
  ASSERT_EQ(files.size(), 1u);
  EXPECT_THAT(files[0], ::testing::StartsWith("events.out.tfevents."));
  EXPECT_THAT(files[0], ::testing::EndsWith(".ddp-coordinator"));
  const google::protobuf::Struct live_run = ReadRun(live + "/" + id);
  std::string differences;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&differences);
  EXPECT_TRUE(differ.Compare(live_run, run)) << differences;
  for (const auto& [rank, points] : want_loss) {
    EXPECT_EQ(Series(live_run, "scalars", absl::StrCat("loss/rank", rank)), points);
  }
  std::filesystem::remove_all(live);
}

TEST(TensorboardExportTest, ACoordinatorRefusesATensorBoardDirItCannotWrite) {
  const std::string dir = testing::MakeTempDir("tensorboard_bad_dir");
  testing::WriteFile(dir + "/a-file", "x");
  // Run, not the test's own Run().
  auto [rc, out] = ddp::Run(absl::StrCat(testing::BinDir(),
                                         "/ddp-coordinator --listen 127.0.0.1:0 --state-dir ", dir,
                                         "/state --tensorboard-dir ", dir, "/a-file/runs 2>&1"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out, HasSubstr("--tensorboard-dir " + dir + "/a-file/runs"));
  EXPECT_EQ(testing::ReadFile(dir + "/a-file"), "x");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
