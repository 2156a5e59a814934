// Where every column of the coordinator's database is stored: each table is
// described once, in store_tables.cc, column and field together (its SQL name and
// type, and how a row's field is bound and read back). The schema (CREATE TABLE),
// the columns added to an older database when it is opened (ALTER TABLE ... ADD
// COLUMN, then the column's backfill), every INSERT and every SELECT list are
// derived from these descriptions, in SQLite's dialect (state_store.cc) and in
// PostgreSQL's (postgres_store.cc); no statement lists columns by hand. Adding a
// field to storage is one line in a table's description (with a DEFAULT in its
// declaration, for the rows written before it).
//
// The declarations are SQLite's; PostgreSQL's are derived: INTEGER becomes BIGINT
// (SQLite's integers are 64-bit), REAL DOUBLE PRECISION, and a table without a key
// gains `row_id BIGSERIAL PRIMARY KEY` (SQLite's rowid: the order rows were appended).
//
// Internal to the store: only the stores and their tests include this.
#ifndef DDP_COORDINATOR_STORE_STORE_TABLES_H_
#define DDP_COORDINATOR_STORE_STORE_TABLES_H_

#include <string>
#include <vector>

#include "coordinator/store/sql_row.h"
#include "coordinator/store/store.h"
#include "ddp/v1/types.pb.h"

namespace ddp::store {

enum class Dialect { kSqlite, kPostgres };

// A declaration in `dialect` (see above).
std::string Declaration(const char* decl, Dialect dialect);

// What a column is, whatever its row type.
struct ColumnInfo {
  const char* name;
  const char* decl;  // SQL type and constraints: "INTEGER NOT NULL DEFAULT 0".
  // Run once when the column is added to an older database (nullptr: nothing to
  // do), to derive its value for the rows stored before it.
  const char* backfill = nullptr;
};

struct TableInfo {
  const char* name;
  // A leading key column that is not part of the row (the job the row belongs to,
  // bound by the caller), or nullptr.
  const char* parent = nullptr;
  std::vector<ColumnInfo> columns;
  std::vector<const char*> key = {};       // The primary key's columns; none: appended rows.
  std::vector<const char*> indexes = {};   // Full CREATE INDEX IF NOT EXISTS statements.

  std::string CreateSql(Dialect dialect = Dialect::kSqlite) const;
  // "a, b, c": the row's columns, in order (the parent column not included).
  std::string ColumnList() const;
  // "INSERT INTO name(parent?, a, b, c) VALUES(?, ...)" (PostgreSQL: $1, ...). With
  // `replace`, a row of the same key is replaced: SQLite's INSERT OR REPLACE,
  // PostgreSQL's ON CONFLICT (key) DO UPDATE of every other column.
  std::string InsertSql(Dialect dialect = Dialect::kSqlite, bool replace = true) const;
  // PostgreSQL: one INSERT of `rows` rows (parameters row by row: parent, columns);
  // with `replace`, the rows' keys must differ from each other.
  std::string InsertRowsSql(int rows, bool replace = false) const;
  // "SELECT a, b, c FROM name <rest>".
  std::string SelectSql(const std::string& rest) const;
};

// The message a row's columns are the fields of: the job's, the attempt's and the
// rank's rows add keys of their own (seq, job_id, attempt) to theirs; any other row
// is its own.
template <typename Row>
struct RowMessage {
  using type = Row;
};
template <>
struct RowMessage<RowBatch::JobRow> {
  using type = v1::Job;
};
template <>
struct RowMessage<RowBatch::AttemptRow> {
  using type = v1::Attempt;
};
template <>
struct RowMessage<RowBatch::RankRow> {
  using type = v1::RankAssignment;
};

template <typename Row>
struct Column : ColumnInfo {
  void (*bind)(sql::Params& s, int index, const Row& row);
  void (*load)(const sql::Row& s, int col, Row& row);
  // Sets the column's value in `to` from the message `from` (what binding it and
  // loading the result into `to` would give); a key of the row's own that is not in
  // the message (seq, job_id) is left to the caller.
  void (*copy)(Row& to, const typename RowMessage<Row>::type& from);
};

template <typename Row>
class Table : public TableInfo {
 public:
  Table(TableInfo info, std::vector<Column<Row>> columns)
      : TableInfo(std::move(info)), binders_(std::move(columns)) {
    TableInfo::columns.clear();
    for (const Column<Row>& c : binders_) TableInfo::columns.push_back(c);
  }

  // Binds the row's columns to the parameters of InsertSql() (after the parent's,
  // which the caller binds as parameter 1), or of its row number `row_index` when it
  // inserts several.
  void Bind(sql::Params& s, const Row& row, int row_index = 0) const {
    const int width = static_cast<int>(binders_.size()) + (parent != nullptr ? 1 : 0);
    const int first = row_index * width + (parent != nullptr ? 2 : 1);
    for (size_t i = 0; i < binders_.size(); ++i) {
      binders_[i].bind(s, first + static_cast<int>(i), row);
    }
  }
  // Reads the row's columns from the current row of a SelectSql() statement.
  void Load(const sql::Row& s, Row& row) const {
    for (size_t i = 0; i < binders_.size(); ++i) binders_[i].load(s, static_cast<int>(i), row);
  }
  // Sets `to`'s columns from `from`, and nothing else (a job's row gets no attempts,
  // an attempt's no ranks): what a writer stages is then what the table stores, from
  // the one list of columns. The row's own keys (seq, job_id) are the caller's.
  void Copy(const typename RowMessage<Row>::type& from, Row& to) const {
    for (const Column<Row>& c : binders_) c.copy(to, from);
  }

 private:
  std::vector<Column<Row>> binders_;
};

const Table<RowBatch::JobRow>& Jobs();
const Table<RowBatch::AttemptRow>& Attempts();
const Table<RowBatch::RankRow>& Ranks();
const Table<v1::Worker>& Workers();
const Table<BatchMark>& WorkerBatches();
const Table<v1::RankMetrics>& Metrics();   // Parent: job_id.
const Table<v1::EpochSummary>& Epochs();   // Parent: job_id.
const Table<v1::LogLine>& Logs();          // Parent: job_id.

// Every table, in the order the schema creates them (the meta table aside).
std::vector<const TableInfo*> AllTables();

}  // namespace ddp::store

#endif  // DDP_COORDINATOR_STORE_STORE_TABLES_H_
