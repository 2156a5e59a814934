// Minimal leveled logging for ddp binaries and libraries.
//
// Abseil 20220623 (Debian 12) has no absl/log, and LibTorch defines bare LOG/CHECK
// macros, so ddp logs through DDP_LOG / DDP_CHECK only. Each record is one line on
// stderr, written with a single write(2) so lines from threads never interleave:
//
//   I1122 10:04:05.123456 agent.cc:87] worker w1 registered (incarnation 3f2a...)
#ifndef DDP_COMMON_LOGGING_H_
#define DDP_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace ddp {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// Records below this severity are dropped. Default kInfo; binaries may raise it.
void SetMinLogSeverity(LogSeverity severity);
// Prefix added to every record after the location, e.g. "[worker w1] ".
void SetLogPrefix(const std::string& prefix);

namespace logging_internal {

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  ~LogMessage();  // Emits the record; aborts after a kFatal record.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows the stream expression when the condition holds (used by DDP_CHECK).
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace ddp

#define DDP_LOG_SEVERITY_INFO ::ddp::LogSeverity::kInfo
#define DDP_LOG_SEVERITY_WARNING ::ddp::LogSeverity::kWarning
#define DDP_LOG_SEVERITY_ERROR ::ddp::LogSeverity::kError
#define DDP_LOG_SEVERITY_FATAL ::ddp::LogSeverity::kFatal

#define DDP_LOG(severity)                                                      \
  ::ddp::logging_internal::LogMessage(__FILE__, __LINE__,                      \
                                      DDP_LOG_SEVERITY_##severity)             \
      .stream()

// Aborts with the message when `cond` is false. For invariants only: recoverable
// errors are returned as absl::Status.
#define DDP_CHECK(cond)                                                        \
  (cond) ? (void)0                                                             \
         : ::ddp::logging_internal::Voidify() &                                \
               DDP_LOG(FATAL) << "Check failed: " #cond " "

#endif  // DDP_COMMON_LOGGING_H_
