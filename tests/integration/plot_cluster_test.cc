// `ddpctl plot` on a job that really trained: a coordinator and two worker processes
// run a two-rank job to the end; ddpctl writes an SVG and a PNG, which an independent
// checker (tests/client/check_plot.py) reads back against the job's stored history.
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/plot/drawing.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/local_cluster.h"

namespace ddp {
namespace {

using testing::CtlResult;
using testing::LocalCluster;

std::string Checker() {
  return absl::StrCat(DDP_PYTHON3, " ", testing::SourceDir(), "/tests/client/check_plot.py");
}

TEST(PlotClusterTest, PlotsAFinishedTwoRankJobAsSvgAndPng) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string spec = c.dir() + "/plot.yaml";
  testing::WriteFile(spec, R"(name: plot
nodes: 2
model: {mlp: {hidden: [16]}}
data: {synthetic: {samples: 1024, features: 8, classes: 2}, validation: {fraction: 0.25}}
train: {epochs: 3, batch_size: 32, optimizer: {name: adam, lr: 0.01}}
)");
  CtlResult submit = c.Ctl({"submit", spec, "--watch"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id(absl::StripAsciiWhitespace(submit.out.substr(0, submit.out.find('\n'))));

  // What the coordinator stored: distinct global steps per rank.
  CtlResult get = c.Ctl({"get", id, "--history", "-o", "json"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(get.out, &job).ok());
  std::map<int, std::set<int64_t>> steps;
  for (const v1::RankMetrics& m : job.history()) steps[m.rank()].insert(m.global_step());
  ASSERT_EQ(steps.size(), 2u);

  const std::string svg = c.dir() + "/plot.svg", png = c.dir() + "/plot.png";
  CtlResult plot_svg = c.Ctl({"plot", id, "-o", svg});
  ASSERT_EQ(plot_svg.exit_code, 0) << plot_svg.err;
  CtlResult plot_png = c.Ctl({"plot", id, "-o", png});
  ASSERT_EQ(plot_png.exit_code, 0) << plot_png.err;

  auto run = [](const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while (p && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int st = p ? pclose(p) : -1;
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  auto [svg_rc, svg_out] = run(absl::StrCat(Checker(), " svg ", svg, " 2>&1"));
  ASSERT_EQ(svg_rc, 0) << svg_out;
  std::map<std::string, std::string> points;  // class -> point count
  for (absl::string_view l : absl::StrSplit(svg_out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(l, '|');
    points[f[0]] = f[1];
  }
  for (const auto& [rank, s] : steps) {
    EXPECT_EQ(points[absl::StrCat("loss rank-", rank)], absl::StrCat(s.size())) << svg_out;
    EXPECT_EQ(points[absl::StrCat("throughput rank-", rank)], absl::StrCat(s.size()));
  }
  EXPECT_EQ(points["val-loss"], "3");  // One point per epoch.

  auto [png_rc, png_out] = run(absl::StrCat(Checker(), " png ", png, " ", png, ".ppm 2>&1"));
  ASSERT_EQ(png_rc, 0) << png_out;
  EXPECT_EQ(png_out, "960 720\n");
  const std::string ppm = testing::ReadFile(png + ".ppm");
  const std::string header = "P6\n960 720\n255\n";
  ASSERT_EQ(ppm.size(), header.size() + 960 * 720 * 3);
  std::map<std::string, int> colours;
  for (size_t i = header.size(); i + 2 < ppm.size(); i += 3) {
    colours[plot::Color{static_cast<uint8_t>(ppm[i]), static_cast<uint8_t>(ppm[i + 1]),
                        static_cast<uint8_t>(ppm[i + 2])}.Hex()]++;
  }
  for (int rank : {0, 1}) {
    // Two lines (loss, samples/s) across most of the width in each rank's colour.
    EXPECT_GT(colours[plot::RankColor(rank).Hex()], 800) << "rank " << rank;
  }
  const std::string dir = c.dir();
  cluster->reset();  // Stops the workers and the coordinator.
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
