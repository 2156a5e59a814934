#include "common/tensorboard/event_file.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace ddp::tensorboard {
namespace {

constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // Reflected.
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

// Protocol buffer wire format: just what the messages below use.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void Key(std::string& out, uint32_t field, WireType type) { Varint(out, (field << 3) | type); }
void Bytes(std::string& out, uint32_t field, std::string_view bytes) {
  Key(out, field, kLengthDelimited);
  Varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}
template <typename T>
void Fixed(std::string& out, uint32_t field, T value) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  Key(out, field, sizeof(T) == 8 ? kFixed64 : kFixed32);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // Little-endian hosts only (x86-64, aarch64).
  out.append(raw, sizeof(T));
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5.
std::string EventHead(double wall_time, int64_t step) {
  std::string e;
  Fixed(e, 1, wall_time);
  if (step != 0) {
    Key(e, 2, kVarint);
    Varint(e, static_cast<uint64_t>(step));
  }
  return e;
}
// Summary: repeated Value value = 1.
std::string SummaryEvent(double wall_time, int64_t step, const std::string& value) {
  std::string summary;
  Bytes(summary, 1, value);
  std::string e = EventHead(wall_time, step);
  Bytes(e, 5, summary);
  return e;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string Record(std::string_view data) {
  std::string out;
  char len[8];
  const uint64_t n = data.size();
  std::memcpy(len, &n, 8);
  out.append(len, 8);
  char crc[4];
  const uint32_t len_crc = MaskedCrc32c(std::string_view(len, 8));
  std::memcpy(crc, &len_crc, 4);
  out.append(crc, 4);
  out.append(data.data(), data.size());
  const uint32_t data_crc = MaskedCrc32c(data);
  std::memcpy(crc, &data_crc, 4);
  out.append(crc, 4);
  return out;
}

std::string FileVersionEvent(double wall_time) {
  std::string e = EventHead(wall_time, 0);
  Bytes(e, 3, "brain.Event:2");
  return e;
}

std::string ScalarEvent(double wall_time, int64_t step, std::string_view tag, float value) {
  // Value: tag = 1, simple_value = 2 (float).
  std::string v;
  Bytes(v, 1, tag);
  Fixed(v, 2, value);
  return SummaryEvent(wall_time, step, v);
}

std::string TextEvent(double wall_time, int64_t step, std::string_view tag, std::string_view text) {
  // Value: tag = 1, tensor = 8, metadata = 9 (SummaryMetadata: plugin_data = 1
  // {plugin_name = 1}). TensorProto: dtype = 1 (DT_STRING = 7), tensor_shape = 2
  // (empty: a scalar), string_val = 8.
  std::string plugin;
  Bytes(plugin, 1, "text");
  std::string metadata;
  Bytes(metadata, 1, plugin);
  std::string tensor;
  Key(tensor, 1, kVarint);
  Varint(tensor, 7);
  Bytes(tensor, 2, "");
  Bytes(tensor, 8, text);
  std::string v;
  Bytes(v, 1, tag);
  Bytes(v, 8, tensor);
  Bytes(v, 9, metadata);
  return SummaryEvent(wall_time, step, v);
}

EventFile::EventFile(double wall_time) {
  bytes_ = Record(FileVersionEvent(wall_time));
  events_ = 1;
}

void EventFile::Scalar(double wall_time, int64_t step, std::string_view tag, float value) {
  bytes_ += Record(ScalarEvent(wall_time, step, tag, value));
  ++events_;
}

void EventFile::Text(double wall_time, int64_t step, std::string_view tag, std::string_view text) {
  bytes_ += Record(TextEvent(wall_time, step, tag, text));
  ++events_;
}

absl::Status EventFile::Write(const std::string& path) const {
  // Not named *tfevents*: TensorBoard would read it while it is written.
  const size_t slash = path.rfind('/');
  const std::string tmp = absl::StrCat(slash == std::string::npos ? "" : path.substr(0, slash + 1),
                                       ".ddp-event-file.tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    out.write(bytes_.data(), static_cast<std::streamsize>(bytes_.size()));
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace ddp::tensorboard
