// The agent's outbox: trainer events and output lines waiting to be reported.
//
// Bounded: when the coordinator is unreachable for long, the oldest entries are
// dropped and counted (the count is reported with the next batch), so a chatty
// trainer can never grow the agent's memory without bound. Thread-safe: the output
// pump pushes, the agent loop takes.
#ifndef DDP_WORKER_AGENT_EVENT_BUFFER_H_
#define DDP_WORKER_AGENT_EVENT_BUFFER_H_

#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

class EventBuffer {
 public:
  explicit EventBuffer(size_t capacity = 50000) : capacity_(capacity) {}

  void Push(v1::ReportedEvent event);
  // Up to `max` of the oldest entries, and the drop count since the last Take.
  std::vector<v1::ReportedEvent> Take(size_t max, int64_t* dropped);
  // Returns a batch that could not be sent, in front of newer entries.
  void PutBack(std::vector<v1::ReportedEvent> events, int64_t dropped);
  size_t size() const;
  // Entries ever pushed, and of those, the ones that have left: taken (net of those
  // put back) or dropped. Events leave in push order, so every entry pushed before
  // the pushed() count N has left once departed() >= N.
  int64_t pushed() const;
  int64_t departed() const;

 private:
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<v1::ReportedEvent> queue_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_EVENT_BUFFER_H_
