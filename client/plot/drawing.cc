#include "client/plot/drawing.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace ddp::plot {

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

}  // namespace ddp::plot
