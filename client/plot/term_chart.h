// `ddpctl plot JOB` on a terminal: the same curves as the SVG/PNG, drawn with braille
// characters (2x4 dots per cell) and per-epoch sparklines in block characters.
#ifndef DDP_CLIENT_PLOT_TERM_CHART_H_
#define DDP_CLIENT_PLOT_TERM_CHART_H_

#include <string>
#include <vector>

#include "client/plot/plot.h"

namespace ddp::plot {

struct TermChartOptions {
  int width = 80;      // Columns available.
  int loss_rows = 12;  // Height of the loss chart; samples/s gets two thirds of it.
  bool color = true;   // ANSI colours per rank (a terminal); plain text otherwise.
};

std::string RenderTerminalChart(const PlotData& data, const TermChartOptions& options = {});

// A braille dot canvas: cell (c, r) holds dots x in [2c, 2c+1], y in [4r, 4r+3]; each
// cell takes the colour of the last series that touched it.
class BrailleCanvas {
 public:
  BrailleCanvas(int cols, int rows);
  int dot_width() const { return cols_ * 2; }
  int dot_height() const { return rows_ * 4; }
  void Dot(int x, int y, int color);
  void Line(int x0, int y0, int x1, int y1, int color);
  // One string per row; `color_codes[i]` is the ANSI SGR code of colour i ("" for none).
  std::vector<std::string> Rows(const std::vector<std::string>& color_codes) const;

 private:
  int cols_, rows_;
  std::vector<uint8_t> bits_;
  std::vector<int> color_;  // -1: empty.
};

// "▁▂▄▆█" for `values` scaled between their min and max (NaN: a space).
std::string Sparkline(const std::vector<double>& values);

}  // namespace ddp::plot

#endif  // DDP_CLIENT_PLOT_TERM_CHART_H_
