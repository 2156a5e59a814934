#include "trainer/data_files.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ddp {
namespace {

uint32_t BigEndian32(const std::string& s, size_t off) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + off);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

absl::StatusOr<CsvTable> ParseCsv(std::istream& in, const CsvSpec& spec) {
  CsvTable t;
  t.columns = -1;
  int64_t label_col = 0;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no <= spec.skip_rows) continue;
    absl::string_view view = absl::StripAsciiWhitespace(line);
    if (view.empty()) continue;
    std::vector<absl::string_view> cells = absl::StrSplit(view, ',');
    if (t.columns < 0) {
      t.columns = static_cast<int64_t>(cells.size());
      if (t.columns < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.path, ":", line_no, ": need at least one feature and a label column"));
      }
      label_col = spec.label_column < 0 ? t.columns + spec.label_column : spec.label_column;
      if (label_col < 0 || label_col >= t.columns) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.csv.label_column: ", spec.label_column, " is out of range for ",
                         t.columns, " columns in ", spec.path));
      }
    } else if (static_cast<int64_t>(cells.size()) != t.columns) {
      return absl::InvalidArgumentError(absl::StrCat(spec.path, ":", line_no, ": expected ",
                                                     t.columns, " columns, found ", cells.size()));
    }
    for (int64_t c = 0; c < t.columns; ++c) {
      double v;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(cells[c]), &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(spec.path, ":", line_no, ": column ", c + 1, " is not a number: '",
                         cells[c], "' (a header line? set data.csv.skip_rows)"));
      }
      if (!std::isfinite(v) || std::fabs(v) > 3.4e38) {
        // nan/inf parse as numbers but would silently turn the loss into NaN (and a
        // double beyond float's range becomes inf as a feature).
        return absl::InvalidArgumentError(absl::StrCat(spec.path, ":", line_no, ": column ",
                                                       c + 1, " is '", cells[c],
                                                       "': values must be finite"));
      }
      if (c == label_col) {
        t.labels.push_back(v);
      } else {
        t.features.push_back(static_cast<float>(v));
      }
    }
  }
  if (t.labels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.path, ": no data rows"));
  }
  return t;
}

absl::StatusOr<IdxShape> ParseIdxHeaders(const std::string& images, const std::string& labels,
                                         const IdxSpec& spec, const std::string& field) {
  if (images.size() < 16 || BigEndian32(images, 0) != 0x00000803) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".images: '", spec.images, "' is not an IDX3 uint8 image file (bad magic)"));
  }
  if (labels.size() < 8 || BigEndian32(labels, 0) != 0x00000801) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".labels: '", spec.labels, "' is not an IDX1 uint8 label file (bad magic)"));
  }
  IdxShape s;
  s.n = BigEndian32(images, 4);
  s.rows = BigEndian32(images, 8);
  s.cols = BigEndian32(images, 12);
  const int64_t n_labels = BigEndian32(labels, 4);
  if (s.n != n_labels) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.n, " images but ", n_labels,
                                                   " labels"));
  }
  // Each factor is below 2^32: compare in 128 bits so that no header overflows the
  // product (the int64 product of the old check was undefined for headers such as the
  // fuzz seed idx_huge_header).
  const unsigned __int128 pixels =
      static_cast<unsigned __int128>(s.n) * static_cast<uint64_t>(s.rows) *
      static_cast<uint64_t>(s.cols);
  if (pixels + 16 != images.size() || static_cast<uint64_t>(s.n) + 8 != labels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": file sizes do not match their IDX headers (truncated?)"));
  }
  if (s.n == 0 || s.rows == 0 || s.cols == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the IDX files hold no images"));
  }
  return s;
}

}  // namespace ddp
