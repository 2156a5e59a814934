#include "common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace ddp {
namespace {

std::atomic<int> g_min_severity{0};
std::mutex g_prefix_mu;
std::string* g_prefix = new std::string();  // Leaked: usable during static teardown.

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity));
}

void SetLogPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(g_prefix_mu);
  *g_prefix = prefix;
}

namespace logging_internal {

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() {
  if (static_cast<int>(severity_) < g_min_severity.load() &&
      severity_ != LogSeverity::kFatal) {
    return;
  }
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm_buf;
  localtime_r(&tv.tv_sec, &tm_buf);
  static constexpr char kLetters[] = {'I', 'W', 'E', 'F'};
  char header[96];
  std::snprintf(header, sizeof(header), "%c%02d%02d %02d:%02d:%02d.%06ld %s:%d] ",
                kLetters[static_cast<int>(severity_)], tm_buf.tm_mon + 1,
                tm_buf.tm_mday, tm_buf.tm_hour, tm_buf.tm_min, tm_buf.tm_sec,
                static_cast<long>(tv.tv_usec), Basename(file_), line_);
  std::string record(header);
  {
    std::lock_guard<std::mutex> lock(g_prefix_mu);
    record += *g_prefix;
  }
  record += stream_.str();
  record += '\n';
  // One write(2) per record keeps lines from concurrent threads whole.
  const char* data = record.data();
  size_t left = record.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) break;
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace logging_internal
}  // namespace ddp
