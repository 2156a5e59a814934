// Fan-out of trainer metrics and output to any number of watchers.
//
// Workers' event batches come in through Ingest(): step events update each rank's
// latest metrics, epoch events the epoch history, and output lines (plus notable
// events rendered as lines) get a per-job sequence number. Everything is written to
// the Store and kept in memory (latest metrics, a bounded ring of recent lines)
// for live readers.
//
// Watchers never slow training or each other: the hub only *notifies* a listener
// that its job changed (a non-blocking call, made after the hub's lock is released);
// each watcher then pulls the latest state at its own pace. A slow watcher reads the
// newest metrics once instead of a backlog, and a log follower that falls behind the
// ring reads older lines from SQLite.
//
// Memory: a job's feed (latest metrics, epochs, the ring) is created when the job
// first reports or is read, and kept while the job is live or has listeners. Once
// the coordinator marks the job finished, its feed is freed whenever no listener
// remains; reads load what they need from SQLite again. The hub creates feeds only
// for jobs the coordinator hands it (it filters events of unknown jobs), and
// listeners are kept apart from feeds, so watching an unknown id leaves nothing.
#ifndef DDP_COORDINATOR_CORE_EVENT_HUB_H_
#define DDP_COORDINATOR_CORE_EVENT_HUB_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/store/store.h"
#include "ddp/v1/types.pb.h"
#include "ddp/v1/worker_service.pb.h"

namespace ddp {

class EventHub {
 public:
  // Told that a job changed. Notify() must not block; it runs on the ingesting thread.
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void Notify() = 0;
  };

  struct Options {
    size_t live_log_lines = 5000;  // Per job, in memory.
  };

  // Where stored points go besides watchers (coordinator/tracking/: TensorBoard's event
  // files). Told, after the hub's lock is released, of every batch the store took
  // (each point once: a batch the store refused is sent again by its worker, and told
  // then) and of every change of a job (Touch). Must not block: a sink queues and
  // does its work on a thread of its own.
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual void Stored(const std::vector<JobOutput>& outputs) = 0;
    virtual void Changed(const std::string& job_id) = 0;
  };

  EventHub(Store* store, Clock* clock, Options options);

  void Subscribe(const std::string& job_id, std::shared_ptr<Listener> listener);
  void Unsubscribe(const std::string& job_id, const Listener* listener);

  // `sink` is told from the next Ingest or Touch on; once RemoveSink returns it is told
  // nothing more (so it may be destroyed).
  void AddSink(Sink* sink);
  void RemoveSink(Sink* sink);

  // Records workers' batches and wakes the listeners of the jobs they touched. The
  // events and `marks` (the batches' numbers) are stored in one transaction.
  // Returns whether the store took them (the feeds have them either way).
  absl::Status Ingest(const std::vector<v1::ReportedEvent>& events,
              const std::vector<BatchMark>& marks = {});
  // Wakes a job's listeners (its state changed).
  void Touch(const std::string& job_id);

  // Copies the latest metrics of `attempt`'s ranks and the epoch history into `job`.
  void Fill(const std::string& job_id, int attempt, v1::Job* job);
  // Output lines with seq > after_seq (of `rank` if set), oldest first, at most `limit`.
  std::vector<v1::LogLine> Logs(const std::string& job_id, int64_t after_seq,
                                std::optional<int> rank, int64_t limit);
  // The seq after which the last `tail` lines (of `rank` if set) begin.
  int64_t TailStart(const std::string& job_id, std::optional<int> rank, int64_t tail);
  // The job is finished: free its feed whenever it has no listener.
  void MarkFinished(const std::string& job_id);
  // The job is deleted: drop its feed and what the hub knows of it.
  void Forget(const std::string& job_id);

  // What the hub holds in memory (monitoring and tests).
  struct Stats {
    size_t feeds = 0;         // Jobs with metrics, epochs and lines in memory.
    size_t watched_jobs = 0;  // Jobs with listeners.
  };
  Stats stats();

 private:
  struct Feed {
    bool loaded = false;
    int metrics_attempt = 0;             // Attempt `latest` belongs to.
    std::map<int, v1::RankMetrics> latest;
    std::vector<v1::EpochSummary> epochs;
    std::deque<v1::LogLine> ring;        // The newest lines.
    int64_t last_seq = 0;
  };
  // The job's feed, created (and loaded from the store) if it is not in memory.
  Feed& FeedLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the feed of a finished job without listeners.
  void ReleaseIfIdleLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<Listener>> ListenersLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store* const store_;
  Clock* const clock_;
  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, Feed> feeds_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::shared_ptr<Listener>>> listeners_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> finished_ ABSL_GUARDED_BY(mu_);  // MarkFinished, until Forget.
  // Held while sinks are told (never with mu_), so RemoveSink waits out a call.
  absl::Mutex sinks_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<Sink*> sinks_ ABSL_GUARDED_BY(sinks_mu_);
};

// A line for `ddpctl logs` describing a notable trainer event ("checkpoint saved to
// ..."), or empty for events that are metrics only.
std::string DescribeEvent(const v1::TrainerEvent& event);

}  // namespace ddp

#endif  // DDP_COORDINATOR_CORE_EVENT_HUB_H_
