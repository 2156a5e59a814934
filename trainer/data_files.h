// The byte-level parsing of ddp-trainer's data files, with no LibTorch: CSV tables and
// IDX (MNIST) headers. dataset.cc turns the results into tensors; the fuzz targets
// feed these functions arbitrary bytes.
#ifndef DDP_TRAINER_DATA_FILES_H_
#define DDP_TRAINER_DATA_FILES_H_

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"

namespace ddp {

// A CSV table: row-major features (every column but the label) and the labels.
struct CsvTable {
  std::vector<float> features;
  std::vector<double> labels;
  int64_t columns = 0;  // Including the label column.
};

// Reads CSV rows from `in` as data.csv describes them (skip_rows, label_column).
// INVALID_ARGUMENT naming `spec.path` and the line for ragged rows, cells that are
// not finite numbers, a label column out of range, or no rows at all.
absl::StatusOr<CsvTable> ParseCsv(std::istream& in, const CsvSpec& spec);

// The shape an IDX3 image file and its IDX1 label file declare, checked against the
// files' sizes (without overflow, whatever the headers say).
struct IdxShape {
  int64_t n = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// `images` and `labels` are the files' (decompressed) bytes; `field` names them in
// errors ("data.idx"). INVALID_ARGUMENT for bad magic, mismatched counts or sizes.
absl::StatusOr<IdxShape> ParseIdxHeaders(const std::string& images, const std::string& labels,
                                         const IdxSpec& spec, const std::string& field);

}  // namespace ddp

#endif  // DDP_TRAINER_DATA_FILES_H_
