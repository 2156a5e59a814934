#include "worker/agent/event_buffer.h"

namespace ddp {

void EventBuffer::TrimLocked() {
  while (queue_.size() > capacity_) {
    queue_.pop_front();
    ++dropped_;
  }
}

void EventBuffer::Push(v1::ReportedEvent event) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(event));
  ++pushed_;
  TrimLocked();
}

std::vector<v1::ReportedEvent> EventBuffer::Take(size_t max, int64_t* dropped) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ReportedEvent> out;
  while (!queue_.empty() && out.size() < max) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  *dropped = dropped_;
  dropped_ = 0;
  return out;
}

void EventBuffer::PutBack(std::vector<v1::ReportedEvent> events, int64_t dropped) {
  absl::MutexLock lock(&mu_);
  for (auto it = events.rbegin(); it != events.rend(); ++it) queue_.push_front(std::move(*it));
  dropped_ += dropped;
  TrimLocked();
}

size_t EventBuffer::size() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

int64_t EventBuffer::pushed() const {
  absl::MutexLock lock(&mu_);
  return pushed_;
}

int64_t EventBuffer::departed() const {
  absl::MutexLock lock(&mu_);
  return pushed_ - static_cast<int64_t>(queue_.size());
}

}  // namespace ddp
