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
#include "coordinator/store/output_counts.h"
#include "coordinator/store/store.h"
#include "ddp/v1/types.pb.h"

struct sqlite3;

namespace ddp::store {
struct TableInfo;  // store_tables.h
}  // namespace ddp::store

namespace ddp {

class StateStore final : public Store {
 public:
  // Opens (creating) <dir>/ddp.sqlite, holding an exclusive lock on <dir>/LOCK until
  // the store is destroyed (or the process dies), so two coordinators never share a
  // directory. INVALID_ARGUMENT for bad retention bounds; UNAVAILABLE if the directory
  // is in use by another coordinator ("state dir X is in use by another
  // ddp-coordinator (pid N?)"), cannot be created, or the database cannot be opened;
  // DATA_LOSS if it is not ours; FAILED_PRECONDITION if a newer release wrote it.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir,
                                                          RetentionOptions retention = {});
  ~StateStore();

  // Store (store.h). Writes and Load on the write connection; history reads on the
  // read connection.
  absl::Status Write(const RowBatch& batch) override;
  absl::StatusOr<LoadedState> Load() override;
  absl::Status AppendAll(const std::vector<JobOutput>& outputs,
                         const std::vector<BatchMark>& marks) override;
  absl::StatusOr<std::vector<v1::LogLine>> ReadLogs(const std::string& job_id, int64_t after_seq,
                                                    std::optional<int> rank, int64_t limit,
                                                    int64_t tail = 0) override;
  absl::StatusOr<int64_t> MaxLogSeq(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::RankMetrics>> LatestMetrics(const std::string& job_id,
                                                              int attempt) override;
  absl::StatusOr<std::vector<v1::RankMetrics>> MetricHistory(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::EpochSummary>> Epochs(const std::string& job_id) override;
  // Trims by row id, only the jobs that went over a bound (the store counts each
  // job's rows as it appends them: output_counts.h).
  absl::Status EnforceRetention(const std::vector<std::string>& delete_ids) override;

  const RetentionOptions& retention() const override { return retention_; }

 private:
  StateStore(sqlite3* db, sqlite3* reader, int lock_fd, RetentionOptions retention)
      : db_(db), reader_(reader), lock_fd_(lock_fd), retention_(retention) {}
  absl::Status ExecLocked(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the schema version (a newer one: refused untouched) and applies the
  // migrations past it (store.h, kSchemaVersion); reads the cluster id.
  absl::Status MigrateLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the columns of `table`'s description that the database's table lacks (a
  // database from an older release), running each one's backfill.
  absl::Status AddMissingColumnsLocked(const store::TableInfo& table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's counts, read from the database the first time (index range scans of
  // that job's rows only).
  absl::StatusOr<store::OutputCounts::Count*> CountLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;  // The write connection.
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  store::OutputCounts counts_ ABSL_GUARDED_BY(mu_);
  std::string cluster_id_ ABSL_GUARDED_BY(mu_);
  absl::Mutex read_mu_;  // The read connection.
  sqlite3* reader_ ABSL_GUARDED_BY(read_mu_);
  const int lock_fd_;  // <dir>/LOCK, held exclusively while the store is open.
  const RetentionOptions retention_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STORE_STATE_STORE_H_
