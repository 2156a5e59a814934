// The agent's outbox: trainer events and output lines waiting to be reported.
//
// Bounded in entries and in bytes: when the coordinator is unreachable for long, the
// oldest entries are dropped and counted (the count goes out with the next batch), so
// a chatty trainer can never grow the agent's memory without bound. Thread-safe: the
// output pump pushes, the event reporter takes.
#ifndef DDP_WORKER_AGENT_EVENT_BUFFER_H_
#define DDP_WORKER_AGENT_EVENT_BUFFER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

class EventBuffer {
 public:
  struct Limits {
    size_t max_entries = 50000;
    size_t max_bytes = 64 << 20;  // Serialized size of the entries held.
  };
  EventBuffer() : EventBuffer(Limits{}) {}
  explicit EventBuffer(Limits limits) : limits_(limits) {}

  void Push(v1::ReportedEvent event);
  // The oldest entries, up to `max_entries` and `max_bytes` of serialized events (at
  // least one, however large), and the drop count since the last Take.
  std::vector<v1::ReportedEvent> Take(size_t max_entries, size_t max_bytes, int64_t* dropped);
  size_t size() const;
  size_t bytes() const;
  // Entries ever pushed, and of those, the ones that have left: taken or dropped.
  // Events leave in push order, so every entry pushed before the pushed() count N has
  // left once departed() >= N.
  int64_t pushed() const;
  int64_t departed() const;
  // Entries dropped since the buffer was made (monitoring).
  int64_t dropped_total() const;

 private:
  struct Entry {
    v1::ReportedEvent event;
    size_t bytes;
  };
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
};

// What one event adds to a ReportEventsRequest on the wire (its field tag and length
// prefix included).
size_t WireSize(const v1::ReportedEvent& event);

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_EVENT_BUFFER_H_
