// `ddpctl plot` on a job that really trained: a coordinator and two worker processes
// run a two-rank job to the end; ddpctl writes an SVG and a PNG, which an independent
// checker (tests/client/check_plot.py) reads back against the job's stored history.
// cairo's pictures name no series, so the lines are told apart by their colours.
#include <cstdio>
#include <filesystem>
#include <iterator>
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
  // stroke colour -> the point counts of its lines
  std::map<std::string, std::multiset<size_t>> lines;
  int glyph_runs = 0;
  for (absl::string_view l : absl::StrSplit(svg_out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(l, '|');
    if (f[0] == "line") {
      lines[f[1]].insert(std::vector<std::string>(absl::StrSplit(f[4], ' ')).size());
    }
    glyph_runs += f[0] == "text";
  }
  for (const auto& [rank, s] : steps) {
    // The legend's swatch, then the loss and samples/s lines with a vertex per stored
    // step (cairo leaves out the rare one that only continues a straight line).
    const std::multiset<size_t>& counts = lines[plot::RankColor(rank).Hex()];
    ASSERT_EQ(counts.size(), 3u) << "rank " << rank << "\n" << svg_out;
    EXPECT_EQ(*counts.begin(), 2u);
    for (auto it = std::next(counts.begin()); it != counts.end(); ++it) {
      EXPECT_LE(*it, s.size()) << "rank " << rank;
      EXPECT_GE(*it, s.size() * 9 / 10) << "rank " << rank;
    }
  }
  ASSERT_EQ(lines["#000000"].size(), 1u);  // Val loss: a vertex per epoch (or two, in line).
  EXPECT_GE(*lines["#000000"].begin(), 2u);
  EXPECT_LE(*lines["#000000"].begin(), 3u);
  EXPECT_GT(glyph_runs, 20);  // Title, legend, panel titles, tick labels.

  auto [png_rc, png_out] = run(absl::StrCat(Checker(), " png ", png, " ", png, ".ppm 2>&1"));
  ASSERT_EQ(png_rc, 0) << png_out;
  EXPECT_EQ(png_out, "960 720\n");
  const std::string ppm = testing::ReadFile(png + ".ppm");
  const std::string header = "P6\n960 720\n255\n";
  ASSERT_EQ(ppm.size(), header.size() + 960 * 720 * 3);
  // Per rank colour, pixels painted in it at least half over the white, and pixels
  // where anti-aliasing blends it into the white.
  std::map<int, int> painted, blended;
  for (size_t i = header.size(); i + 2 < ppm.size(); i += 3) {
    const double p[3] = {static_cast<uint8_t>(ppm[i]) - 255.0,
                         static_cast<uint8_t>(ppm[i + 1]) - 255.0,
                         static_cast<uint8_t>(ppm[i + 2]) - 255.0};
    for (int rank : {0, 1}) {
      const plot::Color ink = plot::RankColor(rank);
      const double d[3] = {ink.r - 255.0, ink.g - 255.0, ink.b - 255.0};
      const double c = (p[0] * d[0] + p[1] * d[1] + p[2] * d[2]) /
                       (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
      double off = 0;
      for (int k = 0; k < 3; ++k) off += (p[k] - c * d[k]) * (p[k] - c * d[k]);
      if (off > 64) continue;  // Not on the way from white to this colour.
      painted[rank] += c >= 0.5;
      blended[rank] += c > 0.1 && c < 0.5;
    }
  }
  for (int rank : {0, 1}) {
    // Two lines (loss, samples/s) across most of the width in each rank's colour.
    EXPECT_GT(painted[rank], 800) << "rank " << rank;
    EXPECT_GT(blended[rank], 400) << "rank " << rank;
  }
  const std::string dir = c.dir();
  cluster->reset();  // Stops the workers and the coordinator.
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
