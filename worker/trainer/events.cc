#include "worker/trainer/events.h"

#include <errno.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ddp {

EventSink::EventSink(int fd, int rank) : fd_(fd < 0 ? STDOUT_FILENO : fd), rank_(rank) {}

JsonObject EventSink::Make(const char* type) const {
  JsonObject o;
  o.Add("type", type).Add("rank", rank_).Add("time", absl::ToDoubleSeconds(absl::Now() -
                                                                          absl::UnixEpoch()));
  return o;
}

void EventSink::Emit(const JsonObject& event) {
  std::string line = event.Line();
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return;
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace ddp
