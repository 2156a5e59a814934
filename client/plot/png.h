// PNG output for `ddpctl plot -o FILE.png`: a small rasterizer for Drawing (solid
// lines of any width, dashes, rectangles, 5x7 bitmap text; no anti-aliasing, so every
// line pixel has its series' exact colour) and a PNG encoder over zlib.
#ifndef DDP_CLIENT_PLOT_PNG_H_
#define DDP_CLIENT_PLOT_PNG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/plot/drawing.h"

namespace ddp::plot {

// 8-bit RGB pixels, rows top to bottom.
class Image {
 public:
  Image(int width, int height, Color fill);

  int width() const { return width_; }
  int height() const { return height_; }
  Color At(int x, int y) const;
  void Set(int x, int y, Color c);  // Ignores pixels outside the image.
  void FillRect(double x, double y, double w, double h, Color c);
  // A line `width` pixels wide (a disc stamped along it); dashed: 6 on, 4 off.
  void Line(Point a, Point b, Color c, double width, bool dashed);
  // Starts the dash pattern afresh (at each new polyline).
  void ResetDash() { dash_phase_ = 0; }
  // `size` is the text's pixel height as in SVG; glyphs are scaled by whole factors.
  void DrawText(const Text& text);

  const std::vector<uint8_t>& pixels() const { return pixels_; }

 private:
  void Stamp(int cx, int cy, Color c, double width);

  int width_, height_;
  std::vector<uint8_t> pixels_;
  double dash_phase_ = 0;  // Carries a dash pattern along a polyline's segments.
};

Image Rasterize(const Drawing& drawing);

// A PNG file (8-bit RGB, no interlace) holding `image`.
absl::StatusOr<std::string> EncodePng(const Image& image);

}  // namespace ddp::plot

#endif  // DDP_CLIENT_PLOT_PNG_H_
