#include "tests/integration/local_cluster.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/auth/tokens.h"
#include "common/rpc/credentials.h"
#include "common/rpc/status.h"
#include "tests/common/ports.h"
#include "tests/common/run_captured.h"
#include "tests/common/test_util.h"

namespace ddp::testing {
namespace {

// Fast failure detection for tests; ordered as the coordinator requires (the
// heartbeat timeout comes from the options).
const std::vector<std::string> kTimingFlags = {"--rpc-deadline=100ms",
                                               "--heartbeat-interval=200ms"};

}  // namespace

std::string SourceDir() { return DDP_SOURCE_DIR; }
std::string BinDir() { return DDP_BIN_DIR; }

CtlResult RunCapture(const std::vector<std::string>& argv, absl::Duration timeout) {
  CtlResult r;
  SpawnOptions o;
  o.argv = argv;
  auto run = RunCaptured(o, timeout);
  if (!run.ok()) {
    r.err = std::string(run.status().message());
    return r;
  }
  r.exit_code = run->exit.ShellCode();
  r.out = std::move(run->out);
  r.err = std::move(run->err);
  return r;
}

OutputCollector::OutputCollector(int fd) : fd_(fd) {
  thread_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
      }
      // A short poll so that the destructor can stop a reader whose writer lives on.
      pollfd p = {fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[8192];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      absl::MutexLock lock(&mu_);
      if (n > 0) {
        text_.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        eof_ = true;
        return;
      }
    }
  });
}

OutputCollector::~OutputCollector() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool OutputCollector::WaitFor(const std::string& needle, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return eof_ || text_.find(needle) != std::string::npos;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return text_.find(needle) != std::string::npos;
}

std::string OutputCollector::Finish(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto eof = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return eof_; };
  mu_.AwaitWithTimeout(absl::Condition(&eof), timeout);
  return text_;
}

std::string OutputCollector::text() {
  absl::MutexLock lock(&mu_);
  return text_;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const Options& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = options;
  c->dir_ = MakeTempDir("cluster");
  if (options.secure) {
    std::vector<std::string> argv = {"/bin/bash", SourceDir() + "/scripts/make_certs.sh",
                                     c->certs()};
    for (int i = 0; i < options.workers; ++i) {
      argv.insert(argv.end(), {"--worker", absl::StrCat("w", i + 1)});
    }
    CtlResult made = RunCapture(argv, absl::Minutes(1));
    if (made.exit_code != 0) {
      return absl::InternalError(absl::StrCat("make_certs.sh failed: ", made.err));
    }
  }
  // Ports of this test's own (tests/common/ports.h), below the ephemeral range:
  // connecting to a closed ephemeral port on loopback can "succeed" by TCP self-connect
  // while the coordinator restarts, and nothing else takes them while it is down.
  const int wanted = options.store_uri.empty() ? 1 : options.coordinators;
  for (int i = 0; i < wanted; ++i) {
    auto port = ClaimPort();
    if (!port.ok()) return port.status();
    c->ports_.push_back(*port);
  }
  c->port_ = c->ports_.front();
  if (!options.store_uri.empty()) {
    c->coordinators_.resize(static_cast<size_t>(wanted));
    c->coordinator_logs_.resize(static_cast<size_t>(wanted));
  }
  if (absl::Status st = c->StartCoordinator(); !st.ok()) return st;
  for (int i = 0; i < options.workers; ++i) {
    if (absl::Status st = c->StartWorker(absl::StrCat("w", i + 1), options.slots); !st.ok()) {
      return st;
    }
  }
  if (absl::Status st = c->WaitForWorkers(options.workers); !st.ok()) return st;
  return c;
}

LocalCluster::~LocalCluster() {
  for (auto& w : workers_) {
    if (w) w->Terminate(absl::Seconds(10));  // Agents stop their trainers first.
  }
  if (coordinator_) coordinator_->Terminate(absl::Seconds(5));
  for (auto& c : coordinators_) {
    if (c == nullptr) continue;
    c->Signal(SIGCONT);  // A test may have paused it.
    c->Terminate(absl::Seconds(5));
  }
  coordinator_logs_.clear();
}

std::string LocalCluster::address() const {
  return absl::StrJoin(ports_, ",", [](std::string* out, int port) {
    absl::StrAppend(out, "127.0.0.1:", port);
  });
}

std::string LocalCluster::coordinator_log(int i) {
  auto& log = coordinator_logs_[static_cast<size_t>(i)];
  return log ? log->text() : "";
}

bool LocalCluster::WaitForCoordinatorLog(int i, const std::string& needle,
                                         absl::Duration timeout) {
  auto& log = coordinator_logs_[static_cast<size_t>(i)];
  return log != nullptr && log->WaitFor(needle, timeout);
}

absl::StatusOr<int> LocalCluster::Leader(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  do {
    for (size_t i = 0; i < ports_.size(); ++i) {
      auto channel = MakeChannel(absl::StrCat("127.0.0.1:", ports_[i]), security_);
      if (!channel.ok()) return channel.status();
      auto stub = v1::JobService::NewStub(*channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
      v1::ListWorkersResponse resp;
      grpc::Status st = stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
      if (st.ok()) {
        stub_ = std::move(stub);
        return static_cast<int>(i);
      }
      last = st.error_message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (absl::Now() < deadline);
  return absl::UnavailableError(absl::StrCat("no coordinator leads (", last, ")"));
}

absl::Status LocalCluster::StartCoordinatorAt(int i) {
  SpawnOptions o;
  o.argv = {BinDir() + "/ddp-coordinator", "--listen",
            absl::StrCat("127.0.0.1:", ports_[static_cast<size_t>(i)]), "--store",
            options_.store_uri, "--store-wait=20s"};
  o.argv.insert(o.argv.end(), kTimingFlags.begin(), kTimingFlags.end());
  o.argv.insert(o.argv.end(), options_.coordinator_flags.begin(),
                options_.coordinator_flags.end());
  o.argv.push_back(absl::StrCat("--heartbeat-timeout=",
                                absl::ToInt64Milliseconds(options_.heartbeat_timeout), "ms"));
  o.capture_stderr = true;
  auto proc = Subprocess::Spawn(o);
  if (!proc.ok()) return proc.status();
  auto& slot = coordinators_[static_cast<size_t>(i)];
  if (slot != nullptr) slot->Terminate(absl::Seconds(5));
  coordinator_logs_[static_cast<size_t>(i)].reset();
  slot = std::move(*proc);
  coordinator_logs_[static_cast<size_t>(i)] = std::make_unique<OutputCollector>(slot->stderr_fd());
  return absl::OkStatus();
}

absl::Status LocalCluster::StartCoordinator() {
  if (!options_.store_uri.empty()) {
    for (int i = 0; i < coordinators(); ++i) {
      if (coordinators_[static_cast<size_t>(i)] != nullptr &&
          !coordinators_[static_cast<size_t>(i)]->TryWait().has_value()) {
        continue;
      }
      if (absl::Status st = StartCoordinatorAt(i); !st.ok()) return st;
    }
    return Leader().status();
  }
  SpawnOptions o;
  o.argv = {BinDir() + "/ddp-coordinator", "--listen", address(), "--state-dir",
            dir_ + "/state"};
  o.argv.insert(o.argv.end(), kTimingFlags.begin(), kTimingFlags.end());
  o.argv.insert(o.argv.end(), options_.coordinator_flags.begin(),
                options_.coordinator_flags.end());
  o.argv.push_back(absl::StrCat("--heartbeat-timeout=",
                                absl::ToInt64Milliseconds(options_.heartbeat_timeout), "ms"));
  ChannelSecurity security;
  if (options_.secure) {
    o.argv.insert(o.argv.end(), {"--tls-cert", certs() + "/coordinator.pem", "--tls-key",
                                 certs() + "/coordinator.key", "--tls-ca", certs() + "/ca.pem",
                                 "--auth-token-file", certs() + "/tokens"});
    security.ca_file = certs() + "/ca.pem";
    auto token = ReadClientToken(certs() + "/admin.token");
    if (!token.ok()) return token.status();
    security.token = *token;
  }
  security_ = security;
  auto proc = Subprocess::Spawn(o);
  if (!proc.ok()) return proc.status();
  coordinator_ = std::move(*proc);
  // Serving once it answers a call.
  auto channel = MakeChannel(address(), security);
  if (!channel.ok()) return channel.status();
  stub_ = v1::JobService::NewStub(*channel);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    v1::ListWorkersResponse resp;
    if (stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok()) return absl::OkStatus();
    if (auto exited = coordinator_->TryWait()) {
      return absl::UnavailableError(absl::StrCat("the coordinator exited: ", exited->ToString()));
    }
  }
  return absl::UnavailableError("the coordinator did not come up");
}

absl::Status LocalCluster::AddWorker(const std::string& name) {
  return StartWorker(name, options_.slots);
}

absl::Status LocalCluster::StartWorker(const std::string& name, int slots) {
  SpawnOptions o;
  auto health_port = ClaimPort();
  if (!health_port.ok()) return health_port.status();
  // Its jobs' store ports from a block of this test's own: ports the kernel hands out
  // as free come from the range outgoing connections draw from, and with tests side by
  // side one was taken before rank 0 bound it.
  auto store_ports = ClaimPortBlock();
  if (!store_ports.ok()) return store_ports.status();
  o.argv = {BinDir() + "/ddp-worker", "--coordinator", address(), "--name", name,
            "--slots", std::to_string(slots), "--cpus", "1", "--stop-grace", "3s",
            "--work-dir", dir_ + "/" + name,
            "--health-listen", absl::StrCat("127.0.0.1:", *health_port),
            absl::StrCat("--store-ports=", store_ports->first, "-", store_ports->last)};
  if (!options_.trainer.empty()) {
    o.argv.push_back("--trainer");
    o.argv.push_back(options_.trainer);
  }
  if (options_.secure) {
    o.argv.insert(o.argv.end(), {"--tls-ca", certs() + "/ca.pem", "--tls-cert",
                                 certs() + "/" + name + ".pem", "--tls-key",
                                 certs() + "/" + name + ".key"});
  }
  o.argv.insert(o.argv.end(), options_.worker_flags.begin(), options_.worker_flags.end());
  if (auto it = options_.flags_of.find(name); it != options_.flags_of.end()) {
    o.argv.insert(o.argv.end(), it->second.begin(), it->second.end());
  }
  int metrics_port = 0;
  if (options_.worker_metrics) {
    auto port = ClaimPort();
    if (!port.ok()) return port.status();
    metrics_port = *port;
    o.argv.push_back(absl::StrCat("--metrics-listen=127.0.0.1:", metrics_port));
  }
  if (options_.worker_cwd_own_dir) {
    o.cwd = dir_ + "/" + name;
    std::error_code ec;
    std::filesystem::create_directories(o.cwd, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", o.cwd, ": ", ec.message()));
  }
  auto proc = Subprocess::Spawn(o);
  if (!proc.ok()) return proc.status();
  workers_.push_back(std::move(*proc));
  health_ports_.push_back(*health_port);
  metrics_ports_.push_back(metrics_port);
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForWorkerHealth(int i, bool serving, absl::Duration timeout) {
  // grpc.health.v1 through the generic stub (Debian ships no health client): an empty
  // HealthCheckRequest, and a response whose field 1 is 1 (SERVING) or 2 (NOT_SERVING).
  grpc::GenericStub stub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", health_ports_[static_cast<size_t>(i)]),
      grpc::InsecureChannelCredentials()));
  const std::string want = serving ? std::string("\x08\x01", 2) : std::string("\x08\x02", 2);
  std::string last = "no answer";
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status st) {
                     status = std::move(st);
                     done.Notify();
                   });
    done.WaitForNotification();
    std::vector<grpc::Slice> slices;
    std::string got;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) got.append(reinterpret_cast<const char*>(s.begin()), s.size());
      if (got == want) return absl::OkStatus();
    }
    last = status.ok() ? absl::StrCat("response bytes '", absl::CHexEscape(got), "'")
                       : status.error_message();
    // The agent's state lives in another process: ask again shortly.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("worker ", i + 1, " did not turn ",
                                                  serving ? "SERVING" : "NOT_SERVING", ": ", last));
}

absl::Status LocalCluster::WaitForWorkers(int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListWorkersResponse resp;
    if (stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok()) {
      int alive = 0;
      for (const auto& w : resp.workers()) alive += w.alive();
      if (alive >= n) return absl::OkStatus();
    } else if (!coordinators_.empty()) {
      (void)Leader(absl::Seconds(1));
    }
    // Registration is asynchronous in other processes; poll the coordinator.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(n, " workers did not register"));
}

std::vector<std::string> LocalCluster::CtlFlags(const std::string& role) const {
  std::vector<std::string> flags = {"--coordinator", address()};
  if (options_.secure) {
    flags.insert(flags.end(), {"--tls-ca", certs() + "/ca.pem"});
    if (!role.empty()) flags.insert(flags.end(), {"--token-file", certs() + "/" + role + ".token"});
  }
  return flags;
}

CtlResult LocalCluster::Ctl(std::vector<std::string> args, absl::Duration timeout) {
  return CtlAs("user", std::move(args), timeout);
}

CtlResult LocalCluster::CtlAs(const std::string& role, std::vector<std::string> args,
                              absl::Duration timeout) {
  args.insert(args.begin(), BinDir() + "/ddpctl");
  for (const std::string& f : CtlFlags(role)) args.push_back(f);
  return RunCapture(args, timeout);
}

absl::StatusOr<std::unique_ptr<Subprocess>> LocalCluster::CtlAsync(std::vector<std::string> args) {
  SpawnOptions o;
  o.argv = {BinDir() + "/ddpctl"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  for (const std::string& f : CtlFlags("user")) o.argv.push_back(f);
  o.capture_stdout = true;
  o.capture_stderr = true;
  return Subprocess::Spawn(o);
}

absl::StatusOr<v1::Job> LocalCluster::GetJob(const std::string& job_id, bool history) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_metric_history(history);
  v1::Job job;
  absl::Status st = FromGrpcStatus(stub_->GetJob(&ctx, req, &job));
  if (absl::IsUnavailable(st) && !coordinators_.empty() && Leader().ok()) {
    grpc::ClientContext again;
    again.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    st = FromGrpcStatus(stub_->GetJob(&again, req, &job));
  }
  if (!st.ok()) return st;
  return job;
}

absl::StatusOr<v1::Job> LocalCluster::WaitFor(const std::string& job_id,
                                              const std::function<bool(const v1::Job&)>& pred,
                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  v1::Job job;
  absl::Status st;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    auto reader = stub_->WatchJob(&ctx, req);
    while (reader->Read(&job)) {
      if (pred(job)) {
        ctx.TryCancel();
        reader->Finish();
        return job;
      }
    }
    st = FromGrpcStatus(reader->Finish());
    // With standbys, a takeover ends the stream: follow the new leader.
    if (!absl::IsUnavailable(st) || coordinators_.empty() || absl::Now() >= deadline ||
        !Leader(deadline - absl::Now()).ok()) {
      break;
    }
  }
  if (!st.ok()) return st;
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job_id, " ended (", job.state(), ") before the condition held"));
}

ExitStatus LocalCluster::StopCoordinator(int sig) {
  coordinator_->Signal(sig);
  ExitStatus st = coordinator_->Wait();
  coordinator_.reset();
  return st;
}

WatchLines ParseWatch(const std::string& out) {
  WatchLines w;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    const size_t at = line.find(" rank ");
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(at + 6);
    int rank = 0;
    const size_t space = rest.find(' ');
    if (!absl::SimpleAtoi(rest.substr(0, space), &rank) || space == absl::string_view::npos ||
        !absl::StartsWith(rest.substr(space), " epoch ")) {
      continue;
    }
    rest = rest.substr(space + 7);
    w.lines[rank].emplace_back(line);
    w.epochs[rank].insert(std::string(rest.substr(0, rest.find(' '))));
  }
  return w;
}

std::string StageExample(const std::string& name, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(dir) / "examples");
  std::error_code ec;
  fs::create_directory_symlink(fs::path(SourceDir()) / "data", fs::path(dir) / "data", ec);
  const fs::path copy = fs::path(dir) / "examples" / name;
  fs::copy_file(fs::path(SourceDir()) / "examples" / name, copy,
                fs::copy_options::overwrite_existing);
  return copy.string();
}

}  // namespace ddp::testing
