#include "tests/common/postgres_server.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"
#include "tests/common/test_util.h"

namespace ddp::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool ProcessAlive(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// What this test process's servers' scratch directories start with.
std::string ScratchPrefix() { return absl::StrCat("ddp-postgres-", ::getpid(), "-"); }

// The scratch directories of this process's servers that exist now.
std::vector<std::string> ScratchDirs() {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string root = base ? base : std::filesystem::temp_directory_path().string();
  std::vector<std::string> dirs;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return dirs;
  while (struct dirent* e = ::readdir(d)) {
    if (absl::StartsWith(e->d_name, ScratchPrefix())) dirs.push_back(e->d_name);
  }
  ::closedir(d);
  return dirs;
}

// Live processes whose command line names one of this process's scratch directories
// (a postmaster's "-D <dir>/data").
std::vector<pid_t> LiveServerProcesses() {
  std::vector<pid_t> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (struct dirent* e = ::readdir(proc)) {
    pid_t pid;
    if (!absl::SimpleAtoi(e->d_name, &pid) || !ProcessAlive(pid)) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (absl::StrContains(cmdline, ScratchPrefix())) pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

// Starts a server (scripts/install_deps.sh installs PostgreSQL: a test without one fails).
#define START_SERVER(var)                         \
  auto var##_or = PostgresServer::Start();         \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status(); \
  std::unique_ptr<PostgresServer> var = std::move(var##_or).value()

TEST(PostgresServerTest, KeepsRowsAcrossStopAndRestartAndCleansUp) {
  const absl::Time t0 = absl::Now();
  START_SERVER(pg);
  std::cerr << "Start() took " << absl::Now() - t0 << "\n";

  EXPECT_GT(pg->port(), 0);
  EXPECT_EQ(pg->uri(), absl::StrCat("postgresql://ddp@127.0.0.1:", pg->port(), "/ddp"));
  EXPECT_EQ(pg->uri("other"), absl::StrCat("postgresql://ddp@127.0.0.1:", pg->port(), "/other"));
  const std::string dir = pg->data_dir();
  ASSERT_TRUE(Exists(dir + "/PG_VERSION"));
  const pid_t pid = pg->postmaster_pid();
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(ProcessAlive(pid));
  if (::geteuid() == 0) {
    struct stat st;
    ASSERT_EQ(::stat(absl::StrCat("/proc/", pid).c_str(), &st), 0);
    EXPECT_NE(st.st_uid, 0u) << "the postmaster must not run as root";
  }

  // The database "ddp" exists, the superuser is "ddp", the server is 15 and UTF8.
  EXPECT_THAT(pg->Query("SELECT current_database(), current_user"), IsOkAndHolds("ddp|ddp\n"));
  EXPECT_THAT(pg->Query("SHOW server_version"), IsOkAndHolds(StartsWith("15.")));
  EXPECT_THAT(pg->Query("SHOW server_encoding"), IsOkAndHolds("UTF8\n"));
  EXPECT_THAT(pg->Query("SHOW listen_addresses"), IsOkAndHolds("127.0.0.1\n"));

  ASSERT_THAT(pg->Query("CREATE TABLE jobs (id int PRIMARY KEY, name text NOT NULL);"
                        "INSERT INTO jobs VALUES (1, 'mnist'), (2, 'it''s');"),
              IsOkAndHolds(""));
  EXPECT_THAT(pg->Query("SELECT id, name FROM jobs ORDER BY id"),
              IsOkAndHolds("1|mnist\n2|it's\n"));
  // A failing statement is an error that says why.
  EXPECT_THAT(pg->Query("SELECT * FROM no_such_table"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("no_such_table")));
  EXPECT_THAT(pg->Query("INSERT INTO jobs VALUES (1, 'again')"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("duplicate key")));

  // Another database, reached by name.
  ASSERT_THAT(pg->CreateDatabase("second"), IsOk());
  EXPECT_THAT(pg->Query("SELECT current_database()", "second"), IsOkAndHolds("second\n"));
  EXPECT_THAT(pg->Query("SELECT count(*) FROM pg_class WHERE relname = 'jobs'", "second"),
              IsOkAndHolds("0\n"));

  // Stopped: the data stays, queries fail saying they could not connect.
  ASSERT_THAT(pg->Stop(), IsOk());
  EXPECT_EQ(pg->postmaster_pid(), -1);
  EXPECT_FALSE(ProcessAlive(pid));
  EXPECT_TRUE(Exists(dir + "/PG_VERSION"));
  const absl::StatusOr<std::string> refused = pg->Query("SELECT 1");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("Connection refused")));
  std::cerr << "Query() on the stopped server: " << refused.status() << "\n";
  EXPECT_THAT(pg->Stop(), IsOk()) << "Stop is idempotent";

  // Restarted on the same port: the rows are still there.
  const int port = pg->port();
  ASSERT_THAT(pg->Restart(), IsOk());
  EXPECT_EQ(pg->port(), port);
  EXPECT_GT(pg->postmaster_pid(), 0);
  EXPECT_THAT(pg->Query("SELECT name FROM jobs WHERE id = 2"), IsOkAndHolds("it's\n"));
  EXPECT_THAT(pg->Restart(), StatusIs(absl::StatusCode::kFailedPrecondition));

  // Destruction stops the server and removes its directory.
  const pid_t pid2 = pg->postmaster_pid();
  const std::string root = pg->root_dir();
  pg.reset();
  EXPECT_FALSE(ProcessAlive(pid2));
  if (std::getenv("DDP_KEEP_TEST_DIRS") == nullptr) {
    EXPECT_FALSE(Exists(root)) << root;
  }
}

// A test may SIGSTOP the postmaster (a hung database); destruction still ends it.
TEST(PostgresServerTest, DestroysAStoppedServer) {
  START_SERVER(pg);
  const pid_t pid = pg->postmaster_pid();
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  const std::string root = pg->root_dir();
  pg.reset();
  EXPECT_FALSE(ProcessAlive(pid));
  if (std::getenv("DDP_KEEP_TEST_DIRS") == nullptr) {
    EXPECT_FALSE(Exists(root)) << root;
  }
}

// Two servers side by side: each its own port and directory.
TEST(PostgresServerTest, TwoServersAreIndependent) {
  START_SERVER(a);
  START_SERVER(b);
  EXPECT_NE(a->port(), b->port());
  EXPECT_NE(a->data_dir(), b->data_dir());
  ASSERT_THAT(a->Query("CREATE TABLE only_in_a (x int)"), IsOk());
  EXPECT_THAT(b->Query("SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'"),
              IsOkAndHolds("0\n"));
}

// A bin directory of the real programs with one of them replaced by `script`.
std::string FakeBinDir(const std::string& name, const std::string& replaced,
                       const std::string& script) {
  const std::string dir = MakeTempDir(absl::StrCat("fake-pg-bin-", name));
  ::chmod(dir.c_str(), 0755);  // nobody runs them when the test is root
  for (const char* program : {"initdb", "pg_ctl", "postgres", "psql", "createdb"}) {
    const std::string path = absl::StrCat(dir, "/", program);
    if (program == replaced) {
      WriteFile(path, script);
      ::chmod(path.c_str(), 0755);
    } else {
      std::filesystem::create_symlink(absl::StrCat("/usr/lib/postgresql/15/bin/", program), path);
    }
  }
  return dir;
}

class PostgresServerFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("DDP_POSTGRES_BIN_DIR") != nullptr ||
        !Exists("/usr/lib/postgresql/15/bin/initdb")) {
      GTEST_FAIL() << "needs Debian's postgresql-15 in /usr/lib/postgresql/15/bin "
                      "(scripts/install_deps.sh installs it)";
    }
  }
  void TearDown() override { ::unsetenv("DDP_POSTGRES_BIN_DIR"); }

  // Start() with `replaced` swapped for `script`: its error, after checking that it
  // left no server and no scratch directory behind.
  absl::Status FailedStart(const std::string& replaced, const std::string& script) {
    const std::vector<std::string> before = ScratchDirs();
    ::setenv("DDP_POSTGRES_BIN_DIR", FakeBinDir(replaced, replaced, script).c_str(), 1);
    auto pg = PostgresServer::Start();
    ::unsetenv("DDP_POSTGRES_BIN_DIR");
    EXPECT_FALSE(pg.ok());
    std::cerr << "Start() failed as it should: " << pg.status() << "\n";
    EXPECT_EQ(ScratchDirs(), before) << "the scratch directory is removed";
    EXPECT_THAT(LiveServerProcesses(), ::testing::IsEmpty()) << "no server is left running";
    return pg.status();
  }
};

TEST_F(PostgresServerFailureTest, InitdbFailing) {
  EXPECT_THAT(FailedStart("initdb", "#!/bin/sh\necho 'initdb: broken on purpose' >&2\nexit 3\n"),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr("initdb failed (exit 3)"), HasSubstr("broken on purpose"))));
}

TEST_F(PostgresServerFailureTest, PostmasterRefusingItsSettings) {
  // The real pg_ctl, with a setting the postmaster refuses: the log says which.
  EXPECT_THAT(
      FailedStart("pg_ctl",
                  "#!/bin/sh\n"
                  "if [ \"$1\" = start ]; then set -- \"$@\" -o '-c shared_buffers=bogus'; fi\n"
                  "exec /usr/lib/postgresql/15/bin/pg_ctl \"$@\"\n"),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("pg_ctl start failed"), HasSubstr("server log:"),
                     HasSubstr("shared_buffers"))));
}

TEST_F(PostgresServerFailureTest, CreatedbFailingAfterTheServerStarted) {
  // The server runs by then: it is stopped before the directory goes.
  EXPECT_THAT(FailedStart("createdb", "#!/bin/sh\necho 'createdb: no' >&2\nexit 1\n"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("createdb failed (exit 1)")));
}

TEST(PostgresServerMissingTest, NotFoundWithoutTheProgramsSoThatTestsCanSkip) {
  const std::string empty = MakeTempDir("no-pg-bin");
  ::setenv("DDP_POSTGRES_BIN_DIR", empty.c_str(), 1);
  auto pg = PostgresServer::Start();
  ::unsetenv("DDP_POSTGRES_BIN_DIR");
  EXPECT_THAT(pg, StatusIs(absl::StatusCode::kNotFound, HasSubstr("install_deps.sh")));
}

}  // namespace
}  // namespace ddp::testing
