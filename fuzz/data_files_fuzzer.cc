// libFuzzer target: bytes -> the trainer's CSV reader, and the same bytes split into
// an IDX3 image file and an IDX1 label file -> the IDX header checks. Data files come
// from users; any input must end in a table, a shape or an error status.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "trainer/data_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  ddp::CsvSpec csv;
  csv.path = "fuzz.csv";
  csv.skip_rows = data[0] % 3;
  csv.label_column = static_cast<int8_t>(data[1]) % 8;
  std::istringstream in(bytes);
  auto table = ddp::ParseCsv(in, csv);
  if (table.ok() && table->columns > 0) {
    // The tensor the trainer builds: every row has columns - 1 features.
    if (table->features.size() != table->labels.size() * static_cast<size_t>(table->columns - 1)) {
      __builtin_trap();
    }
  }
  const size_t split = bytes.empty() ? 0 : data[0] % bytes.size();
  ddp::IdxSpec idx{"images", "labels"};
  auto shape = ddp::ParseIdxHeaders(bytes.substr(0, split), bytes.substr(split), idx, "data.idx");
  if (shape.ok() && 16 + static_cast<size_t>(shape->n * shape->rows * shape->cols) != split) {
    __builtin_trap();  // The trainer reads n*rows*cols pixels after the header.
  }
  return 0;
}
