// ddpctl plot: series from a job's history, the drawing laid out from them, and the
// SVG and PNG cairo draws of it, read back by an independent checker (tests/client/
// check_plot.py: Python's XML parser and its own PNG decoder) and compared with the
// drawing: every line where the layout put it, in its colour, anti-aliased.
#include "client/plot/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/plot/image.h"
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

// What check_plot.py read from an SVG.
struct SvgLine {
  std::string stroke;
  double width = 0;
  bool dashed = false;
  std::vector<Point> points;
};
struct SvgText {
  std::string fill;
  int glyphs = 0;
  double first_x = 0, last_x = 0, y = 0;
};
struct SvgContents {
  int width = 0, height = 0;
  std::vector<SvgLine> lines;
  std::vector<SvgText> texts;
};

SvgContents ReadSvg(const std::string& checker_output) {
  SvgContents svg;
  for (absl::string_view l : absl::StrSplit(checker_output, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(l, '|');
    if (f[0] == "size" && f.size() == 3) {
      svg.width = std::stoi(f[1]);
      svg.height = std::stoi(f[2]);
    } else if (f[0] == "line" && f.size() == 5) {
      SvgLine line{f[1], std::stod(f[2]), f[3] == "1", {}};
      for (absl::string_view xy : absl::StrSplit(f[4], ' ', absl::SkipEmpty())) {
        std::vector<std::string> c = absl::StrSplit(xy, ',');
        line.points.push_back({std::stod(c.at(0)), std::stod(c.at(1))});
      }
      svg.lines.push_back(std::move(line));
    } else if (f[0] == "text" && f.size() == 6) {
      svg.texts.push_back(
          {f[1], std::stoi(f[2]), std::stod(f[3]), std::stod(f[4]), std::stod(f[5])});
    } else {
      ADD_FAILURE() << "checker line: " << l;
    }
  }
  return svg;
}

double Distance(Point p, Point a, Point b) {
  const double dx = b.x - a.x, dy = b.y - a.y, len2 = dx * dx + dy * dy;
  const double t = len2 > 0 ? std::clamp(((p.x - a.x) * dx + (p.y - a.y) * dy) / len2, 0.0, 1.0) : 0;
  return std::hypot(p.x - (a.x + t * dx), p.y - (a.y + t * dy));
}

// Whether `svg` is `line` drawn: same colour, width and dashes, through the same
// points. cairo leaves out a vertex that only continues a straight line, so the SVG's
// vertices are some of the drawing's, in order, the first and the last among them,
// and each of the drawing's points lies on the SVG's line. Grid and axis lines are
// moved onto pixel centres (by at most half a pixel) to stay crisp.
bool Draws(const SvgLine& svg, const Polyline& line) {
  if (svg.stroke != line.color.Hex() || std::fabs(svg.width - line.width) > 1e-6 ||
      svg.dashed != line.dashed || svg.points.size() < 2 ||
      svg.points.size() > line.points.size()) {
    return false;
  }
  const double tolerance = line.width <= 1 ? 0.51 : 0.02;
  auto same = [tolerance](Point a, Point b) {
    return std::fabs(a.x - b.x) <= tolerance && std::fabs(a.y - b.y) <= tolerance;
  };
  size_t next = 0;  // The drawing's point the next SVG vertex may be.
  for (size_t i = 0; i < svg.points.size(); ++i) {
    while (next < line.points.size() && !same(svg.points[i], line.points[next])) ++next;
    if (next == line.points.size()) return false;
    if ((i == 0 && next != 0) || (i + 1 == svg.points.size() && next + 1 != line.points.size())) {
      return false;
    }
    ++next;
  }
  for (const Point& p : line.points) {
    double nearest = std::numeric_limits<double>::infinity();
    for (size_t i = 1; i < svg.points.size(); ++i) {
      nearest = std::min(nearest, Distance(p, svg.points[i - 1], svg.points[i]));
    }
    if (nearest > tolerance * 1.5) return false;
  }
  return true;
}

// Characters, not bytes: one glyph each.
int Utf8Chars(const std::string& s) {
  int n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

TEST(SvgTest, EveryLineAndLabelOfTheDrawingIsInTheSvgWhereTheLayoutPutIt) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  const Drawing d = LayoutPlot(*data);
  auto bytes = RenderImage(d, ImageFormat::kSvg);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string dir = testing::MakeTempDir("svg");
  testing::WriteFile(dir + "/plot.svg", *bytes);
  CmdResult r = RunCommand(absl::StrCat(Checker(), " svg ", dir, "/plot.svg 2>&1"));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.rc, 0) << r.out;
  const SvgContents svg = ReadSvg(r.out);
  EXPECT_EQ(svg.width, d.width);
  EXPECT_EQ(svg.height, d.height);

  // Each polyline once, in drawing order (later lines on top), and nothing else.
  std::vector<const Polyline*> drawn;
  for (const Polyline& p : d.polylines) {
    if (p.points.size() >= 2) drawn.push_back(&p);  // A single point draws nothing.
  }
  ASSERT_EQ(svg.lines.size(), drawn.size());
  for (size_t i = 0; i < drawn.size(); ++i) {
    EXPECT_TRUE(Draws(svg.lines[i], *drawn[i]))
        << "polyline " << i << " (" << drawn[i]->cls << ") drawn as " << svg.lines[i].stroke
        << ", " << svg.lines[i].points.size() << " points";
  }
  // Each label as a run of glyphs in its colour on its baseline, anchored as laid out.
  ASSERT_EQ(svg.texts.size(), d.texts.size());
  for (size_t i = 0; i < d.texts.size(); ++i) {
    const Text& t = d.texts[i];
    const SvgText& g = svg.texts[i];
    SCOPED_TRACE(t.text);
    EXPECT_EQ(g.fill, t.color.Hex());
    EXPECT_EQ(g.glyphs, Utf8Chars(t.text));
    EXPECT_NEAR(g.y, t.at.y, 0.01);
    switch (t.anchor) {
      case Anchor::kStart:
        EXPECT_NEAR(g.first_x, t.at.x, 0.01);
        break;
      case Anchor::kMiddle:
        if (g.glyphs > 1) {
          EXPECT_LT(g.first_x, t.at.x);
        }
        EXPECT_LT(g.last_x, t.at.x + t.size * Utf8Chars(t.text));
        EXPECT_GT(g.last_x, t.at.x - t.size);
        break;
      case Anchor::kEnd:
        EXPECT_LT(g.first_x, t.at.x);
        EXPECT_LT(g.last_x, t.at.x);  // The last glyph starts before the anchor...
        EXPECT_GT(g.last_x, t.at.x - t.size);  // ...and ends at it.
        break;
    }
  }
}

TEST(SvgTest, UserTextWithMarkupControlCharactersAndBadUtf8StillMakesAWholePicture) {
  Drawing d;
  d.width = d.height = 200;
  // Invalid UTF-8 would put cairo in an error state and end the drawing there.
  d.texts.push_back({{10, 20}, "a <tricky> & \"quoted\" \x01name\xff", {1, 2, 3}, 11,
                     Anchor::kStart});
  d.texts.push_back({{10, 40}, "after", {4, 5, 6}, 11, Anchor::kStart});
  for (ImageFormat f : {ImageFormat::kSvg, ImageFormat::kPng}) {
    auto bytes = RenderImage(d, f);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
  }
  const std::string dir = testing::MakeTempDir("svg");
  testing::WriteFile(dir + "/plot.svg", *RenderImage(d, ImageFormat::kSvg));
  CmdResult r = RunCommand(absl::StrCat(Checker(), " svg ", dir, "/plot.svg 2>&1"));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.rc, 0) << r.out;  // Parses as XML.
  const SvgContents svg = ReadSvg(r.out);
  ASSERT_EQ(svg.texts.size(), 2u);
  // The control character dropped, the invalid byte shown as U+FFFD.
  EXPECT_EQ(svg.texts[0].glyphs, Utf8Chars("a <tricky> & \"quoted\" name?"));
  EXPECT_EQ(svg.texts[1].fill, "#040506");
  EXPECT_EQ(svg.texts[1].glyphs, 5);
}

// A decoded PNG (check_plot.py's PPM).
struct Pixels {
  int width = 0, height = 0;
  std::string rgb;
  Color At(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {static_cast<uint8_t>(rgb[i]), static_cast<uint8_t>(rgb[i + 1]),
            static_cast<uint8_t>(rgb[i + 2])};
  }
};

Pixels DecodePng(const std::string& png) {
  Pixels px;
  const std::string dir = testing::MakeTempDir("png");
  testing::WriteFile(dir + "/plot.png", png);
  CmdResult r =
      RunCommand(absl::StrCat(Checker(), " png ", dir, "/plot.png ", dir, "/plot.ppm 2>&1"));
  const std::string ppm = testing::ReadFile(dir + "/plot.ppm");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.rc, 0) << r.out;
  if (sscanf(r.out.c_str(), "%d %d", &px.width, &px.height) != 2) return {};
  const std::string header = absl::StrCat("P6\n", px.width, " ", px.height, "\n255\n");
  EXPECT_EQ(ppm.size(), header.size() + static_cast<size_t>(px.width) * px.height * 3);
  if (ppm.size() < header.size()) return {};
  px.rgb = ppm.substr(header.size());
  return px;
}

// How much of `ink` over white a pixel shows: 1 where the colour is painted fully, 0
// on bare white, in between where anti-aliasing blends the two; -1 where the pixel is
// not on the way from white to `ink` (another colour).
double Coverage(Color px, Color ink) {
  const double d[3] = {ink.r - 255.0, ink.g - 255.0, ink.b - 255.0};
  const double p[3] = {px.r - 255.0, px.g - 255.0, px.b - 255.0};
  const double dd = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
  const double c = (p[0] * d[0] + p[1] * d[1] + p[2] * d[2]) / dd;
  double off = 0;
  for (int k = 0; k < 3; ++k) off += (p[k] - c * d[k]) * (p[k] - c * d[k]);
  return std::sqrt(off) <= 8 ? c : -1;
}

TEST(PngTest, EachRanksLineIsPaintedInItsColourWhereTheLayoutPutItAntiAliased) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  LayoutOptions options;
  options.width = 640;
  options.height = 480;
  const Drawing d = LayoutPlot(*data, options);
  auto png = RenderImage(d, ImageFormat::kPng);
  ASSERT_TRUE(png.ok()) << png.status();
  const Pixels px = DecodePng(*png);
  ASSERT_EQ(px.width, 640);
  ASSERT_EQ(px.height, 480);
  EXPECT_EQ(px.At(1, 1), d.background);

  for (int rank = 0; rank < 2; ++rank) {
    for (const char* panel : {"loss", "throughput"}) {
      SCOPED_TRACE(absl::StrCat(panel, " rank ", rank));
      const Polyline* line = WithClass(d, absl::StrCat(panel, " rank-", rank)).at(0);
      // At every vertex, the pixel under it (or one beside it, the line being 1.5
      // pixels wide) shows the rank's colour at least at half strength.
      int hits = 0;
      for (const Point& p : line->points) {
        double best = -1;
        for (int dy = -1; dy <= 1; ++dy) {
          for (int dx = -1; dx <= 1; ++dx) {
            best = std::max(best, Coverage(px.At(static_cast<int>(p.x) + dx,
                                                 static_cast<int>(p.y) + dy),
                                           line->color));
          }
        }
        hits += best >= 0.5;
      }
      EXPECT_EQ(hits, 15);
      // Along its segments, edges blended with the white: anti-aliasing.
      int blended = 0;
      for (size_t i = 1; i < line->points.size(); ++i) {
        const Point a = line->points[i - 1], b = line->points[i];
        for (double f = 0.1; f < 0.95; f += 0.1) {
          const int x = static_cast<int>(a.x + f * (b.x - a.x));
          const int y = static_cast<int>(a.y + f * (b.y - a.y));
          for (int dy = -2; dy <= 2; ++dy) {
            const double c = Coverage(px.At(x, y + dy), line->color);
            blended += c > 0.1 && c < 0.9;
          }
        }
      }
      EXPECT_GT(blended, 20);
    }
  }

  // The title in a real font: solid and blended ink pixels along its baseline.
  const Text& title = d.texts.at(0);
  ASSERT_EQ(title.text, data->title);
  int solid = 0, edge = 0;
  for (int y = static_cast<int>(title.at.y) - title.size; y <= title.at.y + 3; ++y) {
    for (int x = static_cast<int>(title.at.x); x < title.at.x + 200; ++x) {
      const double c = Coverage(px.At(x, y), title.color);
      solid += c >= 0.9;
      edge += c > 0.1 && c < 0.9;
    }
  }
  EXPECT_GT(solid, 100);
  EXPECT_GT(edge, 100);
  // Nothing left of the title's start in its band but the background.
  for (int y = static_cast<int>(title.at.y) - title.size; y <= title.at.y + 3; ++y) {
    for (int x = 0; x < title.at.x - 2; ++x) EXPECT_EQ(px.At(x, y), d.background) << x << "," << y;
  }
}

TEST(PngTest, GridAndAxisLinesAreCrispOnePixelLines) {
  auto data = ExtractPlotData(RestartedJob());
  ASSERT_TRUE(data.ok());
  const Drawing d = LayoutPlot(*data);
  auto png = RenderImage(d, ImageFormat::kPng);
  ASSERT_TRUE(png.ok()) << png.status();
  const Pixels px = DecodePng(*png);
  ASSERT_EQ(px.width, d.width);
  const Polyline* axis = WithClass(d, "axis").at(0);
  // The x axis: a horizontal run from the corner; the row under it is left white.
  const Point corner = axis->points[1], end = axis->points[2];
  const int row = static_cast<int>(corner.y);
  int full = 0, below = 0;
  for (int x = static_cast<int>(corner.x) + 5; x < end.x - 5; ++x) {
    full += Coverage(px.At(x, row), axis->color) > 0.95;
    below += px.At(x, row + 1) == d.background;
  }
  const int n = static_cast<int>(end.x - 5) - static_cast<int>(corner.x) - 5;
  EXPECT_GT(full, n * 9 / 10);
  EXPECT_GT(below, n * 9 / 10);
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
