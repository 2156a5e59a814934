#include "client/plot/term_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp::plot {
namespace {

constexpr int kLabelWidth = 9;  // "  12.5k ┤"

// Braille dot bits by (x within cell, y within cell).
constexpr uint8_t kDotBit[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string Paint(const std::string& s, const std::string& code, bool color) {
  return color && !code.empty() ? absl::StrCat("\x1b[", code, "m", s, "\x1b[0m") : s;
}

std::string RankCode(int rank) {
  static const char* kCodes[] = {"34", "33", "32", "31", "35", "36", "94", "93", "92", "91"};
  return kCodes[static_cast<size_t>(rank) % 10];
}

std::string PadLeft(const std::string& s, size_t n) {
  return s.size() >= n ? s : std::string(n - s.size(), ' ') + s;
}

// One chart: every rank's series over global steps, y labels at top and bottom, the
// x axis with restart marks (┴) and the step range under it.
void Chart(std::vector<std::string>& out, const std::string& title, const PlotData& data,
           bool throughput, int rows, int width, bool color) {
  const int cols = std::max(10, width - kLabelWidth - 1);
  BrailleCanvas canvas(cols, rows);
  double x0 = 0, x1 = 1, y0 = std::numeric_limits<double>::infinity(), y1 = -y0;
  bool any = false;
  for (const RankSeries& s : data.ranks) {
    for (const XY& p : throughput ? s.throughput : s.loss) {
      if (!std::isfinite(p.y)) continue;
      x1 = any ? std::max(x1, p.x) : std::max(p.x, 1.0);
      y0 = std::min(y0, p.y);
      y1 = std::max(y1, p.y);
      any = true;
    }
  }
  if (!any) y0 = 0, y1 = 1;
  if (throughput) y0 = std::min(y0, 0.0);
  if (y1 - y0 < 1e-12) y1 = y0 + 1;
  auto dx = [&](double x) {
    return static_cast<int>(std::lround((x - x0) / (x1 - x0) * (canvas.dot_width() - 1)));
  };
  auto dy = [&](double y) {
    return static_cast<int>(std::lround((1 - (y - y0) / (y1 - y0)) * (canvas.dot_height() - 1)));
  };
  std::vector<std::string> codes;
  for (const RankSeries& s : data.ranks) {
    const int c = static_cast<int>(codes.size());
    codes.push_back(color ? RankCode(s.rank) : "");
    const auto pts = Decimate(throughput ? s.throughput : s.loss,
                              static_cast<size_t>(canvas.dot_width()));
    bool have = false;
    int px = 0, py = 0;
    for (const XY& p : pts) {
      if (!std::isfinite(p.y)) continue;
      const int x = dx(p.x), y = dy(p.y);
      if (have) canvas.Line(px, py, x, y, c);
      else canvas.Dot(x, y, c);
      px = x, py = y, have = true;
    }
  }
  std::string legend;
  for (const RankSeries& s : data.ranks) {
    absl::StrAppend(&legend, "  ", Paint("━━", RankCode(s.rank), color), " rank ", s.rank);
  }
  out.push_back(title + legend);
  const std::vector<std::string> lines = canvas.Rows(codes);
  for (int r = 0; r < rows; ++r) {
    std::string label;
    if (r == 0) label = TickLabel(y1);
    if (r == rows - 1) label = TickLabel(y0);
    if (r == rows / 2 && rows > 4) label = TickLabel((y0 + y1) / 2);
    out.push_back(PadLeft(label, kLabelWidth - 2) + (label.empty() ? " │" : " ┤") + lines[r]);
  }
  std::string axis = std::string(kLabelWidth - 1, ' ') + "└";
  std::vector<bool> mark(static_cast<size_t>(cols), false);
  std::string notes;
  for (const Restart& r : data.restarts) {
    if (r.step < 0) continue;
    mark[static_cast<size_t>(std::clamp(dx(r.step) / 2, 0, cols - 1))] = true;
    absl::StrAppend(&notes, notes.empty() ? "" : ", ", "attempt ", r.attempt, " from step ",
                    static_cast<int64_t>(r.step));
  }
  for (int c = 0; c < cols; ++c) axis += mark[static_cast<size_t>(c)] ? "┴" : "─";
  out.push_back(axis);
  const std::string lo = TickLabel(x0), hi = TickLabel(x1), mid = "global step";
  const int free = cols - static_cast<int>(lo.size() + hi.size() + mid.size());
  out.push_back(std::string(kLabelWidth, ' ') + lo + std::string(std::max(1, free / 2), ' ') +
                mid + std::string(std::max(1, free - free / 2), ' ') + hi);
  if (!notes.empty()) out.push_back(std::string(kLabelWidth, ' ') + "┴ restarts: " + notes);
}

std::string EpochLine(const std::string& name, const std::vector<double>& values, int width,
                      const absl::FormatSpec<double>& fmt, double scale) {
  double first = std::numeric_limits<double>::quiet_NaN(), last = first;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (std::isnan(first)) first = v;
    last = v;
  }
  if (std::isnan(first)) return "";
  // At most one character per column: sample evenly when there are more epochs.
  const size_t room = static_cast<size_t>(std::max(8, width - 40));
  std::vector<double> shown;
  for (size_t i = 0; i < std::min(room, values.size()); ++i) {
    shown.push_back(values[i * values.size() / std::min(room, values.size())]);
  }
  return absl::StrCat(absl::StrFormat("%-14s", name), PadLeft(absl::StrFormat(fmt, first * scale), 9),
                      " ", Sparkline(shown), " ", absl::StrFormat(fmt, last * scale));
}

}  // namespace

BrailleCanvas::BrailleCanvas(int cols, int rows)
    : cols_(std::max(cols, 1)), rows_(std::max(rows, 1)),
      bits_(static_cast<size_t>(cols_ * rows_), 0), color_(static_cast<size_t>(cols_ * rows_), -1) {}

void BrailleCanvas::Dot(int x, int y, int color) {
  if (x < 0 || y < 0 || x >= dot_width() || y >= dot_height()) return;
  const size_t cell = static_cast<size_t>((y / 4) * cols_ + x / 2);
  bits_[cell] |= kDotBit[x % 2][y % 4];
  color_[cell] = color;
}

void BrailleCanvas::Line(int x0, int y0, int x1, int y1, int color) {
  const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    Dot(x0, y0, color);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

std::vector<std::string> BrailleCanvas::Rows(const std::vector<std::string>& codes) const {
  std::vector<std::string> out;
  for (int r = 0; r < rows_; ++r) {
    std::string line;
    for (int c = 0; c < cols_; ++c) {
      const size_t cell = static_cast<size_t>(r * cols_ + c);
      if (bits_[cell] == 0) {
        line += ' ';
        continue;
      }
      const std::string ch = Utf8(0x2800 + bits_[cell]);
      const int k = color_[cell];
      line += k >= 0 && static_cast<size_t>(k) < codes.size() && !codes[k].empty()
                  ? absl::StrCat("\x1b[", codes[k], "m", ch, "\x1b[0m")
                  : ch;
    }
    out.push_back(line);
  }
  return out;
}

std::string Sparkline(const std::vector<double>& values) {
  static const char* kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  std::string out;
  for (double v : values) {
    if (!std::isfinite(v)) {
      out += ' ';
      continue;
    }
    const int i = hi > lo ? static_cast<int>(std::lround((v - lo) / (hi - lo) * 7)) : 3;
    out += kBlocks[std::clamp(i, 0, 7)];
  }
  return out;
}

std::string RenderTerminalChart(const PlotData& data, const TermChartOptions& o) {
  std::vector<std::string> out;
  out.push_back(data.title);
  out.push_back("");
  Chart(out, "training loss", data, /*throughput=*/false, o.loss_rows, o.width, o.color);
  out.push_back("");
  Chart(out, "samples/s", data, /*throughput=*/true, std::max(3, o.loss_rows * 2 / 3), o.width,
        o.color);
  if (!data.epochs.empty()) {
    std::vector<double> train, val, acc;
    for (const EpochPoint& e : data.epochs) {
      train.push_back(e.train_loss);
      val.push_back(e.val_loss);
      acc.push_back(e.val_accuracy);
    }
    out.push_back("");
    out.push_back(absl::StrCat("per epoch (", data.epochs.front().epoch, " to ",
                               data.epochs.back().epoch, "), first and last values:"));
    for (const std::string& l : {EpochLine("train loss", train, o.width, "%.4f", 1),
                                 EpochLine("val loss", val, o.width, "%.4f", 1),
                                 EpochLine("val accuracy", acc, o.width, "%.2f%%", 100)}) {
      if (!l.empty()) out.push_back("  " + l);
    }
    for (const Restart& r : data.restarts) {
      if (r.epoch >= 0) {
        out.push_back(absl::StrCat("  attempt ", r.attempt, " took over at epoch ",
                                   static_cast<int64_t>(r.epoch)));
      }
    }
  }
  std::string text;
  for (const std::string& l : out) absl::StrAppend(&text, l, "\n");
  return text;
}

}  // namespace ddp::plot
