#include "client/plot/drawing.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp::plot {
namespace {

// XML text and attribute values: job names and ids are user input.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        // XML 1.0 forbids most control characters, even escaped.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

}  // namespace

std::string Color::Hex() const { return absl::StrFormat("#%02x%02x%02x", r, g, b); }

Color RankColor(int rank) {
  static const Color kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},
                                   {214, 39, 40},   {148, 103, 189}, {140, 86, 75},
                                   {227, 119, 194}, {23, 190, 207},  {0, 0, 139},
                                   {128, 128, 0}};
  constexpr int kN = sizeof(kPalette) / sizeof(kPalette[0]);
  if (rank >= 0 && rank < kN) return kPalette[rank];
  // HSV with s = 0.75, v = 0.8 and hue stepped by the golden angle.
  const double h = std::fmod(std::max(rank, 0) * 137.508, 360.0) / 60.0;
  const double v = 0.8, c = v * 0.75, x = c * (1 - std::fabs(std::fmod(h, 2.0) - 1)), m = v - c;
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(h)) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x; break;
  }
  auto byte = [m](double u) { return static_cast<uint8_t>(std::lround((u + m) * 255)); };
  return {byte(r), byte(g), byte(b)};
}

std::string RenderSvg(const Drawing& d) {
  std::string out = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"",
      d.width, "\" height=\"", d.height, "\" viewBox=\"0 0 ", d.width, " ", d.height,
      "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n");
  absl::StrAppend(&out, "<rect x=\"0\" y=\"0\" width=\"", d.width, "\" height=\"", d.height,
                  "\" fill=\"", d.background.Hex(), "\"/>\n");
  for (const Rect& r : d.rects) {
    absl::StrAppend(&out, "<rect x=\"", Num(r.x), "\" y=\"", Num(r.y), "\" width=\"", Num(r.w),
                    "\" height=\"", Num(r.h), "\" fill=\"", r.fill.Hex(), "\"/>\n");
  }
  for (const Polyline& p : d.polylines) {
    absl::StrAppend(&out, "<polyline class=\"", Escape(p.cls), "\"");
    if (p.rank >= 0) absl::StrAppend(&out, " data-rank=\"", p.rank, "\"");
    absl::StrAppend(&out, " fill=\"none\" stroke=\"", p.color.Hex(), "\" stroke-width=\"",
                    Num(p.width), "\" stroke-linejoin=\"round\"");
    if (p.dashed) absl::StrAppend(&out, " stroke-dasharray=\"6 4\"");
    out += " points=\"";
    for (size_t i = 0; i < p.points.size(); ++i) {
      absl::StrAppend(&out, i ? " " : "", Num(p.points[i].x), ",", Num(p.points[i].y));
    }
    out += "\"/>\n";
  }
  for (const Text& t : d.texts) {
    const char* anchor = t.anchor == Anchor::kStart    ? "start"
                         : t.anchor == Anchor::kMiddle ? "middle"
                                                       : "end";
    absl::StrAppend(&out, "<text x=\"", Num(t.at.x), "\" y=\"", Num(t.at.y), "\" font-size=\"",
                    t.size, "\" fill=\"", t.color.Hex(), "\" text-anchor=\"", anchor, "\">",
                    Escape(t.text), "</text>\n");
  }
  out += "</svg>\n";
  return out;
}

}  // namespace ddp::plot
