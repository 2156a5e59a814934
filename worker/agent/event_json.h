// A JSON reader for the event lines that trainers and users' programs write
// (docs/command-jobs.md): one JSON text (RFC 8259) into a google::protobuf::Struct,
// in time linear in its length, nesting at most `max_depth` arrays and objects deep.
//
// Why not protobuf's JsonStringToMessage: its cost grows with the square of the
// nesting depth (a 60 KB line of 30,000 nested brackets took minutes), and a line
// from a user's program is untrusted input read on the thread that relays every
// rank's output. Nothing here allocates more than a small multiple of the line.
#ifndef DDP_WORKER_AGENT_EVENT_JSON_H_
#define DDP_WORKER_AGENT_EVENT_JSON_H_

#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/struct.pb.h"

namespace ddp {

// Event lines nest two or three levels (an object in a field, a list of them); 32 is
// room to spare for a program's own fields, and bounds the reader's recursion.
inline constexpr int kMaxEventJsonDepth = 32;

// Parses `text`, which must be one JSON object (whitespace around it allowed), into
// `out`. A key given twice keeps its last value. \u escapes become UTF-8 (a lone
// surrogate becomes U+FFFD). InvalidArgument names the first problem and its byte
// offset: "expected ',' or '}' at byte 17", "nested deeper than 32 levels at byte 33",
// "number out of range at byte 9".
absl::Status ParseJsonObject(std::string_view text, google::protobuf::Struct* out,
                             int max_depth = kMaxEventJsonDepth);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_EVENT_JSON_H_
