#include "client/plot/image.h"

#include <cairo-svg.h>
#include <cairo.h>

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace ddp::plot {
namespace {

// fontconfig picks the nearest installed face when this one is missing; scripts/
// install_deps.sh and the container images install it (fonts-dejavu-core).
constexpr char kFontFamily[] = "DejaVu Sans";
constexpr double kDash[] = {6, 4};

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* cr) const { cairo_destroy(cr); }
};

cairo_status_t Append(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

void SetColor(cairo_t* cr, Color c) {
  cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0);
}

// Job names and ids are user input, and cairo stops drawing altogether (the context
// goes into an error state) at the first invalid UTF-8; control characters would show
// as the font's empty boxes.
std::string Printable(const std::string& s) {
  std::string out;
  for (char c : ToValidUtf8(s)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) out += c;
  }
  return out;
}

// A line one pixel wide or less that runs only along rows and columns (the grid and
// the axes): drawn through pixel centres it fills one row or column; on a whole-pixel
// coordinate it would smear over two at half strength.
bool IsHairlineGridLine(const Polyline& p) {
  if (p.width > 1) return false;
  for (size_t i = 1; i < p.points.size(); ++i) {
    if (p.points[i].x != p.points[i - 1].x && p.points[i].y != p.points[i - 1].y) return false;
  }
  return true;
}

// The one painting routine of both formats.
void Paint(cairo_t* cr, const Drawing& d) {
  SetColor(cr, d.background);
  cairo_paint(cr);
  for (const Rect& r : d.rects) {
    cairo_rectangle(cr, r.x, r.y, r.w, r.h);
    SetColor(cr, r.fill);
    cairo_fill(cr);
  }
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_BUTT);
  for (const Polyline& p : d.polylines) {
    if (p.points.size() < 2) continue;  // A single point draws nothing, as in SVG.
    const bool snap = IsHairlineGridLine(p);
    cairo_new_path(cr);
    for (const Point& pt : p.points) {
      const double x = snap ? std::floor(pt.x) + 0.5 : pt.x;
      const double y = snap ? std::floor(pt.y) + 0.5 : pt.y;
      cairo_line_to(cr, x, y);  // Without a current point, the first is a move_to.
    }
    cairo_set_line_width(cr, p.width);
    cairo_set_dash(cr, kDash, p.dashed ? 2 : 0, 0);
    SetColor(cr, p.color);
    cairo_stroke(cr);
  }
  cairo_select_font_face(cr, kFontFamily, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  for (const Text& t : d.texts) {
    const std::string text = Printable(t.text);
    if (text.empty()) continue;
    cairo_set_font_size(cr, t.size);
    double x = t.at.x;
    if (t.anchor != Anchor::kStart) {
      cairo_text_extents_t extents;
      cairo_text_extents(cr, text.c_str(), &extents);
      x -= t.anchor == Anchor::kMiddle ? extents.x_advance / 2 : extents.x_advance;
    }
    cairo_move_to(cr, x, t.at.y);  // The baseline.
    SetColor(cr, t.color);
    cairo_show_text(cr, text.c_str());
    cairo_new_path(cr);
  }
}

}  // namespace

absl::StatusOr<std::string> RenderImage(const Drawing& drawing, ImageFormat format) {
  const bool svg = format == ImageFormat::kSvg;
  std::string out;
  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(
      svg ? cairo_svg_surface_create_for_stream(Append, &out, drawing.width, drawing.height)
          : cairo_image_surface_create(CAIRO_FORMAT_RGB24, drawing.width, drawing.height));
  if (svg) {
    cairo_svg_surface_restrict_to_version(surface.get(), CAIRO_SVG_VERSION_1_1);
    // Pixels, as the PNG's; cairo 1.16 would write points.
    cairo_svg_surface_set_document_unit(surface.get(), CAIRO_SVG_UNIT_PX);
  }
  cairo_status_t status = cairo_surface_status(surface.get());
  if (status == CAIRO_STATUS_SUCCESS) {
    std::unique_ptr<cairo_t, ContextDeleter> cr(cairo_create(surface.get()));
    Paint(cr.get(), drawing);
    status = cairo_status(cr.get());
  }
  if (status == CAIRO_STATUS_SUCCESS) {
    if (svg) {
      cairo_surface_finish(surface.get());  // Writes the document's end.
      status = cairo_surface_status(surface.get());
    } else {
      status = cairo_surface_write_to_png_stream(surface.get(), Append, &out);
    }
  }
  if (status != CAIRO_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cannot draw the ", drawing.width, "x",
                                            drawing.height, svg ? " SVG" : " PNG",
                                            " picture: cairo: ", cairo_status_to_string(status)));
  }
  return out;
}

}  // namespace ddp::plot
