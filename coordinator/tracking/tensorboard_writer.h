// `ddp-coordinator --tensorboard-dir DIR`: every job as a TensorBoard run, written as
// its points are stored.
//
// DIR/<job id>/events.out.tfevents.<start>.<host>.<pid>.ddp-coordinator holds the tags
// of common/tensorboard/job_run.h (the ones `ddpctl tensorboard` exports): each step
// point and epoch summary once the store took it, each attempt's text once it ended,
// each live recovery's once it ended. Point `tensorboard --logdir DIR` at it while jobs
// run: TensorBoard reads appended records as they come.
//
// Off the coordinator's paths: the hub tells the writer (an EventHub::Sink) what was
// stored and which jobs changed; the writer queues that and one thread of its own
// writes the files, so a slow or full disk delays the files, never ingestion or the
// gRPC threads. The queue is bounded: past `max_queued` points the newest are dropped,
// counted and logged (the store still has them: `ddpctl tensorboard` exports them).
//
// Each coordinator that leads writes files of its own name (a restarted or new leader
// appends nothing to its predecessor's files; TensorBoard merges a run's files), and
// writes the texts only of attempts and recoveries that ended after it started, so a
// takeover repeats none. A run's file is closed when its job finishes (and opened
// again for output that arrives late); at most `max_open_files` stay open.
#ifndef DDP_COORDINATOR_TRACKING_TENSORBOARD_WRITER_H_
#define DDP_COORDINATOR_TRACKING_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/core/event_hub.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

class TensorBoardWriter : public EventHub::Sink {
 public:
  struct Options {
    std::string dir;                // --tensorboard-dir
    size_t max_queued = 1'000'000;  // Step points and epochs waiting to be written.
    size_t max_open_files = 128;
    // The name's <start>.<host>.<pid> part; empty: now, this host, this process.
    std::string file_suffix;
  };
  // A job as GetJob answers it (attempts and recoveries; no history needed).
  using JobLookup = std::function<absl::StatusOr<v1::Job>(const std::string& job_id)>;

  // Makes DIR (mkdir -p) and checks it takes files: INVALID_ARGUMENT naming
  // --tensorboard-dir and why (main checks it at start, so a coordinator in standby
  // learns it then, not when it takes over).
  static absl::Status CheckDirectory(const std::string& dir);
  // CheckDirectory, then the writer's thread; `lookup` is called on that thread.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Start(Options options,
                                                                   JobLookup lookup);
  // Writes what is queued, closes every file, joins.
  ~TensorBoardWriter() override;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // EventHub::Sink
  void Stored(const std::vector<JobOutput>& outputs) override;
  void Changed(const std::string& job_id) override;

  // Waits until everything queued before the call is written (tests, shutdown).
  void Flush();

  struct Stats {
    int64_t events = 0;        // TensorBoard events written (file versions too).
    int64_t dropped = 0;       // Points dropped: the queue was full.
    int64_t write_errors = 0;  // Batches a file did not take (logged).
    size_t open_files = 0;
  };
  Stats stats();

  // The name every run's file of this writer has (events.out.tfevents.<suffix>).
  const std::string& file_name() const { return file_name_; }

 private:
  TensorBoardWriter(Options options, JobLookup lookup, int64_t start_ms);
  struct Item {
    std::vector<JobOutput> outputs;  // Stored points; or:
    std::string changed;             // A job that changed.
  };
  struct Run {
    int fd = -1;
    std::list<std::string>::iterator lru;  // In open_.
    bool failed = false;                   // Logged its first write error.
  };
  void Loop();
  void Write(const Item& item);
  void WriteJob(const std::string& job_id);
  // Appends `bytes` (records) to the job's file, opening it if needed.
  void Append(const std::string& job_id, const std::string& bytes, int64_t events);
  void Close(const std::string& job_id);

  const Options options_;
  const JobLookup lookup_;
  const int64_t start_ms_;  // Texts of what ended before are not written.
  std::string file_name_;

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_points_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;  // Items queued so far, and
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;      // written so far (Flush).
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // The thread's own.
  std::map<std::string, Run> runs_;
  std::list<std::string> open_;  // Jobs with an open file, least recently written first.
  std::set<std::string> written_texts_;  // "job/attempt" and "job/attempt/generation".
  std::set<std::string> finished_;       // Jobs ended, their texts written.

  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_TRACKING_TENSORBOARD_WRITER_H_
