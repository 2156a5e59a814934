// A real PostgreSQL 15 server for tests: initdb into a scratch directory, started with
// pg_ctl on a free loopback port, stopped and its directory removed on destruction.
//
//   DDP_ASSERT_OK_AND_ASSIGN(auto pg, PostgresServer::Start());
//   ... connect to pg->uri() ...
//   DDP_ASSERT_OK_AND_ASSIGN(std::string n, pg->Query("SELECT count(*) FROM jobs"));
//
// The server listens on 127.0.0.1 only (TCP) and on a unix socket in the scratch
// directory; the superuser "ddp" needs no password (trust). Its settings favour speed
// over durability (fsync=off). Run as root (as CI is), every PostgreSQL program runs as
// "nobody" (setpriv), since initdb and postgres refuse root; the scratch directory is
// then nobody's, and must lie where nobody can reach it ($TEST_TMPDIR or /tmp).
//
// The programs come from /usr/lib/postgresql/15/bin (Debian's postgresql-15), or
// $DDP_POSTGRES_BIN_DIR. Start() answers NOT_FOUND, and nothing else does, when they
// are not installed, so that a test can skip itself there.
//
// One thread at a time: the object holds no lock.
#ifndef DDP_TESTS_COMMON_POSTGRES_SERVER_H_
#define DDP_TESTS_COMMON_POSTGRES_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp::testing {

class PostgresServer {
 public:
  // initdb (auth trust, superuser "ddp", UTF8) into a fresh scratch directory, then
  // `pg_ctl start -w` on a free loopback port, then creates the database "ddp". Errors
  // name the step that failed with its output and the server log's tail; the directory
  // is removed (and any server started stopped) whatever step failed.
  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start();

  // Stops the server (immediate shutdown, after SIGCONT in case a test stopped it) if
  // it runs, and removes the scratch directory (kept with DDP_KEEP_TEST_DIRS=1).
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  int port() const { return port_; }
  // The cluster's data directory (inside the scratch directory).
  std::string data_dir() const;
  // The scratch directory: data, the unix socket and the server log.
  const std::string& root_dir() const { return root_; }
  // "postgresql://ddp@127.0.0.1:PORT/<db>"
  std::string uri(const std::string& db = "ddp") const;

  // `pg_ctl stop -m fast`: the data stays, for Restart(). OK when not running.
  absl::Status Stop();
  // Starts the server again on the same directory and port, waiting until it accepts
  // connections. FAILED_PRECONDITION while it runs.
  absl::Status Restart();
  // createdb `name` (owned by "ddp").
  absl::Status CreateDatabase(const std::string& name);
  // Runs `sql` (one or more statements) through psql -X -A -t -q with ON_ERROR_STOP
  // against `db`; returns what it printed: one row a line, columns separated by '|'.
  // UNAVAILABLE when it cannot connect, INTERNAL when a statement fails.
  absl::StatusOr<std::string> Query(const std::string& sql, const std::string& db = "ddp") const;
  // The postmaster's pid, from postmaster.pid; -1 when the server is not running.
  // Tests may SIGSTOP/SIGCONT it (it runs as another user only when the test is root).
  pid_t postmaster_pid() const;
  // The last `lines` lines of the server log.
  std::string LogTail(int lines = 30) const;

 private:
  struct RunResult;
  explicit PostgresServer(std::string root);

  absl::Status InitDb();
  // pg_ctl start -w on port_; the log's tail on failure.
  absl::Status StartPostmaster();
  // argv[0] names a program in the PostgreSQL bin directory.
  RunResult Run(const std::vector<std::string>& argv, absl::Duration timeout) const;
  // Immediate shutdown, then SIGKILL for anything left; no status (destructor, failed
  // Start).
  void Kill();

  std::string root_;
  int port_ = 0;
};

}  // namespace ddp::testing

#endif  // DDP_TESTS_COMMON_POSTGRES_SERVER_H_
