// The few libpq helpers the coordinator's PostgreSQL store uses: a connection, a
// statement's parameters and its result rows (sql::Params, sql::Row: what the table
// descriptions bind to), and a transaction that rolls back on error. Text format
// throughout. Internal to the store (postgres_store.cc); nothing else includes
// libpq-fe.h.
#ifndef DDP_COORDINATOR_STORE_POSTGRES_H_
#define DDP_COORDINATOR_STORE_POSTGRES_H_

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/store/sql_row.h"

namespace ddp::pg {

// A statement's parameters, $1 ... (unbound ones are NULL).
class Params final : public sql::Params {
 public:
  void BindText(int i, const std::string& v) override;
  void BindInt(int i, int64_t v) override;
  void BindReal(int i, double v) override;  // NaN: NULL; infinities as PostgreSQL spells them.
  Params& Text(int i, const std::string& v) {
    BindText(i, v);
    return *this;
  }
  Params& Int(int i, int64_t v) {
    BindInt(i, v);
    return *this;
  }
  void Clear() { values_.clear(); }

  int size() const { return static_cast<int>(values_.size()); }
  // Pointers into this object's values, for PQexecParams (valid while it lives).
  std::vector<const char*> Pointers() const;

 private:
  struct Value {
    bool null = true;
    std::string text;
  };
  Value& At(int i);
  std::vector<Value> values_;
};

// A statement's result: rows with typed columns (the current one: Next()).
class Result final : public sql::Row {
 public:
  explicit Result(PGresult* res) : res_(res, &PQclear) {}
  int rows() const { return PQntuples(res_.get()); }
  // Moves to the next row; false past the last.
  bool Next() { return ++row_ < rows(); }
  int64_t Int(int col) const override;
  double Real(int col) const override;
  std::string Text(int col) const override;
  bool Null(int col) const { return PQgetisnull(res_.get(), row_, col) != 0; }
  // Rows changed by an INSERT, UPDATE or DELETE.
  int64_t Affected() const;

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> res_;
  int row_ = -1;
};

// One connection. Errors: UNAVAILABLE when the server cannot be reached or the
// connection broke (the next call reconnects), FAILED_PRECONDITION for a
// serialization failure or a lock not granted in time, INTERNAL for anything else
// (a bug of ours), each naming the server's message.
class Conn {
 public:
  // `uri` is a libpq connection URI or keyword string. `session_sql` runs on every
  // (re)connection (SET ...).
  Conn(std::string uri, std::string session_sql);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects if not connected (or the connection broke).
  absl::Status Connect();
  absl::StatusOr<Result> Exec(const std::string& sql, const Params& params = Params());
  // Statements without parameters, several separated by ';'.
  absl::Status ExecScript(const std::string& sql);
  // The server's address as the URI gave it, for messages ("host:port/db").
  std::string Describe() const;
  bool connected() const { return conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK; }

 private:
  absl::Status ErrorOf(PGresult* res, const std::string& sql);
  const std::string uri_;
  const std::string session_sql_;
  PGconn* conn_ = nullptr;
};

// A transaction: Begin(), statements, Commit(); one not committed is rolled back
// when it goes out of scope (an early return on error).
class Transaction {
 public:
  explicit Transaction(Conn& conn) : conn_(conn) {}
  ~Transaction() {
    // A connection that broke took its transaction with it: nothing to roll back.
    if (open_ && conn_.connected()) (void)conn_.ExecScript("ROLLBACK");
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  absl::Status Begin(const char* sql = "BEGIN") {
    absl::Status st = conn_.ExecScript(sql);
    open_ = st.ok();
    return st;
  }
  absl::Status Commit() {
    absl::Status st = conn_.ExecScript("COMMIT");
    open_ = !st.ok();
    return st;
  }

 private:
  Conn& conn_;
  bool open_ = false;
};

}  // namespace ddp::pg

#endif  // DDP_COORDINATOR_STORE_POSTGRES_H_
