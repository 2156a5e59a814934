// TensorBoard's event files, written without TensorFlow or TensorBoard.
//
// An event file is a sequence of TFRecords, each one serialized `tensorboard.Event`
// protocol buffer:
//
//   uint64 length (little-endian) | uint32 masked CRC32C of the length |
//   length bytes of data          | uint32 masked CRC32C of the data
//
// (masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, as TensorFlow's
// lib/hash/crc32c.h). The first event names the format (`file_version
// "brain.Event:2"`); the others carry a `Summary` of scalar values (`simple_value`) or
// of text (a string tensor with the "text" plugin's metadata). The messages are
// encoded here by field number (tensorboard/compat/proto/event.proto, summary.proto,
// tensor.proto): the few fields written do not justify a copy of those files.
//
// TensorBoard reads every file whose name holds "tfevents" in a run's directory; its
// own readers (EventAccumulator, tbparse) are what the tests check these against.
#ifndef DDP_COMMON_TENSORBOARD_EVENT_FILE_H_
#define DDP_COMMON_TENSORBOARD_EVENT_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace ddp::tensorboard {

// CRC-32C (Castagnoli), and TFRecord's masked form of it.
uint32_t Crc32c(std::string_view data);
uint32_t MaskedCrc32c(std::string_view data);

// One TFRecord holding `data`.
std::string Record(std::string_view data);

// Serialized `tensorboard.Event`s. Times are Unix seconds.
std::string FileVersionEvent(double wall_time);
std::string ScalarEvent(double wall_time, int64_t step, std::string_view tag, float value);
std::string TextEvent(double wall_time, int64_t step, std::string_view tag, std::string_view text);

// An event file built in memory and written in one go: `Write` puts it at `path`
// through a temporary file renamed over it, so TensorBoard never reads half a file and
// an export written again replaces the previous one. Default-constructed, it is a
// batch of events to append to a file begun elsewhere (`Take` them).
class EventFile {
 public:
  EventFile() = default;                 // No file_version event: a batch to append.
  explicit EventFile(double wall_time);  // Starts with the file_version event.
  void Scalar(double wall_time, int64_t step, std::string_view tag, float value);
  void Text(double wall_time, int64_t step, std::string_view tag, std::string_view text);
  absl::Status Write(const std::string& path) const;

  // The records so far, leaving the buffer empty.
  std::string Take() {
    events_ = 0;
    return std::exchange(bytes_, {});
  }

  const std::string& bytes() const { return bytes_; }
  int64_t events() const { return events_; }

 private:
  std::string bytes_;
  int64_t events_ = 0;
};

}  // namespace ddp::tensorboard

#endif  // DDP_COMMON_TENSORBOARD_EVENT_FILE_H_
