// ddpctl plot: series from a job's history, the drawing laid out from them, and the
// SVG and PNG made of it, read back by an independent checker (tests/client/
// check_plot.py: Python's XML parser and its own PNG decoder).
#include "client/plot/plot.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/plot/png.h"
#include "client/plot/term_chart.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace ddp::plot {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct CmdResult {
  int rc = -1;
  std::string out;
};

CmdResult RunCommand(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Checker() { return absl::StrCat(DDP_PYTHON3, " ", DDP_SOURCE_DIR, "/tests/client/check_plot.py"); }

void AddStep(v1::Job& job, int attempt, int rank, int64_t step, double loss, double rate) {
  v1::RankMetrics* m = job.add_history();
  m->set_attempt(attempt);
  m->set_rank(rank);
  m->set_global_step(step);
  m->set_loss(loss);
  m->set_samples_per_s(rate);
}

// Two ranks; attempt 1 runs steps 0..9, attempt 2 resumes from step 6 and runs to 14.
// Rank 0's loss sits near 10, rank 1's near 2, and their throughputs 50 samples/s
// apart, so their lines never cross.
v1::Job RestartedJob() {
  v1::Job job;
  job.set_id("demo-abcde");
  job.set_name("demo");
  job.set_state(v1::SUCCEEDED);
  job.add_attempts()->set_number(1);
  job.add_attempts()->set_number(2);
  for (int rank = 0; rank < 2; ++rank) {
    const double base = rank == 0 ? 10 : 2;
    for (int64_t s = 0; s < 10; ++s) AddStep(job, 1, rank, s, base + 0.1 * s, 100 + 50 * rank);
    for (int64_t s = 6; s < 15; ++s) AddStep(job, 2, rank, s, base - 0.1 * s, 200 + 50 * rank);
  }
  for (int e = 0; e < 3; ++e) {
    v1::EpochSummary* ep = job.add_epoch_history();
    ep->set_attempt(e < 2 ? 1 : 2);
    ep->set_epoch(e);
    ep->set_train_loss(1.0 / (e + 1));
    ep->set_val_loss(1.2 / (e + 1));
    ep->set_val_accuracy(0.5 + 0.1 * e);
  }
  return job;
}

std::vector<const Polyline*> WithClass(const Drawing& d, const std::string& cls) {
  std::vector<const Polyline*> out;
  for (const Polyline& p : d.polylines) {
    if (p.cls == cls) out.push_back(&p);
  }
  return out;
}

TEST(PlotDataTest, ALaterAttemptReplacesTheStepsItRedidAndMarksWhereItTookOver) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->ranks.size(), 2u);
  for (const RankSeries& s : data->ranks) {
    ASSERT_EQ(s.loss.size(), 15u);  // Steps 0..14, each once.
    const double base = s.rank == 0 ? 10 : 2;
    EXPECT_DOUBLE_EQ(s.loss[5].y, base + 0.5);  // Attempt 1's.
    EXPECT_DOUBLE_EQ(s.loss[7].y, base - 0.7);  // Attempt 2 redid step 7.
    EXPECT_DOUBLE_EQ(s.throughput[7].y, 200 + 50 * s.rank);
  }
  ASSERT_EQ(data->restarts.size(), 1u);
  EXPECT_EQ(data->restarts[0].attempt, 2);
  EXPECT_EQ(data->restarts[0].step, 6);
  EXPECT_EQ(data->restarts[0].epoch, 2);
  ASSERT_EQ(data->epochs.size(), 3u);
  EXPECT_THAT(data->title, HasSubstr("demo-abcde"));
  EXPECT_THAT(data->title, HasSubstr("2 attempts"));
}

TEST(PlotDataTest, AJobWithoutStepMetricsIsAnErrorThatSaysWhy) {
  v1::Job job;
  job.set_id("early-aaaaa");
  job.set_state(v1::PENDING);
  auto data = ExtractPlotData(job);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("no step metrics yet"));
}

TEST(PlotDataTest, DecimateAveragesNeighboursDownToTheLimit) {
  std::vector<XY> pts;
  for (int i = 0; i < 10000; ++i) pts.push_back({static_cast<double>(i), 1.0 + (i % 2)});
  auto d = Decimate(pts, 2000);
  ASSERT_EQ(d.size(), 2000u);
  for (const XY& p : d) EXPECT_NEAR(p.y, 1.5, 0.21);  // Runs of 5: means of 1s and 2s.
  EXPECT_EQ(Decimate(pts, 20000).size(), 10000u);
}

TEST(PlotDataTest, TicksAreRoundAndInsideTheRange) {
  EXPECT_EQ(NiceTicks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_THAT(NiceTicks(0.013, 0.7, 4),
              ::testing::Pointwise(::testing::DoubleNear(1e-12), std::vector<double>{0.2, 0.4, 0.6}));
  EXPECT_EQ(TickLabel(12500), "12.5k");
  EXPECT_EQ(TickLabel(0.25), "0.25");
}

TEST(LayoutTest, OneLinePerRankInEachStepPanelWithEveryPoint) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  const Drawing d = LayoutPlot(*data);
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* panel : {"loss", "throughput"}) {
      auto lines = WithClass(d, absl::StrCat(panel, " rank-", rank));
      ASSERT_EQ(lines.size(), 1u) << panel << " " << rank;
      EXPECT_EQ(lines[0]->points.size(), 15u);
      EXPECT_EQ(lines[0]->color, RankColor(rank));
    }
  }
  EXPECT_EQ(WithClass(d, "val-loss").at(0)->points.size(), 3u);
  EXPECT_EQ(WithClass(d, "val-accuracy").at(0)->points.size(), 3u);
  // A restart marker in each of the three panels.
  EXPECT_EQ(WithClass(d, "restart").size(), 3u);
  // Points go left to right and stay inside the picture.
  for (const Polyline& p : d.polylines) {
    for (size_t i = 0; i < p.points.size(); ++i) {
      EXPECT_GE(p.points[i].x, 0);
      EXPECT_LE(p.points[i].x, d.width);
      EXPECT_GE(p.points[i].y, 0);
      EXPECT_LE(p.points[i].y, d.height);
      if (i > 0 && p.rank >= 0 && p.cls.rfind("legend", 0) != 0) {
        EXPECT_GT(p.points[i].x, p.points[i - 1].x);
      }
    }
  }
}

TEST(LayoutTest, RankColoursStayDistinctPastThePalette) {
  std::map<std::string, int> seen;
  for (int r = 0; r < 64; ++r) seen[RankColor(r).Hex()]++;
  EXPECT_EQ(seen.size(), 64u);
}

TEST(SvgTest, ParsesAsXmlWithOnePolylinePerRankAndTheRightPointCounts) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  Drawing d = LayoutPlot(*data);
  d.texts.push_back({{10, 10}, "a <tricky> & \"quoted\" \x01name", {}, 11, Anchor::kStart});
  const std::string dir = testing::MakeTempDir("svg");
  const std::string path = dir + "/plot.svg";
  testing::WriteFile(path, RenderSvg(d));
  CmdResult r = RunCommand(absl::StrCat(Checker(), " svg ", path, " 2>&1"));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.rc, 0) << r.out;
  std::map<std::string, std::vector<std::string>> lines;  // class -> [points, stroke]
  std::map<std::string, int> count;
  for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(l, '|');
    ASSERT_EQ(f.size(), 3u) << l;
    lines[f[0]] = {f[1], f[2]};
    ++count[f[0]];
  }
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* panel : {"loss", "throughput"}) {
      const std::string cls = absl::StrCat(panel, " rank-", rank);
      ASSERT_TRUE(lines.count(cls)) << cls;
      EXPECT_EQ(count[cls], 1) << cls;
      EXPECT_EQ(lines[cls][0], "15");
      EXPECT_EQ(lines[cls][1], RankColor(rank).Hex());
    }
  }
  EXPECT_EQ(lines["val-loss"][0], "3");
}

TEST(PngTest, HasTheRightSizeAndEachRanksColourAlongItsLine) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  LayoutOptions options;
  options.width = 640;
  options.height = 480;
  const Drawing d = LayoutPlot(*data, options);
  auto png = EncodePng(Rasterize(d));
  ASSERT_TRUE(png.ok());
  const std::string dir = testing::MakeTempDir("png");
  testing::WriteFile(dir + "/plot.png", *png);
  CmdResult r = RunCommand(absl::StrCat(Checker(), " png ", dir, "/plot.png ", dir, "/plot.ppm 2>&1"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "640 480\n");
  const std::string ppm = testing::ReadFile(dir + "/plot.ppm");
  std::filesystem::remove_all(dir);
  const std::string header = "P6\n640 480\n255\n";
  ASSERT_EQ(ppm.size(), header.size() + 640 * 480 * 3);
  auto pixel = [&](int x, int y) {
    const size_t i = header.size() + (static_cast<size_t>(y) * 640 + x) * 3;
    return Color{static_cast<uint8_t>(ppm[i]), static_cast<uint8_t>(ppm[i + 1]),
                 static_cast<uint8_t>(ppm[i + 2])};
  };
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* panel : {"loss", "throughput"}) {
      const Polyline* line = WithClass(d, absl::StrCat(panel, " rank-", rank)).at(0);
      int hits = 0;
      for (const Point& p : line->points) {
        hits += pixel(static_cast<int>(std::lround(p.x)), static_cast<int>(std::lround(p.y))) ==
                RankColor(rank);
      }
      EXPECT_EQ(hits, 15) << panel << " rank " << rank;
    }
  }
}

TEST(TerminalChartTest, DrawsBrailleCurvesEpochSparklinesAndRestarts) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  TermChartOptions o;
  o.width = 60;
  o.color = false;
  const std::string chart = RenderTerminalChart(*data, o);
  EXPECT_THAT(chart, HasSubstr("training loss"));
  EXPECT_THAT(chart, HasSubstr("samples/s"));
  EXPECT_THAT(chart, HasSubstr("attempt 2 from step 6"));
  EXPECT_THAT(chart, HasSubstr("attempt 2 took over at epoch 2"));
  EXPECT_THAT(chart, HasSubstr("val accuracy"));
  EXPECT_THAT(chart, HasSubstr("\xe2\xa0"));  // U+28xx: braille.
  EXPECT_THAT(chart, Not(HasSubstr("\x1b[")));  // No colour when asked for none.
  EXPECT_EQ(Sparkline({1, 2, 3, NAN}), "▁▅█ ");
}

TEST(TerminalChartTest, BrailleDotsLandInTheRightCell) {
  BrailleCanvas c(2, 1);
  c.Dot(0, 0, 0);  // Top-left dot of cell 0: U+2801.
  c.Dot(3, 3, 0);  // Bottom-right dot of cell 1: U+2880.
  EXPECT_EQ(c.Rows({""}), std::vector<std::string>{"\u2801\u2880"});
}

}  // namespace
}  // namespace ddp::plot
