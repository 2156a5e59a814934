// Makes text from the coordinator safe to print on a terminal.
//
// Trainer output, worker names, reasons and error messages come from processes
// ddpctl does not trust; printed raw, escape sequences in them could rewrite the
// screen, retitle the window, or hide text. ddpctl passes everything it receives
// through SanitizeMessage() before rendering it, in every output format.
#ifndef DDP_CLIENT_SANITIZE_H_
#define DDP_CLIENT_SANITIZE_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace ddp {

// Removes terminal control sequences (ESC-introduced: CSI, OSC, DCS and the like,
// and their 8-bit C1 forms), every other control character except tab and newline,
// and Unicode bidirectional overrides; replaces bytes that are not UTF-8 with U+FFFD.
std::string SanitizeText(absl::string_view text);

// SanitizeText() on every string field of `message`, recursively (maps included).
void SanitizeMessage(google::protobuf::Message* message);

}  // namespace ddp

#endif  // DDP_CLIENT_SANITIZE_H_
