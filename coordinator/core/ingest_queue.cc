#include "coordinator/core/ingest_queue.h"

#include <iterator>
#include <utility>

namespace ddp {

IngestQueue::IngestQueue(EventHub* hub) : hub_(hub) {
  thread_ = std::thread([this] { Loop(); });
}

IngestQueue::~IngestQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void IngestQueue::Post(std::vector<v1::ReportedEvent> events,
                       std::function<void(absl::Status)> done,
                       BatchMark mark) {
  absl::MutexLock lock(&mu_);
  ++stats_.batches;
  queue_.push_back({std::move(events), std::move(done), std::move(mark)});
}

IngestQueue::Stats IngestQueue::stats() {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void IngestQueue::Loop() {
  while (true) {
    std::vector<Batch> batches;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // Stopped, and nothing left to store.
      batches.swap(queue_);
      ++stats_.ingests;
    }
    std::vector<v1::ReportedEvent> events;
    std::vector<BatchMark> marks;
    for (Batch& b : batches) {
      events.insert(events.end(), std::make_move_iterator(b.events.begin()),
                    std::make_move_iterator(b.events.end()));
      if (b.mark.batch_seq > 0) marks.push_back(std::move(b.mark));
    }
    absl::Status stored;
    if (!events.empty() || !marks.empty()) stored = hub_->Ingest(events, marks);
    for (Batch& b : batches) b.done(stored);
  }
}

}  // namespace ddp
