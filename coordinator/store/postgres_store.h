// The coordinator's durable state in PostgreSQL (`ddp-coordinator --store
// postgresql://...`), for coordinators in standby: any number share one database,
// one leads.
//
// The same tables as the SQLite store (described once, store_tables.cc, in
// PostgreSQL's dialect), in a database of their own, plus `meta` (the schema version
// and the cluster id) and `lease` (one row: who leads, until when, and its epoch).
// Migrations are versioned (store.h, kSchemaVersion) and applied under an advisory
// lock, so coordinators started together never race on them; a database of a newer
// schema is refused untouched.
//
// Leadership: TryAcquire takes the lease when it has expired (by the database's
// clock, so coordinators' clocks never matter), raising its epoch; the leader Renews
// it. Every write transaction first takes a share lock on the lease row and checks
// that its epoch is still the one this store was fenced to (SetFence), so a deposed
// leader (paused, partitioned, slow) can never write after another took over: the
// takeover's UPDATE waits for the writes in flight, and every later write sees the new
// epoch and fails with FAILED_PRECONDITION ("fenced"). A session that holds the lock
// and then stops (a SIGSTOPped leader) is ended by the server after
// `idle_in_transaction_session_timeout`, so it cannot hold a takeover up.
//
// Thread-safe. Three connections: writes and Load; reads of history; the lease.
// Each reconnects on its next use after the server went away: calls fail with
// UNAVAILABLE meanwhile.
#ifndef DDP_COORDINATOR_STORE_POSTGRES_STORE_H_
#define DDP_COORDINATOR_STORE_POSTGRES_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store/output_counts.h"
#include "coordinator/store/store.h"

namespace ddp {
namespace pg {
class Conn;
}  // namespace pg

struct PostgresStoreOptions {
  std::string uri;  // A libpq connection URI: postgresql://USER[:PASSWORD]@HOST[:PORT]/DB.
  RetentionOptions retention;
  // A session idle inside a transaction this long is ended by the server (its locks
  // released): well below the lease, so a paused leader cannot hold up a takeover.
  absl::Duration idle_in_transaction_timeout = absl::Seconds(1);
};

// Who holds the lease.
struct LeaseHolder {
  int64_t epoch = 0;      // Raised by every takeover; 0: nobody ever led.
  std::string holder;     // The leading process's id (LeaderId()).
  std::string address;    // Where it serves gRPC (what clients are told).
  bool live = false;      // Not expired, by the database's clock.
};

class PostgresStore final : public Store {
 public:
  // Connects (INVALID_ARGUMENT for a malformed URI, UNAVAILABLE naming the server
  // when it cannot be reached), applies the schema's migrations, and reads the
  // cluster id. FAILED_PRECONDITION for a database of a newer schema (untouched) or
  // one that holds tables that are not ours.
  static absl::StatusOr<std::unique_ptr<PostgresStore>> Open(PostgresStoreOptions options);
  ~PostgresStore() override;

  // Store (store.h). Writes fail with FAILED_PRECONDITION unless the lease's epoch is
  // the fence's.
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
  absl::Status EnforceRetention(const std::vector<std::string>& delete_ids) override;
  const RetentionOptions& retention() const override { return options_.retention; }

  const std::string& cluster_id() const { return cluster_id_; }
  // "host:port/db", for messages.
  std::string Describe() const;

  // Writes commit only while the lease's epoch is `epoch` (0: none does).
  void SetFence(int64_t epoch) { fence_.store(epoch); }
  int64_t fence() const { return fence_.load(); }

  // The lease. TryAcquire takes it if it has expired (or was released), for `ttl`,
  // and returns the new epoch; nullopt while another holds it.
  absl::StatusOr<std::optional<int64_t>> TryAcquire(const std::string& holder,
                                                    const std::string& address,
                                                    absl::Duration ttl);
  // Extends the lease of `epoch` by `ttl` from now. FAILED_PRECONDITION naming the
  // new holder when another took it over; UNAVAILABLE when the database cannot say.
  absl::Status Renew(int64_t epoch, absl::Duration ttl);
  // Lets the lease of `epoch` expire now (a leader stopping): a standby takes over at
  // its next try.
  absl::Status Release(int64_t epoch);
  absl::StatusOr<LeaseHolder> Holder();

 private:
  explicit PostgresStore(PostgresStoreOptions options);
  absl::Status Migrate();
  // In a write transaction: the share lock on the lease row and the epoch check.
  absl::Status CheckFenceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<store::OutputCounts::Count*> CountLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PostgresStoreOptions options_;
  std::string cluster_id_;
  std::atomic<int64_t> fence_{0};
  absl::Mutex mu_;  // The write connection.
  std::unique_ptr<pg::Conn> db_ ABSL_GUARDED_BY(mu_);
  store::OutputCounts counts_ ABSL_GUARDED_BY(mu_);
  absl::Mutex read_mu_;  // The read connection.
  std::unique_ptr<pg::Conn> reader_ ABSL_GUARDED_BY(read_mu_);
  absl::Mutex lease_mu_;  // The lease's connection.
  std::unique_ptr<pg::Conn> lease_ ABSL_GUARDED_BY(lease_mu_);
};

// A process's id as a lease holder: "host:pid:random".
std::string LeaderId();

namespace pg {
// The URI with any password replaced by ***, for messages and logs.
std::string Redact(const std::string& uri);
// Checks a connection URI's syntax (not the server): INVALID_ARGUMENT naming the
// problem (--store).
absl::Status CheckUri(const std::string& uri);
}  // namespace pg

}  // namespace ddp

#endif  // DDP_COORDINATOR_STORE_POSTGRES_STORE_H_
