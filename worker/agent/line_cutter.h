// Splits a trainer's output into lines, cutting the ones that are too long.
//
// A trainer may print a 10 MB line (a tensor dumped whole) or never print a newline.
// Such a line is cut to its first `max_line` bytes (never half a character), the rest
// is skipped without being kept, and the sink hears how many bytes were dropped, so
// the line that reaches the user says it was cut. Memory stays bounded by max_line.
#ifndef DDP_WORKER_AGENT_LINE_CUTTER_H_
#define DDP_WORKER_AGENT_LINE_CUTTER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ddp {

class LineCutter {
 public:
  // `line` without its '\n'; `cut_bytes` > 0 when the line was longer than max_line.
  using Sink = std::function<void(std::string_view line, int64_t cut_bytes)>;

  explicit LineCutter(size_t max_line) : max_line_(max_line) {}

  void Feed(const char* data, size_t n, const Sink& sink);
  // Emits a final unterminated line, if any (at end of stream).
  void Flush(const Sink& sink);

 private:
  void Append(const char* data, size_t n);

  const size_t max_line_;
  std::string pending_;  // At most max_line_ bytes.
  int64_t cut_ = 0;      // Bytes of the current line dropped past max_line_.
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_LINE_CUTTER_H_
