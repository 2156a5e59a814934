#include "coordinator/store/store_tables.h"

#include <algorithm>
#include <map>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace ddp::store {
namespace {

// The message a row's fields live in.
v1::Job& Msg(RowBatch::JobRow& r) { return r.job; }
const v1::Job& Msg(const RowBatch::JobRow& r) { return r.job; }
v1::Attempt& Msg(RowBatch::AttemptRow& r) { return r.attempt; }
const v1::Attempt& Msg(const RowBatch::AttemptRow& r) { return r.attempt; }
v1::RankAssignment& Msg(RowBatch::RankRow& r) { return r.rank; }
const v1::RankAssignment& Msg(const RowBatch::RankRow& r) { return r.rank; }
template <typename M, typename = std::enable_if_t<std::is_base_of_v<google::protobuf::Message, M>>>
M& Msg(M& m) {
  return m;
}

// A column holding the proto field `field` of the row's message, under the name
// `name`; its SQL value follows the field's C++ type (sql::Params::BindValue, sql::Row::Value).
#define DDP_COLUMN(name, field, ...)                                                    \
  Column<Row> {                                                                         \
    {name, __VA_ARGS__},                                                                \
        [](sql::Params& s, int i, const Row& r) { s.BindValue(i, Msg(r).field()); },      \
        [](const sql::Row& s, int c, Row& r) {                                         \
          Msg(r).set_##field(s.Value<std::decay_t<decltype(Msg(r).field())>>(c));       \
        },                                                                              \
        [](Row& to, const typename RowMessage<Row>::type& from) {                      \
          Msg(to).set_##field(from.field());                                            \
        }                                                                               \
  }
// The same, named like the field.
#define DDP_FIELD(field, ...) DDP_COLUMN(#field, field, __VA_ARGS__)
// A column holding a plain member of the row (a key that is not in the message).
#define DDP_MEMBER(member, ...)                                                          \
  Column<Row> {                                                                          \
    {#member, __VA_ARGS__}, [](sql::Params& s, int i, const Row& r) { s.BindValue(i, r.member); }, \
        [](const sql::Row& s, int c, Row& r) {                                          \
          r.member = s.Value<std::decay_t<decltype(r.member)>>(c);                       \
        },                                                                               \
        [](Row& to, const auto& from) {  /* generic: the branch below is discarded */   \
          if constexpr (std::is_same_v<std::decay_t<decltype(from)>, Row>) {             \
            to.member = from.member;                                                     \
          }                                                                              \
        }                                                                                \
  }

constexpr char kText[] = "TEXT NOT NULL";
constexpr char kInt[] = "INTEGER NOT NULL";
constexpr char kReal[] = "REAL";  // NULL for NaN.

// The worker's GPUs: one "index uuid memory_bytes model" line each.
std::string EncodeGpus(const v1::Worker& w) {
  std::string out;
  for (const v1::GpuDevice& g : w.gpu_devices()) {
    absl::StrAppend(&out, g.index(), " ", g.uuid(), " ", g.memory_bytes(), " ", g.model(), "\n");
  }
  return out;
}

void DecodeGpus(const std::string& text, v1::Worker* w) {
  w->clear_gpu_devices();
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

// The worker's labels: one "key=value" line each (neither holds '=' in a key or a
// newline: common/jobspec/labels.h).
std::string EncodeLabels(const v1::Worker& w) {
  std::map<std::string, std::string> sorted(w.labels().begin(), w.labels().end());
  std::string out;
  for (const auto& [key, value] : sorted) absl::StrAppend(&out, key, "=", value, "\n");
  return out;
}

void DecodeLabels(const std::string& text, v1::Worker* w) {
  w->clear_labels();
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    (*w->mutable_labels())[kv.first] = kv.second;
  }
}

// An attempt's live recoveries: one line each, tab-separated: generation, start_ms,
// end_ms, source_rank, global_step, ranks (comma-separated), cause, outcome (tabs and
// newlines in the texts become spaces).
std::string EncodeRecoveries(const v1::Attempt& a) {
  auto flat = [](std::string text) {
    for (char& c : text) {
      if (c == '\t' || c == '\n') c = ' ';
    }
    return text;
  };
  std::string out;
  for (const v1::Recovery& r : a.recoveries()) {
    absl::StrAppend(&out, r.generation(), "\t", r.start_ms(), "\t", r.end_ms(), "\t",
                    r.source_rank(), "\t", r.global_step(), "\t", absl::StrJoin(r.ranks(), ","),
                    "\t", flat(r.cause()), "\t", flat(r.outcome()), "\n");
  }
  return out;
}
void DecodeRecoveries(const std::string& text, v1::Attempt* a) {
  a->clear_recoveries();
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    if (f.size() < 8) continue;
    v1::Recovery* r = a->add_recoveries();
    int64_t v = 0;
    if (absl::SimpleAtoi(f[0], &v)) r->set_generation(static_cast<int32_t>(v));
    if (absl::SimpleAtoi(f[1], &v)) r->set_start_ms(v);
    if (absl::SimpleAtoi(f[2], &v)) r->set_end_ms(v);
    if (absl::SimpleAtoi(f[3], &v)) r->set_source_rank(static_cast<int32_t>(v));
    if (absl::SimpleAtoi(f[4], &v)) r->set_global_step(v);
    for (absl::string_view rank : absl::StrSplit(f[5], ',', absl::SkipEmpty())) {
      if (absl::SimpleAtoi(rank, &v)) r->add_ranks(static_cast<int32_t>(v));
    }
    r->set_cause(std::string(f[6]));
    r->set_outcome(std::string(f[7]));
  }
}

}  // namespace

std::string Declaration(const char* decl, Dialect dialect) {
  if (dialect == Dialect::kSqlite) return decl;
  return absl::StrReplaceAll(decl, {{"INTEGER", "BIGINT"}, {"REAL", "DOUBLE PRECISION"}});
}

std::string TableInfo::CreateSql(Dialect dialect) const {
  std::vector<std::string> defs;
  if (key.empty() && dialect == Dialect::kPostgres) defs.push_back("row_id BIGSERIAL PRIMARY KEY");
  if (parent != nullptr) defs.push_back(Declaration(parent, dialect));
  for (const ColumnInfo& c : columns) {
    defs.push_back(absl::StrCat(c.name, " ", Declaration(c.decl, dialect)));
  }
  if (!key.empty()) defs.push_back(absl::StrCat("PRIMARY KEY(", absl::StrJoin(key, ", "), ")"));
  std::string sql = absl::StrCat("CREATE TABLE IF NOT EXISTS ", name, "(",
                                 absl::StrJoin(defs, ", "), ");");
  for (const char* index : indexes) absl::StrAppend(&sql, "\n", index, ";");
  return sql;
}

std::string TableInfo::ColumnList() const {
  return absl::StrJoin(columns, ", ",
                       [](std::string* out, const ColumnInfo& c) { out->append(c.name); });
}

std::string TableInfo::InsertSql(Dialect dialect, bool replace) const {
  const size_t n = columns.size() + (parent != nullptr ? 1 : 0);
  std::vector<std::string> marks;
  for (size_t i = 1; i <= n; ++i) {
    marks.push_back(dialect == Dialect::kSqlite ? "?" : absl::StrCat("$", i));
  }
  std::string names = ColumnList();
  if (parent != nullptr) {
    names = absl::StrCat(absl::string_view(parent).substr(0, absl::string_view(parent).find(' ')),
                         ", ", names);
  }
  const bool sqlite_replace = replace && dialect == Dialect::kSqlite && !key.empty();
  std::string sql = absl::StrCat(sqlite_replace ? "INSERT OR REPLACE" : "INSERT", " INTO ", name,
                                 "(", names, ") VALUES(", absl::StrJoin(marks, ","), ")");
  if (replace && dialect == Dialect::kPostgres && !key.empty()) {
    std::vector<std::string> sets;
    for (const ColumnInfo& c : columns) {
      if (std::find_if(key.begin(), key.end(), [&](const char* k) {
            return absl::string_view(k) == c.name;
          }) != key.end()) {
        continue;
      }
      sets.push_back(absl::StrCat(c.name, " = EXCLUDED.", c.name));
    }
    absl::StrAppend(&sql, " ON CONFLICT (", absl::StrJoin(key, ", "), ") DO ",
                    sets.empty() ? "NOTHING" : absl::StrCat("UPDATE SET ", absl::StrJoin(sets, ", ")));
  }
  return sql;
}

std::string TableInfo::InsertRowsSql(int rows, bool replace) const {
  const int width = static_cast<int>(columns.size()) + (parent != nullptr ? 1 : 0);
  std::string sql = InsertSql(Dialect::kPostgres, /*replace=*/false);
  // What replacing adds: the ON CONFLICT clause.
  const std::string conflict = InsertSql(Dialect::kPostgres, replace).substr(sql.size());
  sql.erase(sql.find(" VALUES(") + 7);
  for (int r = 0; r < rows; ++r) {
    std::vector<std::string> marks;
    for (int c = 1; c <= width; ++c) marks.push_back(absl::StrCat("$", r * width + c));
    absl::StrAppend(&sql, r > 0 ? ",(" : "(", absl::StrJoin(marks, ","), ")");
  }
  return sql + conflict;
}

std::string TableInfo::SelectSql(const std::string& rest) const {
  return absl::StrCat("SELECT ", ColumnList(), " FROM ", name, " ", rest);
}

const Table<RowBatch::JobRow>& Jobs() {
  using Row = RowBatch::JobRow;
  static const auto* table = new Table<Row>(
      {"jobs", nullptr, {}, {"id"}},
      {
          DDP_FIELD(id, kText),
          DDP_MEMBER(seq, kInt),  // Submission order.
          DDP_FIELD(name, kText),
          DDP_FIELD(rdzv_id, kText),
          DDP_FIELD(state, kInt),
          DDP_FIELD(reason, kText),
          DDP_FIELD(spec_yaml, kText),
          DDP_FIELD(workdir, kText),
          DDP_FIELD(min_nodes, kInt),
          DDP_FIELD(max_nodes, kInt),
          DDP_FIELD(nproc_per_node, kInt),
          DDP_FIELD(max_restarts, kInt),
          DDP_FIELD(restarts, kInt),
          DDP_FIELD(epochs, kInt),
          DDP_FIELD(submit_ms, kInt),
          DDP_FIELD(start_ms, kInt),
          DDP_FIELD(end_ms, kInt),
          DDP_FIELD(owner, "TEXT NOT NULL DEFAULT ''"),
          DDP_FIELD(preemptions, "INTEGER NOT NULL DEFAULT 0"),
          DDP_FIELD(max_recoveries, "INTEGER NOT NULL DEFAULT 0"),
          DDP_FIELD(recoveries, "INTEGER NOT NULL DEFAULT 0"),
          DDP_FIELD(last_checkpoint_attempt, "INTEGER NOT NULL DEFAULT 0"),
          DDP_FIELD(last_checkpoint_step, "INTEGER NOT NULL DEFAULT 0"),
          DDP_FIELD(last_checkpoint_ms, "INTEGER NOT NULL DEFAULT 0"),
      });
  return *table;
}

const Table<RowBatch::AttemptRow>& Attempts() {
  using Row = RowBatch::AttemptRow;
  static const auto* table = new Table<Row>(
      {"attempts", nullptr, {}, {"job_id", "number"}},
      {
          DDP_MEMBER(job_id, kText),
          DDP_FIELD(number, kInt),
          DDP_FIELD(state, kInt),
          DDP_FIELD(reason, kText),
          DDP_FIELD(master_addr, kText),
          DDP_FIELD(master_port, kInt),
          DDP_FIELD(world_size, kInt),
          DDP_FIELD(start_ms, kInt),
          DDP_FIELD(end_ms, kInt),
          // Attempts preempted before this column: their reason said so.
          DDP_FIELD(preempted, "INTEGER NOT NULL DEFAULT 0",
                    "UPDATE attempts SET preempted = 1 WHERE state = 5 AND"
                    " reason LIKE 'preempted: %'"),
          DDP_FIELD(generation, "INTEGER NOT NULL DEFAULT 0"),
          Column<Row>{{"recoveries", "TEXT NOT NULL DEFAULT ''"},
                      [](sql::Params& s, int i, const Row& r) {
                        s.BindText(i, EncodeRecoveries(r.attempt));
                      },
                      [](const sql::Row& s, int c, Row& r) {
                        DecodeRecoveries(s.Text(c), &r.attempt);
                      },
                      [](Row& to, const v1::Attempt& from) {
                        *to.attempt.mutable_recoveries() = from.recoveries();
                      }},
      });
  return *table;
}

const Table<RowBatch::RankRow>& Ranks() {
  using Row = RowBatch::RankRow;
  static const auto* table = new Table<Row>(
      {"ranks", nullptr, {}, {"job_id", "attempt", "rank"}},
      {
          DDP_MEMBER(job_id, kText),
          DDP_MEMBER(attempt, kInt),
          DDP_FIELD(rank, kInt),
          DDP_FIELD(local_rank, kInt),
          DDP_FIELD(group_rank, kInt),
          DDP_FIELD(worker, kText),
          DDP_FIELD(address, kText),
          DDP_FIELD(pid, kInt),
          DDP_FIELD(exited, kInt),
          DDP_FIELD(exit_code, kInt),
          DDP_FIELD(signal, kInt),
          DDP_FIELD(error, kText),
          DDP_FIELD(gpu_uuid, "TEXT NOT NULL DEFAULT ''"),
          DDP_FIELD(generation, "INTEGER NOT NULL DEFAULT 0"),
      });
  return *table;
}

const Table<v1::Worker>& Workers() {
  using Row = v1::Worker;
  static const auto* table = new Table<Row>(
      {"workers", nullptr, {}, {"name"}},
      {
          DDP_FIELD(name, kText),
          DDP_FIELD(incarnation, kText),
          DDP_FIELD(address, kText),
          DDP_FIELD(hostname, kText),
          DDP_FIELD(slots, kInt),
          DDP_FIELD(gpus, kInt),
          DDP_FIELD(registered_ms, kInt),
          DDP_FIELD(last_heartbeat_ms, kInt),
          Column<Row>{{"gpu_devices", "TEXT NOT NULL DEFAULT ''"},
                      [](sql::Params& s, int i, const Row& w) { s.BindText(i, EncodeGpus(w)); },
                      [](const sql::Row& s, int c, Row& w) { DecodeGpus(s.Text(c), &w); },
                      [](Row& to, const Row& from) {
                        *to.mutable_gpu_devices() = from.gpu_devices();
                      }},
          // A value this build does not know (a newer coordinator's) reads as
          // cordoned: an operator took the node out, so it stays out.
          Column<Row>{{"maintenance", "INTEGER NOT NULL DEFAULT 0"},
                      [](sql::Params& s, int i, const Row& w) { s.BindValue(i, w.maintenance()); },
                      [](const sql::Row& s, int c, Row& w) {
                        const int m = static_cast<int>(s.Int(c));
                        w.set_maintenance(v1::WorkerMaintenance_IsValid(m)
                                              ? static_cast<v1::WorkerMaintenance>(m)
                                              : v1::WORKER_CORDONED);
                      },
                      [](Row& to, const Row& from) { to.set_maintenance(from.maintenance()); }},
          Column<Row>{{"drain_policy", "INTEGER NOT NULL DEFAULT 0"},
                      [](sql::Params& s, int i, const Row& w) { s.BindValue(i, w.drain_policy()); },
                      [](const sql::Row& s, int c, Row& w) {
                        const int p = static_cast<int>(s.Int(c));
                        w.set_drain_policy(v1::DrainPolicy_IsValid(p)
                                               ? static_cast<v1::DrainPolicy>(p)
                                               : v1::DRAIN_WAIT);
                      },
                      [](Row& to, const Row& from) { to.set_drain_policy(from.drain_policy()); }},
          DDP_FIELD(maintenance_since_ms, "INTEGER NOT NULL DEFAULT 0"),
          DDP_FIELD(maintenance_by, "TEXT NOT NULL DEFAULT ''"),
          DDP_FIELD(witness_port, "INTEGER NOT NULL DEFAULT 0"),
          Column<Row>{{"labels", "TEXT NOT NULL DEFAULT ''"},
                      [](sql::Params& s, int i, const Row& w) { s.BindText(i, EncodeLabels(w)); },
                      [](const sql::Row& s, int c, Row& w) { DecodeLabels(s.Text(c), &w); },
                      [](Row& to, const Row& from) { *to.mutable_labels() = from.labels(); }},
      });
  return *table;
}

// The last ReportEvents batch stored per worker incarnation (batch_seq
// de-duplication that survives a restart): written in the transaction that stores
// the batch's events.
const Table<BatchMark>& WorkerBatches() {
  using Row = BatchMark;
  static const auto* table = new Table<Row>({"worker_batches", nullptr, {}, {"worker"}},
                                            {
                                                DDP_MEMBER(worker, kText),
                                                DDP_MEMBER(incarnation, kText),
                                                DDP_MEMBER(batch_seq, kInt),
                                            });
  return *table;
}

const Table<v1::RankMetrics>& Metrics() {
  using Row = v1::RankMetrics;
  static const auto* table = new Table<Row>(
      {"metrics",
       "job_id TEXT NOT NULL",
       {},
       {},
       {"CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics(job_id, attempt, rank, global_step)",
        "CREATE INDEX IF NOT EXISTS metrics_by_job_row ON metrics(job_id)"}},
      {
          DDP_FIELD(attempt, kInt),
          DDP_FIELD(rank, kInt),
          DDP_FIELD(global_step, kInt),
          DDP_FIELD(epoch, kInt),
          DDP_FIELD(step, kInt),
          DDP_FIELD(steps, kInt),
          DDP_FIELD(loss, kReal),
          DDP_FIELD(samples_per_s, kReal),
          DDP_FIELD(step_ms, kReal),
          DDP_FIELD(comm_ms, kReal),
          DDP_COLUMN("time_ms", update_ms, kInt),  // When the coordinator received it.
      });
  return *table;
}

const Table<v1::EpochSummary>& Epochs() {
  using Row = v1::EpochSummary;
  static const auto* table = new Table<Row>({"epochs", "job_id TEXT NOT NULL", {},
                                             {"job_id", "attempt", "epoch"}},
                                            {
                                                DDP_FIELD(attempt, kInt),
                                                DDP_FIELD(epoch, kInt),
                                                DDP_FIELD(train_loss, kReal),
                                                DDP_FIELD(val_loss, kReal),
                                                DDP_FIELD(val_accuracy, kReal),
                                                DDP_FIELD(time_ms, kInt),
                                            });
  return *table;
}

const Table<v1::LogLine>& Logs() {
  using Row = v1::LogLine;
  static const auto* table = new Table<Row>(
      {"logs", "job_id TEXT NOT NULL", {}, {"job_id", "seq"}},
      {
          DDP_FIELD(seq, kInt),
          DDP_FIELD(attempt, kInt),
          DDP_FIELD(rank, kInt),
          DDP_FIELD(stream, kText),
          DDP_FIELD(text, kText),
          DDP_FIELD(time_ms, kInt),
      });
  return *table;
}

#undef DDP_MEMBER
#undef DDP_FIELD
#undef DDP_COLUMN

std::vector<const TableInfo*> AllTables() {
  return {&Jobs(), &Attempts(), &Ranks(), &WorkerBatches(), &Workers(),
          &Metrics(), &Epochs(), &Logs()};
}

}  // namespace ddp::store
