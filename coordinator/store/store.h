// The coordinator's storage seam: what the facade, the store writer and the event
// hub need from durable state, as an interface. StateStore (SQLite, state_store.h) is
// the one the daemon uses; tests of the facade run on an in-memory fake
// (tests/coordinator/memory_store.h) that a contract test holds to the same
// behaviour (tests/coordinator/store_contract_test.cc).
//
// Rows are the protos the coordinator keeps (jobs, attempts, rank tables, workers)
// and trainer output (metrics, epochs, log lines). Writes are row-level upserts in
// one transaction each; reads of history never wait on writes.
#ifndef DDP_COORDINATOR_STORE_STORE_H_
#define DDP_COORDINATOR_STORE_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

// The schema's version, the same for both stores: 1, the tables; 2, the cluster id
// (meta.cluster_id; PostgreSQL: and the leader's lease). A store opened by a
// coordinator applies the migrations past its version, in order; one of a newer
// version is refused untouched (CheckSchemaVersion). Columns added with a DEFAULT are
// no migration: each store adds those it lacks when opened (store_tables.h).
inline constexpr int64_t kSchemaVersion = 2;

// FAILED_PRECONDITION when `stored` (the version `where` holds) is newer than this
// coordinator's.
absl::Status CheckSchemaVersion(int64_t stored, const std::string& where);

// A new store's cluster id: 32 random hex digits. Workers keep the first they are
// told and refuse a coordinator of another cluster (two stores behind one
// --coordinator list).
std::string NewClusterId();

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

// The stored jobs with their attempts and rank tables, from their rows as both stores
// select them: jobs by seq, attempts by (job, number), ranks by (job, attempt, rank).
// Rows of jobs not among `jobs` are dropped.
std::vector<StoredJob> AssembleJobs(std::vector<RowBatch::JobRow> jobs,
                                    std::vector<RowBatch::AttemptRow> attempts,
                                    std::vector<RowBatch::RankRow> ranks);

// Whether AppendAll(outputs, marks) has nothing to store.
bool NothingToAppend(const std::vector<JobOutput>& outputs, const std::vector<BatchMark>& marks);

struct LoadedState {
  std::string cluster_id;       // The store's (NewClusterId), made once.
  std::vector<StoredJob> jobs;  // In submission order.
  std::vector<v1::Worker> workers;
  std::vector<BatchMark> batch_marks;  // One per worker that has reported events.
};

class Store {
 public:
  virtual ~Store() = default;

  virtual const RetentionOptions& retention() const = 0;

  // Upserts the rows of `batch` in one transaction (all or nothing).
  virtual absl::Status Write(const RowBatch& batch) = 0;
  // Everything Recover() needs: jobs with attempts and rank tables in submission
  // order, workers by name, each worker's last stored batch number.
  virtual absl::StatusOr<LoadedState> Load() = 0;
  // Appends several jobs' output and records `marks` (the batches it came in), in one
  // transaction: a batch is stored with its number or not at all, so a batch re-sent
  // after a crash is recognised by the restarted coordinator (Load's batch_marks).
  // A mark of the incarnation already stored keeps the higher number; another
  // incarnation's replaces it. Removing a worker (RowBatch::removed_workers) takes
  // its mark too. An epoch row replaces the one of the same (attempt, epoch), a log
  // line the one of the same seq.
  virtual absl::Status AppendAll(const std::vector<JobOutput>& outputs,
                                 const std::vector<BatchMark>& marks) = 0;

  // Lines with seq > after_seq (of `rank` if set), oldest first, at most `limit`;
  // with tail > 0, only the last min(tail, limit) such lines.
  virtual absl::StatusOr<std::vector<v1::LogLine>> ReadLogs(const std::string& job_id,
                                                            int64_t after_seq,
                                                            std::optional<int> rank,
                                                            int64_t limit, int64_t tail = 0) = 0;
  // The highest seq stored of the job's lines, 0 if none.
  virtual absl::StatusOr<int64_t> MaxLogSeq(const std::string& job_id) = 0;
  // The newest row (highest global_step) of every rank of `attempt`, by rank.
  virtual absl::StatusOr<std::vector<v1::RankMetrics>> LatestMetrics(const std::string& job_id,
                                                                      int attempt) = 0;
  // Every stored step row, by (attempt, global_step, rank).
  virtual absl::StatusOr<std::vector<v1::RankMetrics>> MetricHistory(
      const std::string& job_id) = 0;
  // Every epoch row, by (attempt, epoch).
  virtual absl::StatusOr<std::vector<v1::EpochSummary>> Epochs(const std::string& job_id) = 0;

  // Deletes the jobs `delete_ids` whole (attempts, ranks, metrics, epochs, logs) and
  // trims the output of the jobs appended to over a bound to the newest
  // retention().max_metric_rows step rows (in the order they were appended) and
  // max_log_lines lines (by seq), in one transaction.
  virtual absl::Status EnforceRetention(const std::vector<std::string>& delete_ids) = 0;

  // Conveniences over Write and AppendAll (tests and tools; the coordinator writes
  // changed rows only).
  // Upserts the job, all its attempts and their rank tables, in one transaction.
  absl::Status SaveJob(const v1::Job& job, int64_t seq);
  absl::Status SaveWorker(const v1::Worker& worker);
  absl::Status Append(const std::string& job_id, const std::vector<v1::RankMetrics>& metrics,
                      const std::vector<v1::EpochSummary>& epochs,
                      const std::vector<v1::LogLine>& logs);
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_STORE_STORE_H_
