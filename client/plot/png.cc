#include "client/plot/png.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>

#include "client/plot/bitmap_font.h"

namespace ddp::plot {
namespace {

void Put32(std::string& out, uint32_t v) {
  out += static_cast<char>(v >> 24);
  out += static_cast<char>(v >> 16);
  out += static_cast<char>(v >> 8);
  out += static_cast<char>(v);
}

void Chunk(std::string& out, const char type[5], const std::string& data) {
  Put32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  Put32(out, static_cast<uint32_t>(
                 crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
}

}  // namespace

Image::Image(int width, int height, Color fill)
    : width_(std::max(width, 1)), height_(std::max(height, 1)),
      pixels_(static_cast<size_t>(width_) * height_ * 3) {
  for (size_t i = 0; i < pixels_.size(); i += 3) {
    pixels_[i] = fill.r, pixels_[i + 1] = fill.g, pixels_[i + 2] = fill.b;
  }
}

Color Image::At(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {pixels_[i], pixels_[i + 1], pixels_[i + 2]};
}

void Image::Set(int x, int y, Color c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  pixels_[i] = c.r, pixels_[i + 1] = c.g, pixels_[i + 2] = c.b;
}

void Image::FillRect(double x, double y, double w, double h, Color c) {
  const int x0 = static_cast<int>(std::lround(x)), y0 = static_cast<int>(std::lround(y));
  const int x1 = static_cast<int>(std::lround(x + w)), y1 = static_cast<int>(std::lround(y + h));
  for (int yy = std::max(y0, 0); yy < std::min(y1, height_); ++yy) {
    for (int xx = std::max(x0, 0); xx < std::min(x1, width_); ++xx) Set(xx, yy, c);
  }
}

void Image::Stamp(int cx, int cy, Color c, double width) {
  if (width <= 1.0) {
    Set(cx, cy, c);
    return;
  }
  const double r = width / 2.0;
  const int ir = static_cast<int>(std::ceil(r));
  for (int dy = -ir; dy <= ir; ++dy) {
    for (int dx = -ir; dx <= ir; ++dx) {
      if (dx * dx + dy * dy <= r * r + 0.25) Set(cx + dx, cy + dy, c);
    }
  }
}

void Image::Line(Point a, Point b, Color c, double width, bool dashed) {
  // Bresenham between the rounded end points.
  int x0 = static_cast<int>(std::lround(a.x)), y0 = static_cast<int>(std::lround(a.y));
  const int x1 = static_cast<int>(std::lround(b.x)), y1 = static_cast<int>(std::lround(b.y));
  const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    if (!dashed || std::fmod(dash_phase_, 10.0) < 6.0) Stamp(x0, y0, c, width);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    const int px = x0, py = y0;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
    dash_phase_ += std::hypot(x0 - px, y0 - py);
  }
}

void Image::DrawText(const Text& t) {
  const int scale = t.size >= 14 ? 2 : 1;
  const double w = static_cast<double>(t.text.size()) * kGlyphAdvance * scale - scale;
  double x = t.at.x;
  if (t.anchor == Anchor::kMiddle) x -= w / 2;
  if (t.anchor == Anchor::kEnd) x -= w;
  const int top = static_cast<int>(std::lround(t.at.y)) - kGlyphHeight * scale;
  int left = static_cast<int>(std::lround(x));
  for (char ch : t.text) {
    const auto rows = Glyph(ch);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int col = 0; col < kGlyphWidth; ++col) {
        if (!(rows[row] & (0x10 >> col))) continue;
        for (int s = 0; s < scale * scale; ++s) {
          Set(left + col * scale + s % scale, top + row * scale + s / scale, t.color);
        }
      }
    }
    left += kGlyphAdvance * scale;
  }
}

Image Rasterize(const Drawing& d) {
  Image img(d.width, d.height, d.background);
  for (const Rect& r : d.rects) img.FillRect(r.x, r.y, r.w, r.h, r.fill);
  for (const Polyline& p : d.polylines) {
    img.ResetDash();
    if (p.points.size() == 1) img.Line(p.points[0], p.points[0], p.color, p.width, false);
    for (size_t i = 1; i < p.points.size(); ++i) {
      img.Line(p.points[i - 1], p.points[i], p.color, p.width, p.dashed);
    }
  }
  for (const Text& t : d.texts) img.DrawText(t);
  return img;
}

absl::StatusOr<std::string> EncodePng(const Image& image) {
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  Put32(ihdr, static_cast<uint32_t>(image.width()));
  Put32(ihdr, static_cast<uint32_t>(image.height()));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, filter 0, no interlace.
  Chunk(out, "IHDR", ihdr);

  // Each row: filter type 0 (none), then its pixels.
  const size_t row_bytes = static_cast<size_t>(image.width()) * 3;
  std::string raw;
  raw.reserve((row_bytes + 1) * image.height());
  for (int y = 0; y < image.height(); ++y) {
    raw += '\0';
    raw.append(reinterpret_cast<const char*>(image.pixels().data()) + y * row_bytes, row_bytes);
  }
  uLongf size = compressBound(raw.size());
  std::string z(size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &size,
                reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9) != Z_OK) {
    return absl::InternalError("zlib could not compress the image");
  }
  z.resize(size);
  Chunk(out, "IDAT", z);
  Chunk(out, "IEND", "");
  return out;
}

}  // namespace ddp::plot
