#include "tests/common/postgres_server.h"

#include <dirent.h>
#include <ftw.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "tests/common/ports.h"
#include "tests/common/run_captured.h"
#include "tests/common/test_util.h"

namespace ddp::testing {
namespace {

constexpr char kDefaultBinDir[] = "/usr/lib/postgresql/15/bin";
constexpr char kSuperuser[] = "ddp";

std::string BinDir() {
  const char* dir = std::getenv("DDP_POSTGRES_BIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : kDefaultBinDir;
}

bool IsExecutable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

// The unprivileged account the programs run as when this process is root.
struct Unprivileged {
  uid_t uid;
  gid_t gid;
};

std::optional<Unprivileged> FindNobody() {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[4096];
  if (::getpwnam_r("nobody", &pw, buf, sizeof(buf), &found) != 0 || found == nullptr) {
    return std::nullopt;
  }
  return Unprivileged{found->pw_uid, found->pw_gid};
}

std::string SetprivPath() {
  for (const char* p : {"/usr/bin/setpriv", "/bin/setpriv"}) {
    if (IsExecutable(p)) return p;
  }
  return "";
}

// The last `lines` lines of `path` ("" when it cannot be read).
std::string TailOf(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

// What /proc says of `pid`: its name and parent. nullopt when it is gone (or a zombie).
struct ProcInfo {
  std::string comm;
  pid_t ppid = 0;
};
std::optional<ProcInfo> ReadProcInfo(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  const size_t open = stat.find('(');
  const size_t close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 2 >= stat.size()) {
    return std::nullopt;
  }
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
  ProcInfo info;
  info.comm = stat.substr(open + 1, close - open - 1);
  if (f.size() < 2 || f[0] == "Z" || f[0] == "X" || !absl::SimpleAtoi(f[1], &info.ppid)) {
    return std::nullopt;
  }
  return info;
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (struct dirent* e = ::readdir(proc)) {
    pid_t pid;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::optional<ProcInfo> info = ReadProcInfo(pid);
    if (info.has_value() && info->ppid == parent) children.push_back(pid);
  }
  ::closedir(proc);
  return children;
}


// A value for postgresql.conf: single-quoted, quotes doubled.
std::string ConfString(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

}  // namespace

struct PostgresServer::RunResult {
  std::string what;          // "initdb", "pg_ctl start": for error messages.
  absl::Status spawn_error;  // The program could not be started at all.
  bool timed_out = false;
  ExitStatus exit;
  std::string out;
  std::string err;

  bool ok() const { return spawn_error.ok() && !timed_out && exit.ok(); }
  // "initdb failed (exit 1): <stderr and stdout>"
  std::string Describe() const {
    if (!spawn_error.ok()) return absl::StrCat(what, " could not run: ", spawn_error.message());
    std::string output =
        absl::StrCat(absl::StripAsciiWhitespace(err), err.empty() || out.empty() ? "" : "\n",
                     absl::StripAsciiWhitespace(out));
    return absl::StrCat(what,
                        timed_out ? " timed out" : absl::StrCat(" failed (", exit.ToString(), ")"),
                        output.empty() ? "" : ": ", output);
  }
};

PostgresServer::PostgresServer(std::string root) : root_(std::move(root)) {}

std::string PostgresServer::data_dir() const { return root_ + "/data"; }

std::string PostgresServer::uri(const std::string& db) const {
  return absl::StrCat("postgresql://", kSuperuser, "@127.0.0.1:", port_, "/", db);
}

std::string PostgresServer::LogTail(int lines) const {
  return TailOf(root_ + "/postgres.log", lines);
}

PostgresServer::RunResult PostgresServer::Run(const std::vector<std::string>& argv,
                                              absl::Duration timeout) const {
  RunResult r;
  r.what = argv[0];
  if (argv.size() > 1 && argv[0] == "pg_ctl") r.what = absl::StrCat("pg_ctl ", argv[1]);
  SpawnOptions o;
  o.argv = argv;
  o.argv[0] = absl::StrCat(BinDir(), "/", argv[0]);
  if (::geteuid() == 0) {
    // initdb and postgres refuse to run as root: the whole family runs as nobody.
    std::optional<Unprivileged> nobody = FindNobody();
    const std::string setpriv = SetprivPath();
    if (!nobody.has_value() || setpriv.empty()) {
      r.spawn_error = absl::FailedPreconditionError(
          "running as root, PostgreSQL's programs need the user \"nobody\" and setpriv "
          "(util-linux) to run unprivileged");
      return r;
    }
    std::vector<std::string> wrapped = {setpriv, absl::StrCat("--reuid=", nobody->uid),
                                        absl::StrCat("--regid=", nobody->gid), "--clear-groups",
                                        "--"};
    wrapped.insert(wrapped.end(), o.argv.begin(), o.argv.end());
    o.argv = std::move(wrapped);
  }
  // A clean environment: no PGHOST, PGDATA, PGPORT... of the caller's, English messages.
  o.inherit_env = false;
  o.env = {{"PATH", "/usr/bin:/bin"},
           {"HOME", root_},
           {"LC_ALL", "C"},
           {"LANG", "C"},
           // A stopped (SIGSTOP) server accepts TCP connections but never answers.
           {"PGCONNECT_TIMEOUT", "10"}};
  o.cwd = root_;
  // The postmaster pg_ctl starts leads a session of its own; the programs here start
  // nothing else that should die with them.
  o.new_process_group = false;
  auto run = RunCaptured(o, timeout);
  if (!run.ok()) {
    r.spawn_error = run.status();
    return r;
  }
  r.exit = run->exit;
  r.out = std::move(run->out);
  r.err = std::move(run->err);
  r.timed_out = run->timed_out;
  return r;
}

absl::StatusOr<std::unique_ptr<PostgresServer>> PostgresServer::Start() {
  for (const char* program : {"initdb", "pg_ctl", "postgres", "psql", "createdb"}) {
    const std::string path = absl::StrCat(BinDir(), "/", program);
    if (!IsExecutable(path)) {
      return absl::NotFoundError(absl::StrCat(
          "PostgreSQL 15 is not installed: no ", path,
          " (scripts/install_deps.sh installs postgresql; DDP_POSTGRES_BIN_DIR names another "
          "bin directory)"));
    }
  }
  // From here on the object owns the directory: any early return stops what was
  // started and removes it.
  std::unique_ptr<PostgresServer> server(new PostgresServer(MakeTempDir("postgres")));
  if (::geteuid() == 0) {
    std::optional<Unprivileged> nobody = FindNobody();
    if (!nobody.has_value()) {
      return absl::FailedPreconditionError(
          "running as root, PostgreSQL needs an unprivileged user: there is no \"nobody\"");
    }
    if (::chown(server->root_.c_str(), nobody->uid, nobody->gid) != 0) {
      return absl::InternalError(
          absl::StrCat("chown ", server->root_, " to nobody: ", std::strerror(errno)));
    }
  }
  if (absl::Status st = server->InitDb(); !st.ok()) return st;

  // The free port is only free when asked: another process may bind it before the
  // postmaster does. That shows in the log, and a fresh port is tried.
  absl::Status started;
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<int> port = ::ddp::testing::ClaimPort();
    if (!port.ok()) return port.status();
    server->port_ = *port;
    started = server->StartPostmaster();
    if (started.ok() || !absl::StrContains(started.message(), "already in use")) break;
  }
  if (!started.ok()) return started;
  if (absl::Status st = server->CreateDatabase(kSuperuser); !st.ok()) return st;
  return server;
}

absl::Status PostgresServer::InitDb() {
  RunResult r = Run({"initdb", "-D", data_dir(), "-U", kSuperuser, "--auth=trust", "-E", "UTF8",
                     "--locale=C", "--no-sync"},
                    absl::Seconds(120));
  if (!r.ok()) return absl::InternalError(absl::StrCat("PostgresServer: ", r.Describe()));
  // The tests' settings, in the file rather than as `pg_ctl -o` flags: pg_ctl hands
  // those to a shell, and the socket directory is a path.
  std::ofstream conf(data_dir() + "/postgresql.conf", std::ios::app);
  conf << "\n# tests/common/postgres_server.cc: small and fast, loopback only\n"
       << "listen_addresses = '127.0.0.1'\n"
       << "unix_socket_directories = " << ConfString(root_) << "\n"
       << "fsync = off\n"
       << "synchronous_commit = off\n"
       << "full_page_writes = off\n"
       << "shared_buffers = 16MB\n"
       << "max_connections = 50\n"
       // Dynamic shared memory as files under the data directory, which goes with the
       // temp dir: POSIX segments (/dev/shm/PostgreSQL.*) outlive a server killed or
       // stopped in immediate mode.
       << "dynamic_shared_memory_type = mmap\n";
  conf.close();
  if (!conf) {
    return absl::InternalError(
        absl::StrCat("PostgresServer: cannot write ", data_dir(), "/postgresql.conf"));
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::StartPostmaster() {
  // -w: pg_ctl returns once the postmaster says it accepts connections.
  RunResult r = Run({"pg_ctl", "start", "-D", data_dir(), "-l", root_ + "/postgres.log", "-w", "-t",
                     "60", "-o", absl::StrCat("-p ", port_)},
                    absl::Seconds(90));
  if (!r.ok()) {
    return absl::UnavailableError(absl::StrCat("PostgresServer: ", r.Describe(), " (port ", port_,
                                               ", ", data_dir(), "); server log:\n", LogTail()));
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::Stop() {
  const pid_t pid = postmaster_pid();
  if (pid <= 0) return absl::OkStatus();
  ::kill(pid, SIGCONT);  // A test may have stopped it; a stopped postmaster never exits.
  RunResult r =
      Run({"pg_ctl", "stop", "-D", data_dir(), "-m", "fast", "-w", "-t", "60"}, absl::Seconds(90));
  if (!r.ok()) {
    if (postmaster_pid() <= 0) return absl::OkStatus();  // Gone by itself meanwhile.
    return absl::InternalError(
        absl::StrCat("PostgresServer: ", r.Describe(), "; server log:\n", LogTail()));
  }
  // pg_ctl returns once the pid file is gone, which the postmaster removes on its way
  // out, before it has exited: wait for the process itself (a zombie counts as gone),
  // so a caller that checks or restarts at once finds it gone.
  for (const absl::Time until = absl::Now() + absl::Seconds(30); absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(10))) {
    std::optional<ProcStat> st = ReadProcStat(pid);
    if (!st.has_value() || st->state == 'Z' || st->state == 'X') return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("PostgresServer: postmaster ", pid,
                                          " still runs 30 s after pg_ctl stop; server log:\n",
                                          LogTail()));
}

absl::Status PostgresServer::Restart() {
  if (const pid_t pid = postmaster_pid(); pid > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("PostgresServer::Restart: the server still runs (pid ", pid, ")"));
  }
  return StartPostmaster();
}

absl::Status PostgresServer::CreateDatabase(const std::string& name) {
  RunResult r = Run({"createdb", "-h", "127.0.0.1", "-p", absl::StrCat(port_), "-U", kSuperuser,
                     "-w", "--", name},
                    absl::Seconds(60));
  if (!r.ok()) {
    return absl::InternalError(
        absl::StrCat("PostgresServer: ", r.Describe(), "; server log:\n", LogTail(10)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PostgresServer::Query(const std::string& sql,
                                                  const std::string& db) const {
  RunResult r = Run({"psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-w", "-h",
                     "127.0.0.1", "-p", absl::StrCat(port_), "-U", kSuperuser, "-d", db, "-c", sql},
                    absl::Seconds(60));
  if (r.ok()) return r.out;
  std::string message = absl::StrCat("PostgresServer::Query on ", db, ": ", r.Describe(),
                                     "; server log:\n", LogTail(10));
  // psql's exit 2: the connection failed (server down, or stopped past the timeout).
  if (r.spawn_error.ok() && !r.timed_out && r.exit.signal == 0 && r.exit.exit_code == 2) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

pid_t PostgresServer::postmaster_pid() const {
  std::ifstream in(data_dir() + "/postmaster.pid");
  std::string line;
  pid_t pid;
  if (!std::getline(in, line) || !absl::SimpleAtoi(line, &pid) || pid <= 0) return -1;
  // A file a killed server left behind, or a pid since reused, is no server.
  std::optional<ProcInfo> info = ReadProcInfo(pid);
  if (!info.has_value() || !absl::StartsWith(info->comm, "postgres")) return -1;
  return pid;
}

void PostgresServer::Kill() {
  const pid_t pid = postmaster_pid();
  if (pid <= 0) return;
  ::kill(pid, SIGCONT);
  Run({"pg_ctl", "stop", "-D", data_dir(), "-m", "immediate", "-w", "-t", "10"}, absl::Seconds(20));
  if (postmaster_pid() <= 0) return;
  // pg_ctl could not: the postmaster and its children (each leads a process group of
  // its own, so a group kill would miss them) by hand.
  for (pid_t child : ChildrenOf(pid)) ::kill(child, SIGKILL);
  ::kill(pid, SIGKILL);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadProcInfo(pid).has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

PostgresServer::~PostgresServer() {
  Kill();
  if (std::getenv("DDP_KEEP_TEST_DIRS") == nullptr) RemoveTree(root_);
}

}  // namespace ddp::testing
