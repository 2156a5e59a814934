// Checks on a job file's raw bytes, made before any YAML is parsed: its size (a
// 3.8 MB flow list costs seconds and ~1 GiB to parse), and that it is UTF-8 text
// without control characters (YAML's own rule, which yaml-cpp does not enforce).
#ifndef DDP_COMMON_JOBSPEC_JOB_TEXT_H_
#define DDP_COMMON_JOBSPEC_JOB_TEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddp {

// RESOURCE_EXHAUSTED over `max_bytes`; INVALID_ARGUMENT "<source>:<line>: ..." for
// bytes that are not UTF-8 or a control character other than tab, CR and LF.
absl::Status CheckJobText(absl::string_view text, const std::string& source, size_t max_bytes);

// Whether `s` holds a control character (C0 other than tab, DEL); such characters
// are refused in every string field (a NUL would cut a path short in the trainer).
bool HasControlCharacter(absl::string_view s);

}  // namespace ddp

#endif  // DDP_COMMON_JOBSPEC_JOB_TEXT_H_
