// A 5x7 bitmap font (printable ASCII less a few symbols) for text in PNG plots, so
// rendering needs no font files on the machine.
#ifndef DDP_CLIENT_PLOT_BITMAP_FONT_H_
#define DDP_CLIENT_PLOT_BITMAP_FONT_H_

#include <array>
#include <cstdint>

namespace ddp::plot {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 7;
inline constexpr int kGlyphAdvance = 6;  // One column of spacing.

// Seven rows, top first; bit 4 is the leftmost column. Characters without a glyph
// (and space) are blank.
std::array<uint8_t, kGlyphHeight> Glyph(char c);

}  // namespace ddp::plot

#endif  // DDP_CLIENT_PLOT_BITMAP_FONT_H_
