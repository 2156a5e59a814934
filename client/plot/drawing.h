// A vector drawing as plain data: what `ddpctl plot` lays out, and what image.h draws
// as a PNG or an SVG with cairo. Pure: no I/O, so tests check the drawing itself
// (which series, how many points, which colour) as well as the pictures made of it.
#ifndef DDP_CLIENT_PLOT_DRAWING_H_
#define DDP_CLIENT_PLOT_DRAWING_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::plot {

struct Color {
  uint8_t r = 0, g = 0, b = 0;
  std::string Hex() const;  // "#1f77b4"
  bool operator==(const Color& o) const { return r == o.r && g == o.g && b == o.b; }
};

// The colour of rank `rank`'s lines: ten well-separated colours, then hues spread by
// the golden angle, never grey or black (those are the axes' and the epoch lines').
Color RankColor(int rank);

struct Point {
  double x = 0, y = 0;  // Pixels, y down.
};

// A line through `points`. `cls` names what it is ("loss rank-0", "axis", "restart"),
// and becomes the SVG class, so tests and stylesheets can find it.
struct Polyline {
  std::vector<Point> points;
  Color color;
  double width = 1;
  bool dashed = false;
  std::string cls;
  int rank = -1;  // The rank it draws, or -1.
};

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
  Color fill;
};

enum class Anchor { kStart, kMiddle, kEnd };

// One line of text; `y` is its baseline.
struct Text {
  Point at;
  std::string text;
  Color color;
  int size = 11;  // Pixels.
  Anchor anchor = Anchor::kStart;
};

// Drawn in this order: rects, polylines, texts.
struct Drawing {
  int width = 0, height = 0;
  Color background{255, 255, 255};
  std::vector<Rect> rects;
  std::vector<Polyline> polylines;
  std::vector<Text> texts;
};

}  // namespace ddp::plot

#endif  // DDP_CLIENT_PLOT_DRAWING_H_
