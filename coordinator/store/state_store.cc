#include "coordinator/store/state_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/store/sqlite.h"
#include "coordinator/store/store_tables.h"

namespace ddp {
namespace {

using sql::InTransaction;
using sql::Stmt;

// Upserts `rows` into `table` (the parent column, if the table has one, bound to
// `parent`).
template <typename Row>
absl::Status Upsert(sqlite3* db, const store::Table<Row>& table, const std::vector<Row>& rows,
                    const std::string* parent = nullptr) {
  if (rows.empty()) return absl::OkStatus();
  Stmt s(db, table.InsertSql());
  DDP_RETURN_IF_ERROR(s.ok());
  for (const Row& row : rows) {
    if (parent != nullptr) s.Bind(1, *parent);
    table.Bind(s, row);
    DDP_RETURN_IF_ERROR(s.Run());
  }
  return absl::OkStatus();
}

// Every row a statement of `table.SelectSql(rest)` returns (`bind` binds its
// parameters; the overload without it binds none).
template <typename Row, typename BindFn>
absl::StatusOr<std::vector<Row>> Select(sqlite3* db, const store::Table<Row>& table,
                                        const std::string& rest, BindFn&& bind) {
  Stmt s(db, table.SelectSql(rest));
  DDP_RETURN_IF_ERROR(s.ok());
  bind(s);
  std::vector<Row> out;
  while (s.Step()) table.Load(s, out.emplace_back());
  DDP_RETURN_IF_ERROR(s.Done());
  return out;
}

template <typename Row>
absl::StatusOr<std::vector<Row>> Select(sqlite3* db, const store::Table<Row>& table,
                                        const std::string& rest) {
  return Select(db, table, rest, [](Stmt&) {});
}

// Takes <dir>/LOCK exclusively (flock: released when the process dies, however it
// dies) and writes our pid into it for the next one to name. Returns its descriptor.
absl::StatusOr<int> LockStateDir(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "LOCK").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("--state-dir: cannot open ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    holder.erase(holder.find_last_not_of(" \n") + 1);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(
          "state dir ", dir, " is in use by another ddp-coordinator (pid ",
          holder.empty() ? "unknown" : holder, "?): stop it, or give this one another --state-dir"));
    }
    return absl::UnavailableError(
        absl::StrCat("--state-dir: cannot lock ", path, ": ", std::strerror(err)));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  // Best effort: the pid only improves a later contender's message.
  (void)!::ftruncate(fd, 0);
  (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir,
                                                             RetentionOptions retention) {
  DDP_RETURN_IF_ERROR(ValidateRetention(retention));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--state-dir: cannot create ", dir, ": ", ec.message()));
  }
  auto lock_fd = LockStateDir(dir);
  if (!lock_fd.ok()) return lock_fd.status();
  const std::string path = (std::filesystem::path(dir) / "ddp.sqlite").string();
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    ::close(*lock_fd);
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<StateStore> store(new StateStore(db, nullptr, *lock_fd, retention));
  {
    absl::MutexLock lock(&store->mu_);
    DDP_RETURN_IF_ERROR(store->ExecLocked("PRAGMA journal_mode=WAL"));
    DDP_RETURN_IF_ERROR(store->ExecLocked("PRAGMA synchronous=NORMAL"));
    DDP_RETURN_IF_ERROR(store->MigrateLocked(path));
  }
  // History is read on a connection of its own: WAL readers never wait for the
  // writer, nor it for them.
  sqlite3* reader = nullptr;
  if (sqlite3_open_v2(path.c_str(), &reader, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = reader ? sqlite3_errmsg(reader) : "out of memory";
    sqlite3_close(reader);
    return absl::UnavailableError(absl::StrCat("cannot open ", path, " for reading: ", msg));
  }
  sqlite3_busy_timeout(reader, 5000);
  absl::MutexLock lock(&store->read_mu_);
  store->reader_ = reader;
  return store;
}

StateStore::~StateStore() {
  {
    absl::MutexLock lock(&read_mu_);
    sqlite3_close(reader_);
  }
  {
    absl::MutexLock lock(&mu_);
    sqlite3_close(db_);
  }
  ::close(lock_fd_);  // Releases the state dir.
}

absl::Status StateStore::ExecLocked(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("sqlite: ", msg));
  }
  return absl::OkStatus();
}

absl::Status StateStore::MigrateLocked(const std::string& path) {
  // The version first: a database of a newer release is left as it is.
  absl::Status st = ExecLocked(
      "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)");
  if (!st.ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not a ddp state database (", st.message(), ")"));
  }
  int64_t version = 0;
  {
    Stmt get(db_, "SELECT value FROM meta WHERE key = 'schema_version'");
    DDP_RETURN_IF_ERROR(get.ok());
    if (get.Step() && !absl::SimpleAtoi(get.Text(0), &version)) {
      return absl::DataLossError(
          absl::StrCat(path, " has a schema version that is not a number: '", get.Text(0), "'"));
    }
    DDP_RETURN_IF_ERROR(get.Done());
  }
  DDP_RETURN_IF_ERROR(CheckSchemaVersion(version, path));
  sql::Transaction tx(db_);
  DDP_RETURN_IF_ERROR(tx.Begin());
  {
    // Version 1: the tables, from their descriptions (store_tables.cc). Run on every
    // open: a database of any version gains the columns added since, with their
    // backfills.
    std::string schema;
    for (const store::TableInfo* t : store::AllTables()) absl::StrAppend(&schema, "\n", t->CreateSql());
    if (absl::Status created = ExecLocked(schema.c_str()); !created.ok()) {
      return absl::DataLossError(
          absl::StrCat(path, " is not a ddp state database (", created.message(), ")"));
    }
    for (const store::TableInfo* t : store::AllTables()) {
      DDP_RETURN_IF_ERROR(AddMissingColumnsLocked(*t));
    }
    if (version < 2) {  // The cluster id.
      Stmt id(db_, "INSERT OR IGNORE INTO meta(key, value) VALUES('cluster_id', ?)");
      DDP_RETURN_IF_ERROR(id.Bind(1, NewClusterId()).Run());
    }
    Stmt put(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)");
    DDP_RETURN_IF_ERROR(put.Bind(1, std::to_string(kSchemaVersion)).Run());
    Stmt id(db_, "SELECT value FROM meta WHERE key = 'cluster_id'");
    DDP_RETURN_IF_ERROR(id.ok());
    if (id.Step()) cluster_id_ = id.Text(0);
    DDP_RETURN_IF_ERROR(id.Done());
  }
  return tx.Commit();
}

absl::Status StateStore::AddMissingColumnsLocked(const store::TableInfo& table) {
  Stmt info(db_, absl::StrCat("PRAGMA table_info(", table.name, ")"));
  DDP_RETURN_IF_ERROR(info.ok());
  std::set<std::string> present;
  while (info.Step()) present.insert(info.Text(1));
  DDP_RETURN_IF_ERROR(info.Done());
  for (const store::ColumnInfo& c : table.columns) {
    if (present.count(c.name)) continue;
    DDP_LOG(INFO) << "state store: adding column " << table.name << "." << c.name
                  << " to a database written by an older coordinator";
    DDP_RETURN_IF_ERROR(
        ExecLocked(absl::StrCat("ALTER TABLE ", table.name, " ADD COLUMN ", c.name, " ", c.decl)
                       .c_str()));
    if (c.backfill != nullptr) DDP_RETURN_IF_ERROR(ExecLocked(c.backfill));
  }
  return absl::OkStatus();
}

absl::Status StateStore::Write(const RowBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  // The lambda runs inside this call, under mu_: it uses the connection through a
  // local, which the thread-safety analysis (which does not follow lambdas) accepts.
  sqlite3* const db = db_;
  return InTransaction(db, [&]() -> absl::Status {
    DDP_RETURN_IF_ERROR(Upsert(db, store::Jobs(), batch.jobs));
    DDP_RETURN_IF_ERROR(Upsert(db, store::Attempts(), batch.attempts));
    DDP_RETURN_IF_ERROR(Upsert(db, store::Ranks(), batch.ranks));
    DDP_RETURN_IF_ERROR(Upsert(db, store::Workers(), batch.workers));
    if (!batch.removed_workers.empty()) {
      Stmt d(db, "DELETE FROM workers WHERE name = ?");
      DDP_RETURN_IF_ERROR(d.ok());
      Stmt b(db, "DELETE FROM worker_batches WHERE worker = ?");
      DDP_RETURN_IF_ERROR(b.ok());
      for (const std::string& name : batch.removed_workers) {
        d.Bind(1, name);
        DDP_RETURN_IF_ERROR(d.Run());
        b.Bind(1, name);
        DDP_RETURN_IF_ERROR(b.Run());
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<LoadedState> StateStore::Load() {
  absl::MutexLock lock(&mu_);
  LoadedState out;
  out.cluster_id = cluster_id_;
  DDP_ASSIGN_OR_RETURN(std::vector<RowBatch::JobRow> jobs,
                       Select(db_, store::Jobs(), "ORDER BY seq"));
  DDP_ASSIGN_OR_RETURN(std::vector<RowBatch::AttemptRow> attempts,
                       Select(db_, store::Attempts(), "ORDER BY job_id, number"));
  DDP_ASSIGN_OR_RETURN(std::vector<RowBatch::RankRow> ranks,
                       Select(db_, store::Ranks(), "ORDER BY job_id, attempt, rank"));
  out.jobs = AssembleJobs(std::move(jobs), std::move(attempts), std::move(ranks));
  std::map<std::string, StoredJob*> index;
  for (StoredJob& sj : out.jobs) index[sj.job.id()] = &sj;
  DDP_ASSIGN_OR_RETURN(out.workers,
                       Select(db_, store::Workers(), "ORDER BY name"));
  DDP_ASSIGN_OR_RETURN(out.batch_marks,
                       Select(db_, store::WorkerBatches(), "ORDER BY worker"));
  // Output already kept per job, for --max-log-bytes-per-job (one pass over the logs
  // table at start).
  Stmt lb(db_, "SELECT job_id, SUM(LENGTH(CAST(text AS BLOB))) FROM logs GROUP BY job_id");
  DDP_RETURN_IF_ERROR(lb.ok());
  while (lb.Step()) {
    auto it = index.find(lb.Text(0));
    if (it != index.end()) it->second->log_bytes = lb.Int(1);
  }
  DDP_RETURN_IF_ERROR(lb.Done());
  return out;
}

absl::Status StateStore::AppendAll(const std::vector<JobOutput>& outputs,
                                   const std::vector<BatchMark>& marks) {
  if (NothingToAppend(outputs, marks)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  std::vector<store::OutputCounts::Count*> counts;
  for (const JobOutput& o : outputs) {
    auto count = CountLocked(o.job_id);
    if (!count.ok()) return count.status();
    counts.push_back(*count);
  }
  // The lambda runs inside this call, under mu_: it uses the connection through a
  // local, which the thread-safety analysis (which does not follow lambdas) accepts.
  sqlite3* const db = db_;
  absl::Status st = InTransaction(db, [&]() -> absl::Status {
    Stmt m(db, store::Metrics().InsertSql());
    Stmt e(db, store::Epochs().InsertSql());
    Stmt l(db, store::Logs().InsertSql());
    DDP_RETURN_IF_ERROR(m.ok());
    DDP_RETURN_IF_ERROR(e.ok());
    DDP_RETURN_IF_ERROR(l.ok());
    for (const JobOutput& o : outputs) {
      for (const v1::RankMetrics& x : o.metrics) {
        store::Metrics().Bind(m.Bind(1, o.job_id), x);
        DDP_RETURN_IF_ERROR(m.Run());
      }
      for (const v1::EpochSummary& x : o.epochs) {
        store::Epochs().Bind(e.Bind(1, o.job_id), x);
        DDP_RETURN_IF_ERROR(e.Run());
      }
      for (const v1::LogLine& x : o.logs) {
        store::Logs().Bind(l.Bind(1, o.job_id), x);
        DDP_RETURN_IF_ERROR(l.Run());
      }
    }
    // A new incarnation starts its numbering again; within one, numbers only grow.
    Stmt b(db, store::WorkerBatches().InsertSql(store::Dialect::kSqlite, /*replace=*/false) +
                   " ON CONFLICT(worker) DO UPDATE SET batch_seq = CASE"
                   " WHEN incarnation = excluded.incarnation THEN"
                   " MAX(batch_seq, excluded.batch_seq)"
                   " ELSE excluded.batch_seq END, incarnation = excluded.incarnation");
    DDP_RETURN_IF_ERROR(b.ok());
    for (const BatchMark& x : marks) {
      store::WorkerBatches().Bind(b, x);
      DDP_RETURN_IF_ERROR(b.Run());
    }
    return absl::OkStatus();
  });
  if (st.ok()) {
    for (size_t i = 0; i < outputs.size(); ++i) store::OutputCounts::Appended(counts[i], outputs[i]);
  }
  return st;
}

absl::StatusOr<store::OutputCounts::Count*> StateStore::CountLocked(const std::string& job_id) {
  if (store::OutputCounts::Count* found = counts_.Find(job_id)) return found;
  store::OutputCounts::Count c;
  Stmt m(db_, "SELECT COUNT(*) FROM metrics WHERE job_id = ?");
  DDP_RETURN_IF_ERROR(m.ok());
  m.Bind(1, job_id);
  m.Step();
  DDP_RETURN_IF_ERROR(m.Done());
  c.metric_rows = m.Int(0);
  Stmt l(db_, "SELECT COALESCE(MIN(seq), 1) - 1, COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?");
  DDP_RETURN_IF_ERROR(l.ok());
  l.Bind(1, job_id);
  l.Step();
  DDP_RETURN_IF_ERROR(l.Done());
  c.log_floor = l.Int(0);
  c.log_top = l.Int(1);
  return counts_.Add(job_id, c);
}

absl::StatusOr<std::vector<v1::LogLine>> StateStore::ReadLogs(const std::string& job_id,
                                                              int64_t after_seq,
                                                              std::optional<int> rank,
                                                              int64_t limit, int64_t tail) {
  absl::MutexLock lock(&read_mu_);
  // With a tail, take the newest `tail` lines (descending) and flip them.
  const std::string rest = absl::StrCat(
      "WHERE job_id = ?1 AND seq > ?2", rank.has_value() ? " AND rank = ?3" : "",
      tail > 0 ? " ORDER BY seq DESC LIMIT ?4" : " ORDER BY seq LIMIT ?4");
  DDP_ASSIGN_OR_RETURN(std::vector<v1::LogLine> out,
                       Select(reader_, store::Logs(), rest, [&](Stmt& s) {
                         s.Bind(1, job_id).Bind(2, after_seq);
                         s.Bind(4, tail > 0 ? std::min(tail, limit) : limit);
                         if (rank.has_value()) s.Bind(3, *rank);
                       }));
  if (tail > 0) std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<int64_t> StateStore::MaxLogSeq(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(reader_, "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?");
  DDP_RETURN_IF_ERROR(s.ok());
  s.Bind(1, job_id);
  s.Step();
  DDP_RETURN_IF_ERROR(s.Done());
  return s.Int(0);
}

absl::StatusOr<std::vector<v1::RankMetrics>> StateStore::LatestMetrics(const std::string& job_id,
                                                                       int attempt) {
  absl::MutexLock lock(&read_mu_);
  return Select(reader_, store::Metrics(),
                "AS m WHERE job_id = ?1 AND attempt = ?2 AND global_step ="
                " (SELECT MAX(global_step) FROM metrics WHERE job_id = ?1 AND"
                " attempt = ?2 AND rank = m.rank) ORDER BY rank",
                [&](Stmt& s) { s.Bind(1, job_id).Bind(2, attempt); });
}

absl::StatusOr<std::vector<v1::RankMetrics>> StateStore::MetricHistory(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  return Select(reader_, store::Metrics(), "WHERE job_id = ? ORDER BY attempt, global_step, rank",
                [&](Stmt& s) { s.Bind(1, job_id); });
}

absl::StatusOr<std::vector<v1::EpochSummary>> StateStore::Epochs(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  return Select(reader_, store::Epochs(), "WHERE job_id = ? ORDER BY attempt, epoch",
                [&](Stmt& s) { s.Bind(1, job_id); });
}

absl::Status StateStore::EnforceRetention(const std::vector<std::string>& delete_ids) {
  absl::MutexLock lock(&mu_);
  const std::vector<store::OutputCounts::Trim> trims = counts_.Plan(delete_ids, retention_);
  // The lambda runs inside this call, under mu_: it uses the connection through a
  // local, which the thread-safety analysis (which does not follow lambdas) accepts.
  sqlite3* const db = db_;
  absl::Status st = InTransaction(db, [&]() -> absl::Status {
    for (const char* table : {"jobs", "attempts", "ranks", "metrics", "epochs", "logs"}) {
      Stmt d(db, absl::StrCat("DELETE FROM ", table, " WHERE ",
                               std::string(table) == "jobs" ? "id" : "job_id", " = ?")
                      .c_str());
      DDP_RETURN_IF_ERROR(d.ok());
      for (const std::string& id : delete_ids) DDP_RETURN_IF_ERROR(d.Bind(1, id).Run());
    }
    // Per job over a bound: delete its oldest rows (by row id, and by seq for lines),
    // walking only the rows that go.
    Stmt metrics(db,
                 "DELETE FROM metrics WHERE rowid IN (SELECT rowid FROM metrics"
                 " WHERE job_id = ? ORDER BY rowid LIMIT ?)");
    Stmt logs(db, "DELETE FROM logs WHERE job_id = ? AND seq <= ?");
    DDP_RETURN_IF_ERROR(metrics.ok());
    DDP_RETURN_IF_ERROR(logs.ok());
    for (const store::OutputCounts::Trim& t : trims) {
      if (t.oldest_metric_rows > 0) {
        DDP_RETURN_IF_ERROR(metrics.Bind(1, t.job_id).Bind(2, t.oldest_metric_rows).Run());
      }
      if (t.log_floor > 0) DDP_RETURN_IF_ERROR(logs.Bind(1, t.job_id).Bind(2, t.log_floor).Run());
    }
    return absl::OkStatus();
  });
  if (st.ok()) counts_.Done(delete_ids, trims);  // Else nothing changed: the counts stand.
  return st;
}

}  // namespace ddp
