// The coordinator's durable state: one SQLite database, <state-dir>/ddp.sqlite.
//
// Tables (each described once, column and field together, in store_tables.cc): jobs,
// attempts, ranks (the rank tables), workers, worker_batches, metrics (per-rank step
// history), epochs, logs. A coordinator restarted on
// the same directory loads jobs, attempts, rank tables and workers with Load() and
// serves metric history and logs from here.
//
// Writes are row-level: Write() upserts exactly the rows it is given (one rank's row
// when one rank changed), in one transaction; the coordinator's StoreWriter groups
// many changes into one call (group commit).
//
// Retention is bounded: per job at most `max_metric_rows` step rows and
// `max_log_lines` output lines (the newest are kept), and the `retain_jobs` finished
// jobs that ended last (JobsPastRetention picks the others; EnforceRetention deletes
// them whole). Both run by job id and row id, never by scanning a whole table: the
// store counts each job's rows as it appends them, and trims only the jobs that went
// over a bound (a job not appended to since the coordinator started is trimmed when
// it next is).
//
// Thread-safe. Two connections: writes (and Load) on one, behind one mutex; reads of
// history (logs, metrics, epochs) on a second, read-only one behind another, so a
// long read never holds up a commit and vice versa (WAL lets readers run beside the
// writer). WAL journal, synchronous=NORMAL: a crash of the coordinator loses nothing
// committed; a power cut may lose the last commits.
#ifndef DDP_COORDINATOR_STORE_STATE_STORE_H_
#define DDP_COORDINATOR_STORE_STATE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ddp/v1/types.pb.h"

struct sqlite3;

namespace ddp::store {
struct TableInfo;  // store_tables.h
}  // namespace ddp::store

namespace ddp {

struct RetentionOptions {
  int64_t max_metric_rows = 100000;  // Per job.
  int64_t max_log_lines = 100000;    // Per job.
  int64_t retain_jobs = 500;         // Finished jobs kept.
};

// INVALID_ARGUMENT naming the flag when a bound is < 1 (0 would delete everything).
absl::Status ValidateRetention(const RetentionOptions& retention);

// A finished job as retention sees it.
struct FinishedJob {
  std::string id;
  int64_t end_ms = 0;  // When it finished.
  int64_t seq = 0;     // Submission order: breaks ties.
};

// The finished jobs retention deletes: all but the `retain_jobs` that ended last,
// ordered by end time (end_ms, then seq), oldest first. A long job submitted long ago
// is as new as its end.
std::vector<std::string> JobsPastRetention(std::vector<FinishedJob> finished,
                                           int64_t retain_jobs);

struct StoredJob {
  v1::Job job;  // With attempts and rank tables; no metrics.
  int64_t seq = 0;  // Submission order.
  int64_t log_bytes = 0;  // Bytes of output text stored.
};

// Rows for Write(): each is upserted as given (a job row without its attempts, an
// attempt row without its ranks).
struct RowBatch {
  struct JobRow {
    v1::Job job;  // Attempts, if any, are ignored.
    int64_t seq = 0;
  };
  struct AttemptRow {
    std::string job_id;
    v1::Attempt attempt;  // Ranks, if any, are ignored.
  };
  struct RankRow {
    std::string job_id;
    int attempt = 0;
    v1::RankAssignment rank;
  };
  std::vector<JobRow> jobs;
  std::vector<AttemptRow> attempts;
  std::vector<RankRow> ranks;
  std::vector<v1::Worker> workers;
  // Workers to delete (RemoveWorker), after the upserts above. A batch never upserts
  // a worker after deleting it: the StoreWriter drops a staged upsert of a worker it
  // is asked to delete, and a staged delete of a worker it is asked to upsert.
  std::vector<std::string> removed_workers;

  bool empty() const {
    return jobs.empty() && attempts.empty() && ranks.empty() && workers.empty() &&
           removed_workers.empty();
  }
  size_t rows() const {
    return jobs.size() + attempts.size() + ranks.size() + workers.size() +
           removed_workers.size();
  }
};

// The last ReportEvents batch (batch_seq) stored of a worker's incarnation.
struct BatchMark {
  std::string worker;
  std::string incarnation;
  int64_t batch_seq = 0;
};

// One job's trainer output, for AppendAll.
struct JobOutput {
  std::string job_id;
  std::vector<v1::RankMetrics> metrics;
  std::vector<v1::EpochSummary> epochs;
  std::vector<v1::LogLine> logs;
};

struct LoadedState {
  std::vector<StoredJob> jobs;  // In submission order.
  std::vector<v1::Worker> workers;
  std::vector<BatchMark> batch_marks;  // One per worker that has reported events.
};

class StateStore {
 public:
  // Opens (creating) <dir>/ddp.sqlite, holding an exclusive lock on <dir>/LOCK until
  // the store is destroyed (or the process dies), so two coordinators never share a
  // directory. INVALID_ARGUMENT for bad retention bounds; UNAVAILABLE if the directory
  // is in use by another coordinator ("state dir X is in use by another
  // ddp-coordinator (pid N?)"), cannot be created, or the database cannot be opened;
  // DATA_LOSS if it is not ours.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir,
                                                          RetentionOptions retention = {});
  ~StateStore();

  // Upserts the rows of `batch` in one transaction.
  absl::Status Write(const RowBatch& batch);
  // Upserts the job, all its attempts and their rank tables, in one transaction
  // (tests and tools; the coordinator writes changed rows only, through Write()).
  absl::Status SaveJob(const v1::Job& job, int64_t seq);
  absl::Status SaveWorker(const v1::Worker& worker);
  absl::StatusOr<LoadedState> Load();

  // Appends trainer output in one transaction. Metrics rows use RankMetrics' fields.
  absl::Status Append(const std::string& job_id, const std::vector<v1::RankMetrics>& metrics,
                      const std::vector<v1::EpochSummary>& epochs,
                      const std::vector<v1::LogLine>& logs);
  // Appends several jobs' output and records `marks` (the batches it came in), in one
  // transaction: a batch is stored with its number or not at all, so a batch re-sent
  // after a crash is recognised by the restarted coordinator (Load's batch_marks).
  // A mark of the incarnation already stored keeps the higher number; another
  // incarnation's replaces it. RemoveWorker's deletion takes the worker's mark too.
  absl::Status AppendAll(const std::vector<JobOutput>& outputs,
                         const std::vector<BatchMark>& marks);

  // Lines with seq > after_seq (of `rank` if set), oldest first, at most `limit`;
  // with tail > 0, only the last `tail` such lines.
  absl::StatusOr<std::vector<v1::LogLine>> ReadLogs(const std::string& job_id, int64_t after_seq,
                                                    std::optional<int> rank, int64_t limit,
                                                    int64_t tail = 0);
  absl::StatusOr<int64_t> MaxLogSeq(const std::string& job_id);
  // The newest row of every rank of `attempt`.
  absl::StatusOr<std::vector<v1::RankMetrics>> LatestMetrics(const std::string& job_id,
                                                              int attempt);
  absl::StatusOr<std::vector<v1::RankMetrics>> MetricHistory(const std::string& job_id);
  absl::StatusOr<std::vector<v1::EpochSummary>> Epochs(const std::string& job_id);

  // Deletes the jobs `delete_ids` whole (attempts, ranks, metrics, epochs, logs, by
  // job id) and trims the output of every job that went over a per-job bound since
  // the last call (by row id), in one transaction.
  absl::Status EnforceRetention(const std::vector<std::string>& delete_ids);

  const RetentionOptions& retention() const { return retention_; }

 private:
  // What the store knows of a job's output rows, counted as they are appended.
  struct OutputCount {
    int64_t metric_rows = 0;  // Rows in `metrics`.
    int64_t log_floor = 0;    // Lines with seq <= log_floor are gone.
    int64_t log_top = 0;      // The highest seq stored.
  };

  StateStore(sqlite3* db, sqlite3* reader, int lock_fd, RetentionOptions retention)
      : db_(db), reader_(reader), lock_fd_(lock_fd), retention_(retention) {}
  absl::Status ExecLocked(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the columns of `table`'s description that the database's table lacks (a
  // database from an older release), running each one's backfill.
  absl::Status AddMissingColumnsLocked(const store::TableInfo& table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's counts, read from the database the first time (index range scans of
  // that job's rows only).
  absl::StatusOr<OutputCount*> CountLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;  // The write connection.
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, OutputCount> output_ ABSL_GUARDED_BY(mu_);
  absl::Mutex read_mu_;  // The read connection.
  sqlite3* reader_ ABSL_GUARDED_BY(read_mu_);
  const int lock_fd_;  // <dir>/LOCK, held exclusively while the store is open.
  const RetentionOptions retention_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STORE_STATE_STORE_H_
