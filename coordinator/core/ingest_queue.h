// Trainer events on their way to the EventHub, off gRPC's threads.
//
// ReportEvents checks a batch under the coordinator's lock (worker, incarnation,
// batch_seq, error rows) and queues its events here. One thread hands them to the hub,
// which stores them in SQLite: every batch that queued meanwhile in one go (one
// transaction per job, however many workers sent them), then answers each batch's
// caller. So no gRPC thread ever waits on SQLite (a slow commit delays answers instead
// of stalling the server, whose few threads also serve heartbeats), and a batch is
// still answered only once it is stored.
//
// Lifecycle: the thread starts in the constructor; the destructor ingests what is
// queued, answers every caller and joins. Destroy it before the hub.
#ifndef DDP_COORDINATOR_CORE_INGEST_QUEUE_H_
#define DDP_COORDINATOR_CORE_INGEST_QUEUE_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/core/event_hub.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

class IngestQueue {
 public:
  explicit IngestQueue(EventHub* hub);
  ~IngestQueue();
  IngestQueue(const IngestQueue&) = delete;
  IngestQueue& operator=(const IngestQueue&) = delete;

  // Queues `events` (in order after those posted before) and runs `done` on the
  // queue's thread once the hub has them, with whether the store took them (an error:
  // the sender should send them again). `done` must not block. `mark` (a numbered
  // batch; batch_seq 0: none) is stored in the events' transaction.
  void Post(std::vector<v1::ReportedEvent> events, std::function<void(absl::Status)> done,
            BatchMark mark = {});

  struct Stats {
    int64_t batches = 0;  // Posted.
    int64_t ingests = 0;  // Hub ingestions (each covering one or more batches).
  };
  Stats stats();

 private:
  struct Batch {
    std::vector<v1::ReportedEvent> events;
    std::function<void(absl::Status)> done;
    BatchMark mark;
  };
  void Loop();

  EventHub* const hub_;
  absl::Mutex mu_;
  std::vector<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_INGEST_QUEUE_H_
