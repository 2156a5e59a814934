#include "common/jobspec/job_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"

namespace ddp {

absl::Status CheckJobText(absl::string_view text, const std::string& source, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        source, " is ", text.size(), " bytes; a job file may have at most ", max_bytes,
        " (the spec size limit): keep data and models in files the job names"));
  }
  int line = 1, column = 1;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t n = Utf8CharLength(std::string_view(text.data(), text.size()), i);
    if (n == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: not UTF-8 text (byte 0x%02x at column %d): save the job file as UTF-8",
          source, line, c, column));
    }
    if (n == 1 && ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: control character 0x%02x at column %d: a job file is plain text", source,
          line, c, column));
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += n;
  }
  return absl::OkStatus();
}

bool HasControlCharacter(absl::string_view s) {
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t') || c == 0x7F) return true;
  }
  return false;
}

}  // namespace ddp
