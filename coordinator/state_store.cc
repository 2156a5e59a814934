#include "coordinator/state_store.h"

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
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace ddp {
namespace {

constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL, name TEXT NOT NULL, rdzv_id TEXT NOT NULL,
  state INTEGER NOT NULL, reason TEXT NOT NULL, spec_yaml TEXT NOT NULL, workdir TEXT NOT NULL,
  min_nodes INTEGER NOT NULL, max_nodes INTEGER NOT NULL, nproc_per_node INTEGER NOT NULL,
  max_restarts INTEGER NOT NULL, restarts INTEGER NOT NULL, epochs INTEGER NOT NULL,
  submit_ms INTEGER NOT NULL, start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL,
  owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS attempts(
  job_id TEXT NOT NULL, number INTEGER NOT NULL, state INTEGER NOT NULL, reason TEXT NOT NULL,
  master_addr TEXT NOT NULL, master_port INTEGER NOT NULL, world_size INTEGER NOT NULL,
  start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL, PRIMARY KEY(job_id, number));
CREATE TABLE IF NOT EXISTS ranks(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  local_rank INTEGER NOT NULL, group_rank INTEGER NOT NULL, worker TEXT NOT NULL,
  address TEXT NOT NULL, pid INTEGER NOT NULL, exited INTEGER NOT NULL,
  exit_code INTEGER NOT NULL, signal INTEGER NOT NULL, error TEXT NOT NULL,
  PRIMARY KEY(job_id, attempt, rank));
-- The last ReportEvents batch stored per worker incarnation (batch_seq de-duplication
-- that survives a restart): written in the transaction that stores the batch's events.
CREATE TABLE IF NOT EXISTS worker_batches(
  worker TEXT PRIMARY KEY, incarnation TEXT NOT NULL, batch_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS workers(
  name TEXT PRIMARY KEY, incarnation TEXT NOT NULL, address TEXT NOT NULL,
  hostname TEXT NOT NULL, slots INTEGER NOT NULL, gpus INTEGER NOT NULL,
  registered_ms INTEGER NOT NULL, last_heartbeat_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS metrics(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  global_step INTEGER NOT NULL, epoch INTEGER NOT NULL, step INTEGER NOT NULL,
  steps INTEGER NOT NULL, loss REAL, samples_per_s REAL, step_ms REAL, comm_ms REAL,
  time_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics(job_id, attempt, rank, global_step);
CREATE INDEX IF NOT EXISTS metrics_by_job_row ON metrics(job_id);
CREATE TABLE IF NOT EXISTS epochs(
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, epoch INTEGER NOT NULL,
  train_loss REAL, val_loss REAL, val_accuracy REAL, time_ms INTEGER NOT NULL,
  PRIMARY KEY(job_id, attempt, epoch));
CREATE TABLE IF NOT EXISTS logs(
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  stream TEXT NOT NULL, text TEXT NOT NULL, time_ms INTEGER NOT NULL,
  PRIMARY KEY(job_id, seq));
)sql";

// Columns added after schema version 1 was released: added to an older database
// when it is opened (ALTER TABLE ... ADD COLUMN, with a default for the rows it
// has), so a coordinator upgrade keeps its state. Append; never reorder.
struct AddedColumn {
  const char* table;
  const char* column;
  const char* decl;
};
constexpr AddedColumn kAddedColumns[] = {
    // The GPU a rank was given (RankAssignment.gpu_uuid).
    {"ranks", "gpu_uuid", "TEXT NOT NULL DEFAULT ''"},
    // The worker's GPUs (EncodeGpus: one "index uuid memory_bytes model" line each).
    {"workers", "gpu_devices", "TEXT NOT NULL DEFAULT ''"},
    // Who submitted the job (Job.owner).
    {"jobs", "owner", "TEXT NOT NULL DEFAULT ''"},
    // An operator's maintenance state (Worker.maintenance and what goes with it).
    {"workers", "maintenance", "INTEGER NOT NULL DEFAULT 0"},
    {"workers", "drain_policy", "INTEGER NOT NULL DEFAULT 0"},
    {"workers", "maintenance_since_ms", "INTEGER NOT NULL DEFAULT 0"},
    {"workers", "maintenance_by", "TEXT NOT NULL DEFAULT ''"},
};

std::string EncodeGpus(const v1::Worker& w) {
  std::string out;
  for (const v1::GpuDevice& g : w.gpu_devices()) {
    absl::StrAppend(&out, g.index(), " ", g.uuid(), " ", g.memory_bytes(), " ", g.model(), "\n");
  }
  return out;
}

void DecodeGpus(const std::string& text, v1::Worker* w) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    if (f.size() < 3) continue;
    v1::GpuDevice* g = w->add_gpu_devices();
    int32_t index = 0;
    int64_t memory = 0;
    (void)absl::SimpleAtoi(f[0], &index);
    (void)absl::SimpleAtoi(f[2], &memory);
    g->set_index(index);
    g->set_uuid(std::string(f[1]));
    g->set_memory_bytes(memory);
    if (f.size() > 3) g->set_model(std::string(f[3]));
  }
}

absl::Status SqlError(sqlite3* db, const std::string& what) {
  return absl::InternalError(absl::StrCat("sqlite: ", what, ": ", sqlite3_errmsg(db)));
}

// A prepared statement with typed binds and columns; finalized on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status ok() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : SqlError(db_, "prepare");
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v) {
    if (std::isnan(v)) {
      sqlite3_bind_null(stmt_, i);
    } else {
      sqlite3_bind_double(stmt_, i, v);
    }
    return *this;
  }
  // SQLITE_ROW: true; SQLITE_DONE: false; errors go to status().
  bool Step() {
    rc_ = sqlite3_step(stmt_);
    return rc_ == SQLITE_ROW;
  }
  absl::Status Run() {
    Step();
    absl::Status st = Done();
    Reset();
    return st;
  }
  absl::Status Done() const {
    return rc_ == SQLITE_DONE || rc_ == SQLITE_ROW ? absl::OkStatus() : SqlError(db_, "step");
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? std::nan("")
                                                          : sqlite3_column_double(stmt_, col);
  }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// Runs `body` inside BEGIN/COMMIT, rolling back on error.
template <typename Fn>
absl::Status InTransaction(sqlite3* db, Fn&& body) {
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqlError(db, "begin");
  }
  absl::Status st = body();
  if (!st.ok()) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return st;
  }
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    absl::Status err = SqlError(db, "commit");
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return err;
  }
  return absl::OkStatus();
}

v1::RankMetrics MetricsRow(const Stmt& s, int first_col) {
  v1::RankMetrics m;
  m.set_attempt(static_cast<int32_t>(s.Int(first_col)));
  m.set_rank(static_cast<int32_t>(s.Int(first_col + 1)));
  m.set_global_step(s.Int(first_col + 2));
  m.set_epoch(s.Int(first_col + 3));
  m.set_step(s.Int(first_col + 4));
  m.set_steps(s.Int(first_col + 5));
  m.set_loss(s.Real(first_col + 6));
  m.set_samples_per_s(s.Real(first_col + 7));
  m.set_step_ms(s.Real(first_col + 8));
  m.set_comm_ms(s.Real(first_col + 9));
  m.set_update_ms(s.Int(first_col + 10));
  return m;
}

constexpr char kMetricColumns[] =
    "attempt, rank, global_step, epoch, step, steps, loss, samples_per_s, step_ms, comm_ms, "
    "time_ms";

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

absl::Status ValidateRetention(const RetentionOptions& r) {
  for (auto [flag, value] : {std::pair{"--retain-jobs", r.retain_jobs},
                             std::pair{"--max-log-lines", r.max_log_lines},
                             std::pair{"--max-metric-rows", r.max_metric_rows}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": must be >= 1 (got ", value, "); it bounds what is kept"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> JobsPastRetention(std::vector<FinishedJob> finished,
                                           int64_t retain_jobs) {
  std::sort(finished.begin(), finished.end(), [](const FinishedJob& a, const FinishedJob& b) {
    return std::tie(a.end_ms, a.seq) < std::tie(b.end_ms, b.seq);
  });
  std::vector<std::string> out;
  const int64_t drop = static_cast<int64_t>(finished.size()) - std::max<int64_t>(retain_jobs, 0);
  for (int64_t i = 0; i < drop; ++i) out.push_back(finished[static_cast<size_t>(i)].id);
  return out;
}

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
    absl::Status st = store->ExecLocked(kSchema);
    if (!st.ok()) {
      return absl::DataLossError(
          absl::StrCat(path, " is not a ddp state database (", st.message(), ")"));
    }
    for (const AddedColumn& c : kAddedColumns) {
      DDP_RETURN_IF_ERROR(store->AddColumnLocked(c.table, c.column, c.decl));
    }
    Stmt get(db, "SELECT value FROM meta WHERE key = 'schema_version'");
    DDP_RETURN_IF_ERROR(get.ok());
    if (get.Step()) {
      if (get.Text(0) != std::to_string(kSchemaVersion)) {
        return absl::DataLossError(absl::StrCat(path, " has schema version ", get.Text(0),
                                                "; this coordinator reads version ",
                                                kSchemaVersion));
      }
    } else {
      Stmt put(db, "INSERT INTO meta(key, value) VALUES('schema_version', ?)");
      DDP_RETURN_IF_ERROR(put.Bind(1, std::to_string(kSchemaVersion)).Run());
    }
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

absl::Status StateStore::AddColumnLocked(const char* table, const char* column,
                                         const char* decl) {
  Stmt info(db_, absl::StrCat("PRAGMA table_info(", table, ")").c_str());
  DDP_RETURN_IF_ERROR(info.ok());
  while (info.Step()) {
    if (info.Text(1) == column) return absl::OkStatus();  // Already there.
  }
  DDP_RETURN_IF_ERROR(info.Done());
  return ExecLocked(absl::StrCat("ALTER TABLE ", table, " ADD COLUMN ", column, " ", decl).c_str());
}

absl::Status StateStore::Write(const RowBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  // The lambda runs inside this call, under mu_: it uses the connection through a
  // local, which the thread-safety analysis (which does not follow lambdas) accepts.
  sqlite3* const db = db_;
  return InTransaction(db, [&]() -> absl::Status {
    if (!batch.jobs.empty()) {
      Stmt j(db,
             "INSERT OR REPLACE INTO jobs(id, seq, name, rdzv_id, state, reason, spec_yaml,"
             " workdir, min_nodes, max_nodes, nproc_per_node, max_restarts, restarts, epochs,"
             " submit_ms, start_ms, end_ms, owner) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
      DDP_RETURN_IF_ERROR(j.ok());
      for (const RowBatch::JobRow& row : batch.jobs) {
        const v1::Job& job = row.job;
        j.Bind(1, job.id()).Bind(2, row.seq).Bind(3, job.name()).Bind(4, job.rdzv_id());
        j.Bind(5, static_cast<int>(job.state())).Bind(6, job.reason()).Bind(7, job.spec_yaml());
        j.Bind(8, job.workdir()).Bind(9, job.min_nodes()).Bind(10, job.max_nodes());
        j.Bind(11, job.nproc_per_node()).Bind(12, job.max_restarts()).Bind(13, job.restarts());
        j.Bind(14, job.epochs()).Bind(15, job.submit_ms()).Bind(16, job.start_ms());
        j.Bind(17, job.end_ms()).Bind(18, job.owner());
        DDP_RETURN_IF_ERROR(j.Run());
      }
    }
    if (!batch.attempts.empty()) {
      Stmt a(db,
             "INSERT OR REPLACE INTO attempts(job_id, number, state, reason, master_addr,"
             " master_port, world_size, start_ms, end_ms) VALUES(?,?,?,?,?,?,?,?,?)");
      DDP_RETURN_IF_ERROR(a.ok());
      for (const RowBatch::AttemptRow& row : batch.attempts) {
        const v1::Attempt& at = row.attempt;
        a.Bind(1, row.job_id).Bind(2, at.number()).Bind(3, static_cast<int>(at.state()));
        a.Bind(4, at.reason()).Bind(5, at.master_addr()).Bind(6, at.master_port());
        a.Bind(7, at.world_size()).Bind(8, at.start_ms()).Bind(9, at.end_ms());
        DDP_RETURN_IF_ERROR(a.Run());
      }
    }
    if (!batch.ranks.empty()) {
      Stmt r(db,
             "INSERT OR REPLACE INTO ranks(job_id, attempt, rank, local_rank, group_rank, worker,"
             " address, pid, exited, exit_code, signal, error, gpu_uuid)"
             " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)");
      DDP_RETURN_IF_ERROR(r.ok());
      for (const RowBatch::RankRow& row : batch.ranks) {
        const v1::RankAssignment& rk = row.rank;
        r.Bind(1, row.job_id).Bind(2, row.attempt).Bind(3, rk.rank()).Bind(4, rk.local_rank());
        r.Bind(5, rk.group_rank()).Bind(6, rk.worker()).Bind(7, rk.address()).Bind(8, rk.pid());
        r.Bind(9, rk.exited() ? 1 : 0).Bind(10, rk.exit_code()).Bind(11, rk.signal());
        r.Bind(12, rk.error()).Bind(13, rk.gpu_uuid());
        DDP_RETURN_IF_ERROR(r.Run());
      }
    }
    if (!batch.workers.empty()) {
      Stmt s(db,
             "INSERT OR REPLACE INTO workers(name, incarnation, address, hostname, slots, gpus,"
             " registered_ms, last_heartbeat_ms, gpu_devices, maintenance, drain_policy,"
             " maintenance_since_ms, maintenance_by) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)");
      DDP_RETURN_IF_ERROR(s.ok());
      for (const v1::Worker& w : batch.workers) {
        s.Bind(1, w.name()).Bind(2, w.incarnation()).Bind(3, w.address()).Bind(4, w.hostname());
        s.Bind(5, w.slots()).Bind(6, w.gpus()).Bind(7, w.registered_ms());
        s.Bind(8, w.last_heartbeat_ms()).Bind(9, EncodeGpus(w));
        s.Bind(10, static_cast<int64_t>(w.maintenance()));
        s.Bind(11, static_cast<int64_t>(w.drain_policy()));
        s.Bind(12, w.maintenance_since_ms()).Bind(13, w.maintenance_by());
        DDP_RETURN_IF_ERROR(s.Run());
      }
    }
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

absl::Status StateStore::SaveJob(const v1::Job& job, int64_t seq) {
  RowBatch batch;
  batch.jobs.push_back({job, seq});
  for (const v1::Attempt& at : job.attempts()) {
    batch.attempts.push_back({job.id(), at});
    for (const v1::RankAssignment& rk : at.ranks()) {
      batch.ranks.push_back({job.id(), at.number(), rk});
    }
  }
  return Write(batch);
}

absl::Status StateStore::SaveWorker(const v1::Worker& w) {
  RowBatch batch;
  batch.workers.push_back(w);
  return Write(batch);
}

absl::StatusOr<LoadedState> StateStore::Load() {
  absl::MutexLock lock(&mu_);
  LoadedState out;
  std::map<std::string, size_t> index;
  Stmt j(db_,
         "SELECT id, seq, name, rdzv_id, state, reason, spec_yaml, workdir, min_nodes, max_nodes,"
         " nproc_per_node, max_restarts, restarts, epochs, submit_ms, start_ms, end_ms, owner"
         " FROM jobs ORDER BY seq");
  DDP_RETURN_IF_ERROR(j.ok());
  while (j.Step()) {
    StoredJob sj;
    v1::Job& job = sj.job;
    job.set_id(j.Text(0));
    sj.seq = j.Int(1);
    job.set_name(j.Text(2));
    job.set_rdzv_id(j.Text(3));
    job.set_state(static_cast<v1::JobState>(j.Int(4)));
    job.set_reason(j.Text(5));
    job.set_spec_yaml(j.Text(6));
    job.set_workdir(j.Text(7));
    job.set_min_nodes(static_cast<int32_t>(j.Int(8)));
    job.set_max_nodes(static_cast<int32_t>(j.Int(9)));
    job.set_nproc_per_node(static_cast<int32_t>(j.Int(10)));
    job.set_max_restarts(static_cast<int32_t>(j.Int(11)));
    job.set_restarts(static_cast<int32_t>(j.Int(12)));
    job.set_epochs(j.Int(13));
    job.set_submit_ms(j.Int(14));
    job.set_start_ms(j.Int(15));
    job.set_end_ms(j.Int(16));
    job.set_owner(j.Text(17));
    index[job.id()] = out.jobs.size();
    out.jobs.push_back(std::move(sj));
  }
  DDP_RETURN_IF_ERROR(j.Done());
  Stmt a(db_,
         "SELECT job_id, number, state, reason, master_addr, master_port, world_size, start_ms,"
         " end_ms FROM attempts ORDER BY job_id, number");
  DDP_RETURN_IF_ERROR(a.ok());
  while (a.Step()) {
    auto it = index.find(a.Text(0));
    if (it == index.end()) continue;
    v1::Attempt* at = out.jobs[it->second].job.add_attempts();
    at->set_number(static_cast<int32_t>(a.Int(1)));
    at->set_state(static_cast<v1::JobState>(a.Int(2)));
    at->set_reason(a.Text(3));
    at->set_master_addr(a.Text(4));
    at->set_master_port(static_cast<int32_t>(a.Int(5)));
    at->set_world_size(static_cast<int32_t>(a.Int(6)));
    at->set_start_ms(a.Int(7));
    at->set_end_ms(a.Int(8));
  }
  DDP_RETURN_IF_ERROR(a.Done());
  Stmt r(db_,
         "SELECT job_id, attempt, rank, local_rank, group_rank, worker, address, pid, exited,"
         " exit_code, signal, error, gpu_uuid FROM ranks ORDER BY job_id, attempt, rank");
  DDP_RETURN_IF_ERROR(r.ok());
  while (r.Step()) {
    auto it = index.find(r.Text(0));
    if (it == index.end()) continue;
    for (v1::Attempt& at : *out.jobs[it->second].job.mutable_attempts()) {
      if (at.number() != r.Int(1)) continue;
      v1::RankAssignment* rk = at.add_ranks();
      rk->set_rank(static_cast<int32_t>(r.Int(2)));
      rk->set_local_rank(static_cast<int32_t>(r.Int(3)));
      rk->set_group_rank(static_cast<int32_t>(r.Int(4)));
      rk->set_worker(r.Text(5));
      rk->set_address(r.Text(6));
      rk->set_pid(static_cast<int32_t>(r.Int(7)));
      rk->set_exited(r.Int(8) != 0);
      rk->set_exit_code(static_cast<int32_t>(r.Int(9)));
      rk->set_signal(static_cast<int32_t>(r.Int(10)));
      rk->set_error(r.Text(11));
      rk->set_gpu_uuid(r.Text(12));
    }
  }
  DDP_RETURN_IF_ERROR(r.Done());
  Stmt w(db_,
         "SELECT name, incarnation, address, hostname, slots, gpus, registered_ms,"
         " last_heartbeat_ms, gpu_devices, maintenance, drain_policy, maintenance_since_ms,"
         " maintenance_by FROM workers ORDER BY name");
  DDP_RETURN_IF_ERROR(w.ok());
  while (w.Step()) {
    v1::Worker& wk = out.workers.emplace_back();
    wk.set_name(w.Text(0));
    wk.set_incarnation(w.Text(1));
    wk.set_address(w.Text(2));
    wk.set_hostname(w.Text(3));
    wk.set_slots(static_cast<int32_t>(w.Int(4)));
    wk.set_gpus(static_cast<int32_t>(w.Int(5)));
    wk.set_registered_ms(w.Int(6));
    wk.set_last_heartbeat_ms(w.Int(7));
    DecodeGpus(w.Text(8), &wk);
    // A value this build does not know (a newer coordinator's) reads as cordoned:
    // an operator took the node out, so it stays out.
    const int64_t m = w.Int(9);
    wk.set_maintenance(v1::WorkerMaintenance_IsValid(static_cast<int>(m))
                           ? static_cast<v1::WorkerMaintenance>(m)
                           : v1::WORKER_CORDONED);
    const int64_t p = w.Int(10);
    wk.set_drain_policy(v1::DrainPolicy_IsValid(static_cast<int>(p))
                            ? static_cast<v1::DrainPolicy>(p)
                            : v1::DRAIN_WAIT);
    wk.set_maintenance_since_ms(w.Int(11));
    wk.set_maintenance_by(w.Text(12));
  }
  DDP_RETURN_IF_ERROR(w.Done());
  Stmt bm(db_, "SELECT worker, incarnation, batch_seq FROM worker_batches ORDER BY worker");
  DDP_RETURN_IF_ERROR(bm.ok());
  while (bm.Step()) out.batch_marks.push_back({bm.Text(0), bm.Text(1), bm.Int(2)});
  DDP_RETURN_IF_ERROR(bm.Done());
  // Output already kept per job, for --max-log-bytes-per-job (one pass over the logs
  // table at start).
  Stmt lb(db_, "SELECT job_id, SUM(LENGTH(CAST(text AS BLOB))) FROM logs GROUP BY job_id");
  DDP_RETURN_IF_ERROR(lb.ok());
  while (lb.Step()) {
    auto it = index.find(lb.Text(0));
    if (it != index.end()) out.jobs[it->second].log_bytes = lb.Int(1);
  }
  DDP_RETURN_IF_ERROR(lb.Done());
  return out;
}

absl::Status StateStore::Append(const std::string& job_id,
                                const std::vector<v1::RankMetrics>& metrics,
                                const std::vector<v1::EpochSummary>& epochs,
                                const std::vector<v1::LogLine>& logs) {
  return AppendAll({JobOutput{job_id, metrics, epochs, logs}}, {});
}

absl::Status StateStore::AppendAll(const std::vector<JobOutput>& outputs,
                                   const std::vector<BatchMark>& marks) {
  bool empty = marks.empty();
  for (const JobOutput& o : outputs) {
    empty = empty && o.metrics.empty() && o.epochs.empty() && o.logs.empty();
  }
  if (empty) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  std::vector<OutputCount*> counts;
  for (const JobOutput& o : outputs) {
    auto count = CountLocked(o.job_id);
    if (!count.ok()) return count.status();
    counts.push_back(*count);
  }
  // The lambda runs inside this call, under mu_: it uses the connection through a
  // local, which the thread-safety analysis (which does not follow lambdas) accepts.
  sqlite3* const db = db_;
  absl::Status st = InTransaction(db, [&]() -> absl::Status {
    Stmt m(db, absl::StrCat("INSERT INTO metrics(job_id, ", kMetricColumns,
                             ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?)")
                    .c_str());
    DDP_RETURN_IF_ERROR(m.ok());
    Stmt e(db,
           "INSERT OR REPLACE INTO epochs(job_id, attempt, epoch, train_loss, val_loss,"
           " val_accuracy, time_ms) VALUES(?,?,?,?,?,?,?)");
    DDP_RETURN_IF_ERROR(e.ok());
    Stmt l(db,
           "INSERT OR REPLACE INTO logs(job_id, seq, attempt, rank, stream, text, time_ms)"
           " VALUES(?,?,?,?,?,?,?)");
    DDP_RETURN_IF_ERROR(l.ok());
    for (const JobOutput& o : outputs) {
      for (const v1::RankMetrics& x : o.metrics) {
        m.Bind(1, o.job_id).Bind(2, x.attempt()).Bind(3, x.rank()).Bind(4, x.global_step());
        m.Bind(5, x.epoch()).Bind(6, x.step()).Bind(7, x.steps()).Bind(8, x.loss());
        m.Bind(9, x.samples_per_s()).Bind(10, x.step_ms()).Bind(11, x.comm_ms());
        m.Bind(12, x.update_ms());
        DDP_RETURN_IF_ERROR(m.Run());
      }
      for (const v1::EpochSummary& x : o.epochs) {
        e.Bind(1, o.job_id).Bind(2, x.attempt()).Bind(3, x.epoch()).Bind(4, x.train_loss());
        e.Bind(5, x.val_loss()).Bind(6, x.val_accuracy()).Bind(7, x.time_ms());
        DDP_RETURN_IF_ERROR(e.Run());
      }
      for (const v1::LogLine& x : o.logs) {
        l.Bind(1, o.job_id).Bind(2, x.seq()).Bind(3, x.attempt()).Bind(4, x.rank());
        l.Bind(5, x.stream()).Bind(6, x.text()).Bind(7, x.time_ms());
        DDP_RETURN_IF_ERROR(l.Run());
      }
    }
    // A new incarnation starts its numbering again; within one, numbers only grow.
    Stmt b(db,
           "INSERT INTO worker_batches(worker, incarnation, batch_seq) VALUES(?,?,?)"
           " ON CONFLICT(worker) DO UPDATE SET batch_seq = CASE"
           " WHEN incarnation = excluded.incarnation THEN MAX(batch_seq, excluded.batch_seq)"
           " ELSE excluded.batch_seq END, incarnation = excluded.incarnation");
    DDP_RETURN_IF_ERROR(b.ok());
    for (const BatchMark& x : marks) {
      b.Bind(1, x.worker).Bind(2, x.incarnation).Bind(3, x.batch_seq);
      DDP_RETURN_IF_ERROR(b.Run());
    }
    return absl::OkStatus();
  });
  if (st.ok()) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      OutputCount& c = *counts[i];
      c.metric_rows += static_cast<int64_t>(outputs[i].metrics.size());
      for (const v1::LogLine& x : outputs[i].logs) c.log_top = std::max(c.log_top, x.seq());
    }
  }
  return st;
}

absl::StatusOr<StateStore::OutputCount*> StateStore::CountLocked(const std::string& job_id) {
  auto it = output_.find(job_id);
  if (it != output_.end()) return &it->second;
  OutputCount c;
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
  return &output_.emplace(job_id, c).first->second;
}

absl::StatusOr<std::vector<v1::LogLine>> StateStore::ReadLogs(const std::string& job_id,
                                                              int64_t after_seq,
                                                              std::optional<int> rank,
                                                              int64_t limit, int64_t tail) {
  absl::MutexLock lock(&read_mu_);
  // With a tail, take the newest `tail` lines (descending) and flip them.
  std::string sql = absl::StrCat(
      "SELECT seq, attempt, rank, stream, text, time_ms FROM logs WHERE job_id = ?1"
      " AND seq > ?2",
      rank.has_value() ? " AND rank = ?3" : "", tail > 0 ? " ORDER BY seq DESC LIMIT ?4"
                                                         : " ORDER BY seq LIMIT ?4");
  Stmt s(reader_, sql.c_str());
  DDP_RETURN_IF_ERROR(s.ok());
  s.Bind(1, job_id).Bind(2, after_seq).Bind(4, tail > 0 ? std::min(tail, limit) : limit);
  if (rank.has_value()) s.Bind(3, *rank);
  std::vector<v1::LogLine> out;
  while (s.Step()) {
    v1::LogLine& l = out.emplace_back();
    l.set_seq(s.Int(0));
    l.set_attempt(static_cast<int32_t>(s.Int(1)));
    l.set_rank(static_cast<int32_t>(s.Int(2)));
    l.set_stream(s.Text(3));
    l.set_text(s.Text(4));
    l.set_time_ms(s.Int(5));
  }
  DDP_RETURN_IF_ERROR(s.Done());
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
  Stmt s(reader_, absl::StrCat("SELECT ", kMetricColumns,
                           " FROM metrics m WHERE job_id = ?1 AND attempt = ?2 AND global_step ="
                           " (SELECT MAX(global_step) FROM metrics WHERE job_id = ?1 AND"
                           " attempt = ?2 AND rank = m.rank) ORDER BY rank")
                  .c_str());
  DDP_RETURN_IF_ERROR(s.ok());
  s.Bind(1, job_id).Bind(2, attempt);
  std::vector<v1::RankMetrics> out;
  while (s.Step()) out.push_back(MetricsRow(s, 0));
  DDP_RETURN_IF_ERROR(s.Done());
  return out;
}

absl::StatusOr<std::vector<v1::RankMetrics>> StateStore::MetricHistory(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(reader_, absl::StrCat("SELECT ", kMetricColumns,
                           " FROM metrics WHERE job_id = ? ORDER BY attempt, global_step, rank")
                  .c_str());
  DDP_RETURN_IF_ERROR(s.ok());
  s.Bind(1, job_id);
  std::vector<v1::RankMetrics> out;
  while (s.Step()) out.push_back(MetricsRow(s, 0));
  DDP_RETURN_IF_ERROR(s.Done());
  return out;
}

absl::StatusOr<std::vector<v1::EpochSummary>> StateStore::Epochs(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(reader_,
         "SELECT attempt, epoch, train_loss, val_loss, val_accuracy, time_ms FROM epochs"
         " WHERE job_id = ? ORDER BY attempt, epoch");
  DDP_RETURN_IF_ERROR(s.ok());
  s.Bind(1, job_id);
  std::vector<v1::EpochSummary> out;
  while (s.Step()) {
    v1::EpochSummary& e = out.emplace_back();
    e.set_attempt(static_cast<int32_t>(s.Int(0)));
    e.set_epoch(s.Int(1));
    e.set_train_loss(s.Real(2));
    e.set_val_loss(s.Real(3));
    e.set_val_accuracy(s.Real(4));
    e.set_time_ms(s.Int(5));
  }
  DDP_RETURN_IF_ERROR(s.Done());
  return out;
}

absl::Status StateStore::EnforceRetention(const std::vector<std::string>& delete_ids) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, OutputCount>> trimmed;
  // The lambda runs inside this call, under mu_: it uses the connection through a
  // local, which the thread-safety analysis (which does not follow lambdas) accepts.
  sqlite3* const db = db_;
  const std::map<std::string, OutputCount>* const output = &output_;
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
    for (const auto& [id, c] : *output) {
      if (std::find(delete_ids.begin(), delete_ids.end(), id) != delete_ids.end()) continue;
      OutputCount after = c;
      if (c.metric_rows > retention_.max_metric_rows) {
        DDP_RETURN_IF_ERROR(
            metrics.Bind(1, id).Bind(2, c.metric_rows - retention_.max_metric_rows).Run());
        after.metric_rows = retention_.max_metric_rows;
      }
      if (c.log_top - c.log_floor > retention_.max_log_lines) {
        after.log_floor = c.log_top - retention_.max_log_lines;
        DDP_RETURN_IF_ERROR(logs.Bind(1, id).Bind(2, after.log_floor).Run());
      }
      if (after.metric_rows != c.metric_rows || after.log_floor != c.log_floor) {
        trimmed.emplace_back(id, after);
      }
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;  // Nothing changed: the counts stand.
  for (const std::string& id : delete_ids) output_.erase(id);
  for (auto& [id, c] : trimmed) output_[id] = c;
  return absl::OkStatus();
}

}  // namespace ddp
