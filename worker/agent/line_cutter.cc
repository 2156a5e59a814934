#include "worker/agent/line_cutter.h"

#include <algorithm>
#include <cstring>

#include "common/utf8.h"

namespace ddp {

void LineCutter::Append(const char* data, size_t n) {
  const size_t room = max_line_ - pending_.size();
  if (cut_ == 0 && n <= room) {
    pending_.append(data, n);
    return;
  }
  if (cut_ == 0) {
    // Crossing the limit: keep what fits, ending on a character boundary (a few
    // bytes past the limit show whether a character straddles it).
    const size_t look = std::min(n, room + 4);
    pending_.append(data, look);
    const size_t keep = Utf8SafeCut(pending_, max_line_);
    cut_ = static_cast<int64_t>(pending_.size() - keep) + static_cast<int64_t>(n - look);
    pending_.resize(keep);
    return;
  }
  cut_ += static_cast<int64_t>(n);
}

void LineCutter::Feed(const char* data, size_t n, const Sink& sink) {
  const char* end = data + n;
  while (data < end) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', end - data));
    if (nl == nullptr) {
      Append(data, end - data);
      return;
    }
    Append(data, nl - data);
    sink(pending_, cut_);
    pending_.clear();
    cut_ = 0;
    data = nl + 1;
  }
}

void LineCutter::Flush(const Sink& sink) {
  if (!pending_.empty() || cut_ > 0) sink(pending_, cut_);
  pending_.clear();
  cut_ = 0;
}

}  // namespace ddp
