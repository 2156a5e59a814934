#include "worker/agent/event_buffer.h"

#include "google/protobuf/io/coded_stream.h"

namespace ddp {

size_t WireSize(const v1::ReportedEvent& event) {
  const size_t n = event.ByteSizeLong();
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(n) + n;
}

void EventBuffer::TrimLocked() {
  while (!queue_.empty() &&
         (queue_.size() > limits_.max_entries || bytes_ > limits_.max_bytes)) {
    bytes_ -= queue_.front().bytes;
    queue_.pop_front();
    ++dropped_;
    ++dropped_total_;
  }
}

void EventBuffer::Push(v1::ReportedEvent event) {
  const size_t n = WireSize(event);
  absl::MutexLock lock(&mu_);
  queue_.push_back({std::move(event), n});
  bytes_ += n;
  ++pushed_;
  TrimLocked();
}

std::vector<v1::ReportedEvent> EventBuffer::Take(size_t max_entries, size_t max_bytes,
                                                 int64_t* dropped) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ReportedEvent> out;
  size_t taken = 0;
  while (!queue_.empty() && out.size() < max_entries &&
         (out.empty() || taken + queue_.front().bytes <= max_bytes)) {
    taken += queue_.front().bytes;
    bytes_ -= queue_.front().bytes;
    out.push_back(std::move(queue_.front().event));
    queue_.pop_front();
  }
  *dropped = dropped_;
  dropped_ = 0;
  return out;
}

size_t EventBuffer::size() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

size_t EventBuffer::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t EventBuffer::pushed() const {
  absl::MutexLock lock(&mu_);
  return pushed_;
}

int64_t EventBuffer::departed() const {
  absl::MutexLock lock(&mu_);
  return pushed_ - static_cast<int64_t>(queue_.size());
}

int64_t EventBuffer::dropped_total() const {
  absl::MutexLock lock(&mu_);
  return dropped_total_;
}

}  // namespace ddp
