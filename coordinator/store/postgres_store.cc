#include "coordinator/store/postgres_store.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "coordinator/store/postgres.h"
#include "coordinator/store/store_tables.h"

namespace ddp {
namespace {

using store::Dialect;

// Serializes schema changes of coordinators started together (any constant of ours).
constexpr int64_t kMigrationLock = 0x64647000;  // "ddp\0"

// Rows per multi-row INSERT (PostgreSQL takes at most 65535 parameters).
constexpr int kRowsPerInsert = 500;

// Upserts `rows` into `table` (one without a parent column), one statement each.
template <typename Row>
absl::Status Upsert(pg::Conn& db, const store::Table<Row>& table, const std::vector<Row>& rows) {
  if (rows.empty()) return absl::OkStatus();
  const std::string sql = table.InsertSql(Dialect::kPostgres);
  pg::Params p;
  for (const Row& row : rows) {
    p.Clear();
    table.Bind(p, row);
    DDP_RETURN_IF_ERROR(db.Exec(sql, p).status());
  }
  return absl::OkStatus();
}

// Inserts `rows` of a table with a parent column, kRowsPerInsert per statement
// (`replace`: rows of keys stored already are replaced; the rows' own keys differ).
template <typename Row>
absl::Status InsertRows(pg::Conn& db, const store::Table<Row>& table, const std::string& parent,
                        const std::vector<Row>& rows, bool replace) {
  pg::Params p;
  for (size_t start = 0; start < rows.size(); start += kRowsPerInsert) {
    const size_t n = std::min(rows.size() - start, static_cast<size_t>(kRowsPerInsert));
    const int width = static_cast<int>(table.columns.size()) + 1;
    p.Clear();
    for (size_t r = 0; r < n; ++r) {
      p.BindText(static_cast<int>(r) * width + 1, parent);
      table.Bind(p, rows[start + r], static_cast<int>(r));
    }
    DDP_RETURN_IF_ERROR(db.Exec(table.InsertRowsSql(static_cast<int>(n), replace), p).status());
  }
  return absl::OkStatus();
}

template <typename Row>
absl::StatusOr<std::vector<Row>> Select(pg::Conn& db, const store::Table<Row>& table,
                                        const std::string& rest,
                                        const pg::Params& params = pg::Params()) {
  DDP_ASSIGN_OR_RETURN(pg::Result res, db.Exec(table.SelectSql(rest), params));
  std::vector<Row> out;
  out.reserve(static_cast<size_t>(res.rows()));
  while (res.Next()) table.Load(res, out.emplace_back());
  return out;
}

std::string Millis(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d)); }

}  // namespace

std::string LeaderId() {
  absl::BitGen gen;
  return absl::StrFormat("%s:%d:%08x", LocalHostname(), ::getpid(), absl::Uniform<uint32_t>(gen));
}

PostgresStore::PostgresStore(PostgresStoreOptions options) : options_(std::move(options)) {
  const std::string idle = absl::StrCat(
      "SET idle_in_transaction_session_timeout = ",
      std::max<int64_t>(100, absl::ToInt64Milliseconds(options_.idle_in_transaction_timeout)));
  absl::MutexLock lock(&mu_);
  absl::MutexLock read_lock(&read_mu_);
  absl::MutexLock lease_lock(&lease_mu_);
  db_ = std::make_unique<pg::Conn>(options_.uri, idle + "; SET lock_timeout = 5000");
  reader_ = std::make_unique<pg::Conn>(options_.uri, idle + "; SET statement_timeout = 30000");
  // A lease that cannot be had at once is another's: try again later.
  lease_ = std::make_unique<pg::Conn>(
      options_.uri, idle + "; SET lock_timeout = 1000; SET statement_timeout = 3000");
}

PostgresStore::~PostgresStore() = default;

std::string PostgresStore::Describe() const { return pg::Conn(options_.uri, "").Describe(); }

absl::StatusOr<std::unique_ptr<PostgresStore>> PostgresStore::Open(PostgresStoreOptions options) {
  DDP_RETURN_IF_ERROR(ValidateRetention(options.retention));
  DDP_RETURN_IF_ERROR(pg::CheckUri(options.uri));
  std::unique_ptr<PostgresStore> store(new PostgresStore(std::move(options)));
  DDP_RETURN_IF_ERROR(store->Migrate());
  return store;
}

absl::Status PostgresStore::Migrate() {
  absl::MutexLock lock(&mu_);
  pg::Conn& db = *db_;
  DDP_RETURN_IF_ERROR(db.Connect());
  const std::string where = absl::StrCat("the PostgreSQL store at ", db.Describe());
  pg::Transaction tx(db);
  DDP_RETURN_IF_ERROR(tx.Begin());
  {
    pg::Params lock;
    DDP_RETURN_IF_ERROR(db.Exec("SELECT pg_advisory_xact_lock($1)", lock.Int(1, kMigrationLock))
                            .status());
    DDP_ASSIGN_OR_RETURN(
        pg::Result tables,
        db.Exec("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                "current_schema() ORDER BY table_name"));
    std::set<std::string> present;
    while (tables.Next()) present.insert(tables.Text(0));
    int64_t version = 0;
    if (present.count("meta")) {
      DDP_ASSIGN_OR_RETURN(pg::Result v,
                           db.Exec("SELECT value FROM meta WHERE key = 'schema_version'"));
      if (v.Next()) version = std::stoll(v.Text(0));
    } else if (!present.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, " holds tables that are not ddp's (", absl::StrJoin(present, ", "),
          "): give the coordinators a database of their own (CREATE DATABASE ddp)"));
    }
    DDP_RETURN_IF_ERROR(CheckSchemaVersion(version, where));
    if (version < 1) {
      std::string schema =
          "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);";
      for (const store::TableInfo* t : store::AllTables()) {
        absl::StrAppend(&schema, "\n", t->CreateSql(Dialect::kPostgres));
      }
      DDP_RETURN_IF_ERROR(db.ExecScript(schema));
      DDP_LOG(INFO) << where << ": created the tables (schema version 1)";
    }
    if (version < 2) {
      DDP_RETURN_IF_ERROR(db.ExecScript(
          "CREATE TABLE IF NOT EXISTS lease(id INTEGER PRIMARY KEY CHECK (id = 1),"
          " epoch BIGINT NOT NULL, holder TEXT NOT NULL, address TEXT NOT NULL,"
          " expires_at TIMESTAMPTZ NOT NULL);"
          " INSERT INTO lease VALUES (1, 0, '', '', '-infinity') ON CONFLICT DO NOTHING"));
      pg::Params id;
      DDP_RETURN_IF_ERROR(db.Exec("INSERT INTO meta(key, value) VALUES('cluster_id', $1)"
                                  " ON CONFLICT DO NOTHING",
                                  id.Text(1, NewClusterId()))
                              .status());
      DDP_LOG(INFO) << where << ": migrated to schema version 2 (cluster id, lease)";
    }
    if (version < kSchemaVersion) {
      pg::Params v;
      DDP_RETURN_IF_ERROR(db.Exec("INSERT INTO meta(key, value) VALUES('schema_version', $1)"
                                  " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                                  v.Text(1, absl::StrCat(kSchemaVersion)))
                              .status());
    }
    // Columns added since (with their backfills).
    for (const store::TableInfo* t : store::AllTables()) {
      pg::Params name;
      DDP_ASSIGN_OR_RETURN(
          pg::Result cols,
          db.Exec("SELECT column_name FROM information_schema.columns WHERE table_schema = "
                  "current_schema() AND table_name = $1",
                  name.Text(1, t->name)));
      std::set<std::string> have;
      while (cols.Next()) have.insert(cols.Text(0));
      for (const store::ColumnInfo& c : t->columns) {
        if (have.count(c.name)) continue;
        DDP_LOG(INFO) << where << ": adding column " << t->name << "." << c.name;
        DDP_RETURN_IF_ERROR(db.ExecScript(absl::StrCat("ALTER TABLE ", t->name, " ADD COLUMN ",
                                                       c.name, " ",
                                                       store::Declaration(c.decl, Dialect::kPostgres))));
        if (c.backfill != nullptr) DDP_RETURN_IF_ERROR(db.ExecScript(c.backfill));
      }
    }
    DDP_ASSIGN_OR_RETURN(pg::Result id, db.Exec("SELECT value FROM meta WHERE key = 'cluster_id'"));
    if (id.Next()) cluster_id_ = id.Text(0);
  }
  return tx.Commit();
}

absl::Status PostgresStore::CheckFenceLocked() {
  const int64_t fence = fence_.load();
  if (fence == 0) {
    return absl::FailedPreconditionError(
        "not the leader: this coordinator holds no lease on the store, so it writes nothing");
  }
  DDP_ASSIGN_OR_RETURN(pg::Result r,
                       db_->Exec("SELECT epoch, holder, address FROM lease WHERE id = 1 FOR SHARE"));
  if (!r.Next()) return absl::InternalError("the store's lease row is missing");
  if (r.Int(0) != fence) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fenced: another coordinator (", r.Text(2), ") took the lead with lease epoch ",
        r.Int(0), " after this one's ", fence, ": this coordinator writes nothing more"));
  }
  return absl::OkStatus();
}

absl::Status PostgresStore::Write(const RowBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  pg::Conn& db = *db_;
  pg::Transaction tx(db);
  DDP_RETURN_IF_ERROR(tx.Begin());
  DDP_RETURN_IF_ERROR(CheckFenceLocked());
  {
    DDP_RETURN_IF_ERROR(Upsert(db, store::Jobs(), batch.jobs));
    DDP_RETURN_IF_ERROR(Upsert(db, store::Attempts(), batch.attempts));
    DDP_RETURN_IF_ERROR(Upsert(db, store::Ranks(), batch.ranks));
    DDP_RETURN_IF_ERROR(Upsert(db, store::Workers(), batch.workers));
    pg::Params p;
    for (const std::string& name : batch.removed_workers) {
      p.Text(1, name);
      DDP_RETURN_IF_ERROR(db.Exec("DELETE FROM workers WHERE name = $1", p).status());
      DDP_RETURN_IF_ERROR(db.Exec("DELETE FROM worker_batches WHERE worker = $1", p).status());
    }
  }
  return tx.Commit();
}

absl::StatusOr<LoadedState> PostgresStore::Load() {
  absl::MutexLock lock(&mu_);
  pg::Conn& db = *db_;
  LoadedState out;
  out.cluster_id = cluster_id_;
  // One snapshot of every table.
  pg::Transaction tx(db);
  DDP_RETURN_IF_ERROR(tx.Begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"));
  {
    DDP_ASSIGN_OR_RETURN(std::vector<RowBatch::JobRow> jobs,
                         Select(db, store::Jobs(), "ORDER BY seq"));
    DDP_ASSIGN_OR_RETURN(std::vector<RowBatch::AttemptRow> attempts,
                         Select(db, store::Attempts(), "ORDER BY job_id, number"));
    DDP_ASSIGN_OR_RETURN(std::vector<RowBatch::RankRow> ranks,
                         Select(db, store::Ranks(), "ORDER BY job_id, attempt, rank"));
    out.jobs = AssembleJobs(std::move(jobs), std::move(attempts), std::move(ranks));
    std::map<std::string, StoredJob*> index;
    for (StoredJob& sj : out.jobs) index[sj.job.id()] = &sj;
    DDP_ASSIGN_OR_RETURN(out.workers, Select(db, store::Workers(), "ORDER BY name"));
    DDP_ASSIGN_OR_RETURN(out.batch_marks, Select(db, store::WorkerBatches(), "ORDER BY worker"));
    DDP_ASSIGN_OR_RETURN(
        pg::Result lb, db.Exec("SELECT job_id, SUM(OCTET_LENGTH(text)) FROM logs GROUP BY job_id"));
    while (lb.Next()) {
      auto it = index.find(lb.Text(0));
      if (it != index.end()) it->second->log_bytes = lb.Int(1);
    }
  }
  DDP_RETURN_IF_ERROR(tx.Commit());
  return out;
}

absl::StatusOr<store::OutputCounts::Count*> PostgresStore::CountLocked(const std::string& job_id) {
  if (store::OutputCounts::Count* c = counts_.Find(job_id)) return c;
  pg::Params p;
  p.Text(1, job_id);
  DDP_ASSIGN_OR_RETURN(pg::Result m, db_->Exec("SELECT COUNT(*) FROM metrics WHERE job_id = $1", p));
  DDP_ASSIGN_OR_RETURN(pg::Result l,
                       db_->Exec("SELECT COALESCE(MIN(seq), 1) - 1, COALESCE(MAX(seq), 0) FROM"
                                 " logs WHERE job_id = $1",
                                 p));
  m.Next();
  l.Next();
  return counts_.Add(job_id, {m.Int(0), l.Int(0), l.Int(1)});
}

absl::Status PostgresStore::AppendAll(const std::vector<JobOutput>& outputs,
                                      const std::vector<BatchMark>& marks) {
  if (NothingToAppend(outputs, marks)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  std::vector<store::OutputCounts::Count*> counts;
  for (const JobOutput& o : outputs) {
    DDP_ASSIGN_OR_RETURN(store::OutputCounts::Count * c, CountLocked(o.job_id));
    counts.push_back(c);
  }
  pg::Conn& db = *db_;
  pg::Transaction tx(db);
  DDP_RETURN_IF_ERROR(tx.Begin());
  DDP_RETURN_IF_ERROR(CheckFenceLocked());
  {
    for (const JobOutput& o : outputs) {
      DDP_RETURN_IF_ERROR(InsertRows(db, store::Metrics(), o.job_id, o.metrics, false));
      // A row of the same key replaces the earlier one, also within one call.
      std::map<std::pair<int, int>, const v1::EpochSummary*> epochs;
      for (const v1::EpochSummary& e : o.epochs) epochs[{e.attempt(), e.epoch()}] = &e;
      std::vector<v1::EpochSummary> epoch_rows;
      for (const auto& [key, e] : epochs) epoch_rows.push_back(*e);
      DDP_RETURN_IF_ERROR(InsertRows(db, store::Epochs(), o.job_id, epoch_rows, true));
      std::map<int64_t, const v1::LogLine*> lines;
      for (const v1::LogLine& l : o.logs) lines[l.seq()] = &l;
      std::vector<v1::LogLine> line_rows;
      line_rows.reserve(lines.size());
      for (const auto& [seq, l] : lines) line_rows.push_back(*l);
      DDP_RETURN_IF_ERROR(InsertRows(db, store::Logs(), o.job_id, line_rows, true));
    }
    // A new incarnation starts its numbering again; within one, numbers only grow.
    const std::string sql =
        store::WorkerBatches().InsertSql(Dialect::kPostgres, /*replace=*/false) +
        " ON CONFLICT (worker) DO UPDATE SET batch_seq = CASE"
        " WHEN worker_batches.incarnation = EXCLUDED.incarnation THEN"
        " GREATEST(worker_batches.batch_seq, EXCLUDED.batch_seq)"
        " ELSE EXCLUDED.batch_seq END, incarnation = EXCLUDED.incarnation";
    pg::Params p;
    for (const BatchMark& x : marks) {
      p.Clear();
      store::WorkerBatches().Bind(p, x);
      DDP_RETURN_IF_ERROR(db.Exec(sql, p).status());
    }
  }
  DDP_RETURN_IF_ERROR(tx.Commit());
  for (size_t i = 0; i < outputs.size(); ++i) store::OutputCounts::Appended(counts[i], outputs[i]);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::LogLine>> PostgresStore::ReadLogs(const std::string& job_id,
                                                                 int64_t after_seq,
                                                                 std::optional<int> rank,
                                                                 int64_t limit, int64_t tail) {
  absl::MutexLock lock(&read_mu_);
  pg::Params p;
  p.Text(1, job_id).Int(2, after_seq).Int(3, tail > 0 ? std::min(tail, limit) : limit);
  if (rank.has_value()) p.Int(4, *rank);
  const std::string rest =
      absl::StrCat("WHERE job_id = $1 AND seq > $2", rank.has_value() ? " AND rank = $4" : "",
                   tail > 0 ? " ORDER BY seq DESC LIMIT $3" : " ORDER BY seq LIMIT $3");
  DDP_ASSIGN_OR_RETURN(std::vector<v1::LogLine> out, Select(*reader_, store::Logs(), rest, p));
  if (tail > 0) std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<int64_t> PostgresStore::MaxLogSeq(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  pg::Params p;
  DDP_ASSIGN_OR_RETURN(pg::Result r,
                       reader_->Exec("SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = $1",
                                     p.Text(1, job_id)));
  r.Next();
  return r.Int(0);
}

absl::StatusOr<std::vector<v1::RankMetrics>> PostgresStore::LatestMetrics(
    const std::string& job_id, int attempt) {
  absl::MutexLock lock(&read_mu_);
  pg::Params p;
  p.Text(1, job_id).Int(2, attempt);
  return Select(*reader_, store::Metrics(),
                "AS m WHERE job_id = $1 AND attempt = $2 AND global_step ="
                " (SELECT MAX(global_step) FROM metrics WHERE job_id = $1 AND"
                " attempt = $2 AND rank = m.rank) ORDER BY rank",
                p);
}

absl::StatusOr<std::vector<v1::RankMetrics>> PostgresStore::MetricHistory(
    const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  pg::Params p;
  return Select(*reader_, store::Metrics(),
                "WHERE job_id = $1 ORDER BY attempt, global_step, rank, row_id", p.Text(1, job_id));
}

absl::StatusOr<std::vector<v1::EpochSummary>> PostgresStore::Epochs(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  pg::Params p;
  return Select(*reader_, store::Epochs(), "WHERE job_id = $1 ORDER BY attempt, epoch",
                p.Text(1, job_id));
}

absl::Status PostgresStore::EnforceRetention(const std::vector<std::string>& delete_ids) {
  absl::MutexLock lock(&mu_);
  const std::vector<store::OutputCounts::Trim> trims =
      counts_.Plan(delete_ids, options_.retention);
  if (delete_ids.empty() && trims.empty()) return absl::OkStatus();
  pg::Conn& db = *db_;
  pg::Transaction tx(db);
  DDP_RETURN_IF_ERROR(tx.Begin());
  DDP_RETURN_IF_ERROR(CheckFenceLocked());
  {
    pg::Params p;
    for (const char* table : {"jobs", "attempts", "ranks", "metrics", "epochs", "logs"}) {
      const std::string sql = absl::StrCat("DELETE FROM ", table, " WHERE ",
                                           std::string(table) == "jobs" ? "id" : "job_id", " = $1");
      for (const std::string& id : delete_ids) {
        p.Clear();
        DDP_RETURN_IF_ERROR(db.Exec(sql, p.Text(1, id)).status());
      }
    }
    for (const store::OutputCounts::Trim& t : trims) {
      p.Clear();
      p.Text(1, t.job_id);
      if (t.oldest_metric_rows > 0) {
        DDP_RETURN_IF_ERROR(db.Exec("DELETE FROM metrics WHERE row_id IN (SELECT row_id FROM"
                                    " metrics WHERE job_id = $1 ORDER BY row_id LIMIT $2)",
                                    p.Int(2, t.oldest_metric_rows))
                                .status());
      }
      if (t.log_floor > 0) {
        DDP_RETURN_IF_ERROR(db.Exec("DELETE FROM logs WHERE job_id = $1 AND seq <= $2",
                                    p.Int(2, t.log_floor))
                                .status());
      }
    }
  }
  DDP_RETURN_IF_ERROR(tx.Commit());
  counts_.Done(delete_ids, trims);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> PostgresStore::TryAcquire(const std::string& holder,
                                                                 const std::string& address,
                                                                 absl::Duration ttl) {
  absl::MutexLock lock(&lease_mu_);
  pg::Params p;
  p.Text(1, holder).Text(2, address).Text(3, Millis(ttl));
  DDP_ASSIGN_OR_RETURN(
      pg::Result r,
      lease_->Exec("UPDATE lease SET epoch = epoch + 1, holder = $1, address = $2,"
                   " expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'"
                   " WHERE id = 1 AND expires_at <= clock_timestamp() RETURNING epoch",
                   p));
  if (!r.Next()) return std::nullopt;
  return r.Int(0);
}

absl::Status PostgresStore::Renew(int64_t epoch, absl::Duration ttl) {
  {
    absl::MutexLock lock(&lease_mu_);
    pg::Params p;
    p.Int(1, epoch).Text(2, Millis(ttl));
    DDP_ASSIGN_OR_RETURN(
        pg::Result r,
        lease_->Exec("UPDATE lease SET expires_at = clock_timestamp() + $2::bigint *"
                     " interval '1 millisecond' WHERE id = 1 AND epoch = $1 RETURNING epoch",
                     p));
    if (r.Next()) return absl::OkStatus();
  }
  auto now = Holder();
  if (!now.ok()) return now.status();
  return absl::FailedPreconditionError(absl::StrCat("lost the lease: ", now->address,
                                                    " leads with epoch ", now->epoch,
                                                    " (this coordinator's was ", epoch, ")"));
}

absl::Status PostgresStore::Release(int64_t epoch) {
  absl::MutexLock lock(&lease_mu_);
  pg::Params p;
  return lease_
      ->Exec("UPDATE lease SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1",
             p.Int(1, epoch))
      .status();
}

absl::StatusOr<LeaseHolder> PostgresStore::Holder() {
  absl::MutexLock lock(&lease_mu_);
  DDP_ASSIGN_OR_RETURN(pg::Result r,
                       lease_->Exec("SELECT epoch, holder, address, expires_at >"
                                    " clock_timestamp() FROM lease WHERE id = 1"));
  if (!r.Next()) return absl::InternalError("the store's lease row is missing");
  return LeaseHolder{r.Int(0), r.Text(1), r.Text(2), r.Text(3) == "t"};
}

}  // namespace ddp
