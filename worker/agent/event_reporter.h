// Sends the agent's outbox (trainer events and output lines) to the coordinator from
// a thread of its own, so that a slow, hung or failing ReportEvents never delays a
// heartbeat.
//
// Lifecycle: constructed paused ──Resume(deadline)──▶ sending ──Pause()──▶ paused ...
// ──destructor──▶ the thread is joined; whatever is unsent stays unsent. The agent
// resumes it once registered and pauses it when the coordinator forgot the worker.
//
// Batches are numbered per incarnation (batch_seq 1, 2, ...) and hold at most
// `max_batch_events` events and `max_batch_bytes` bytes, far below gRPC's 4 MB receive
// limit on the coordinator. A batch that fails in transit (UNAVAILABLE, a deadline) is
// re-sent unchanged after a jittered backoff: the coordinator drops repeats by number.
// A batch the coordinator rejects as malformed (INVALID_ARGUMENT; INTERNAL, which is
// what gRPC answers when a request does not parse; RESOURCE_EXHAUSTED, too large) is
// split in halves, and a single event rejected twice is dropped: counted in the next
// batch's `dropped`, in rejected(), and told to its job's log. So no batch is ever
// re-sent forever.
#ifndef DDP_WORKER_AGENT_EVENT_REPORTER_H_
#define DDP_WORKER_AGENT_EVENT_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/agent/backoff.h"
#include "worker/agent/coordinator_client.h"
#include "worker/agent/event_buffer.h"

namespace ddp {

class EventReporter {
 public:
  struct Options {
    std::string worker;
    std::string incarnation;
    size_t max_batch_events = 2000;
    size_t max_batch_bytes = 1 << 20;
    absl::Duration min_backoff = absl::Milliseconds(50);  // After a failed send...
    absl::Duration max_backoff = absl::Seconds(1);        // ...doubling up to this.
  };

  // `on_delivered` runs (on the reporter's thread, no lock held) whenever delivered()
  // grows, so the agent can report exits that waited for that output.
  EventReporter(Options options, EventBuffer* buffer, CoordinatorClient* client,
                std::function<void()> on_delivered);
  ~EventReporter();
  EventReporter(const EventReporter&) = delete;
  EventReporter& operator=(const EventReporter&) = delete;

  // Sends while there is output, each call bounded by `deadline`.
  void Resume(absl::Duration deadline);
  void Pause();
  // The buffer got something (called by the output pump, or anyone who pushed).
  void Wake();

  // Events that left the outbox and reached the coordinator, or were dropped (by the
  // buffer when full, or after the coordinator rejected them). Comparable with
  // EventBuffer::pushed(): every event pushed before that count N is delivered once
  // delivered() >= N.
  int64_t delivered() const;
  // Events dropped because the coordinator rejected them as malformed.
  int64_t rejected() const;
  // Waits until everything pushed so far has been sent (true), or a send failed
  // after the call began, or `timeout` passed (false). For shutdown.
  bool Drain(absl::Duration timeout);

 private:
  struct Batch {
    v1::ReportEventsRequest request;
    int rejections = 0;  // Times the coordinator rejected this exact batch.
  };
  void Loop();
  // The next batch to send (the oldest unsent, or a new one from the buffer).
  Batch* NextBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a rejection as malformed: split the front batch, or drop its one event.
  void HandleRejectedLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t InFlightLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  EventBuffer* const buffer_;
  CoordinatorClient* const client_;
  const std::function<void()> on_delivered_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  int64_t wakes_ ABSL_GUARDED_BY(mu_) = 0;  // Pushes since the last look at the buffer.
  absl::Duration deadline_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  // Taken from the buffer, not yet accepted by the coordinator; the front is sent next.
  std::deque<Batch> unsent_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_unreported_ ABSL_GUARDED_BY(mu_) = 0;  // For the next batch's `dropped`.
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;             // Failed sends, ever.
  Backoff backoff_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_EVENT_REPORTER_H_
