// Pictures of a Drawing, drawn with cairo (Debian's libcairo2): one painting routine
// for both formats, on an image surface for PNG and on an SVG surface for SVG, with
// anti-aliased lines and text in a real font (DejaVu Sans, through fontconfig).
//
// cairo's SVG keeps every line's coordinates, colour, width and dashes, but not the
// polylines' classes, and it draws text as glyph outlines rather than <text>: the
// picture looks the same in every viewer whatever fonts it has
// (docs/decisions/ddpctl.md, 150).
#ifndef DDP_CLIENT_PLOT_IMAGE_H_
#define DDP_CLIENT_PLOT_IMAGE_H_

#include <string>

#include "absl/status/statusor.h"
#include "client/plot/drawing.h"

namespace ddp::plot {

enum class ImageFormat { kPng, kSvg };

// The file's bytes: a PNG (8-bit RGB) or a standalone SVG 1.1 document of
// drawing.width x drawing.height pixels. INTERNAL, with cairo's reason, when cairo
// cannot draw it (no memory for a very large picture, say).
absl::StatusOr<std::string> RenderImage(const Drawing& drawing, ImageFormat format);

}  // namespace ddp::plot

#endif  // DDP_CLIENT_PLOT_IMAGE_H_
