// The few SQLite helpers the coordinator's store uses: a prepared statement with
// typed binds and columns, and a transaction that rolls back on error. Internal to
// the store (state_store.cc, store_tables.cc); nothing else includes sqlite3.h.
#ifndef DDP_COORDINATOR_STORE_SQLITE_H_
#define DDP_COORDINATOR_STORE_SQLITE_H_

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/store/sql_row.h"

namespace ddp::sql {

inline absl::Status Error(sqlite3* db, const std::string& what) {
  return absl::InternalError(absl::StrCat("sqlite: ", what, ": ", sqlite3_errmsg(db)));
}

// A prepared statement with typed binds (1-based) and columns (0-based); finalized
// on destruction.
class Stmt final : public Params, public Row {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  Stmt(sqlite3* db, const std::string& sql) : Stmt(db, sql.c_str()) {}
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status ok() const { return rc_ == SQLITE_OK ? absl::OkStatus() : Error(db_, "prepare"); }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  // NaN is stored as NULL (and read back as NaN by Real()).
  Stmt& Bind(int i, double v) {
    if (std::isnan(v)) {
      sqlite3_bind_null(stmt_, i);
    } else {
      sqlite3_bind_double(stmt_, i, v);
    }
    return *this;
  }
  // SQLITE_ROW: true; SQLITE_DONE: false; errors go to Done().
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
    return rc_ == SQLITE_DONE || rc_ == SQLITE_ROW ? absl::OkStatus() : Error(db_, "step");
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  void BindText(int i, const std::string& v) override { Bind(i, v); }
  void BindInt(int i, int64_t v) override { Bind(i, v); }
  void BindReal(int i, double v) override { Bind(i, v); }
  int64_t Int(int col) const override { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const override {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? std::nan("")
                                                          : sqlite3_column_double(stmt_, col);
  }
  std::string Text(int col) const override {
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

// A transaction: Begin(), statements, Commit(); one not committed is rolled back when
// it goes out of scope (an early return on error).
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  absl::Status Begin() {
    open_ = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
    return open_ ? absl::OkStatus() : Error(db_, "begin");
  }
  absl::Status Commit() {
    if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK) {
      open_ = false;
      return absl::OkStatus();
    }
    return Error(db_, "commit");
  }

 private:
  sqlite3* const db_;
  bool open_ = false;
};

// Runs `body` inside BEGIN IMMEDIATE/COMMIT, rolling back on error.
template <typename Fn>
absl::Status InTransaction(sqlite3* db, Fn&& body) {
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return Error(db, "begin");
  }
  absl::Status st = body();
  if (!st.ok()) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return st;
  }
  if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    absl::Status err = Error(db, "commit");
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return err;
  }
  return absl::OkStatus();
}

}  // namespace ddp::sql

#endif  // DDP_COORDINATOR_STORE_SQLITE_H_
