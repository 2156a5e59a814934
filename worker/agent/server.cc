#include "worker/agent/server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth/tokens.h"
#include "common/daemon/daemon.h"
#include "common/jobspec/labels.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/net.h"
#include "common/rpc/leader.h"
#include "worker/agent/agent_metrics.h"
#include "worker/agent/coordinator_client.h"
#include "worker/agent/gpu_inventory.h"
#include "worker/agent/job_sandbox.h"

namespace ddp {
namespace {

// The local address this host uses to reach `host` (no packet is sent).
std::string RouteAddressTo(const std::string& host, int port) {
  struct addrinfo hints = {}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  std::string out;
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    struct sockaddr_storage local;
    socklen_t len = sizeof(local);
    char buf[INET6_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr = local.ss_family == AF_INET6
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

// The agent's work dir: given, made 0700 if missing and refused if it is a symlink or
// belongs to someone else; by default a fresh private directory (mkdtemp) under
// $TMPDIR, never a predictable /tmp path another user could create first.
absl::StatusOr<std::string> PrepareWorkDir(const std::string& given, const std::string& name) {
  if (given.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/ddp-worker-" + name + "-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::UnavailableError("cannot create a work dir under $TMPDIR: give --work-dir");
    }
    return templ;
  }
  if (mkdir(given.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError("--work-dir: cannot create " + given);
  }
  struct stat st;
  if (lstat(given.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError("--work-dir: " + given + " is not a directory (a symlink?)");
  }
  if (st.st_uid != geteuid()) {
    return absl::InvalidArgumentError("--work-dir: " + given +
                                      " belongs to another user: give a directory of your own");
  }
  return given;
}

// A worker killed without a chance to stop its ranks (kill -9, a crash) left their
// process groups in the ledger: whatever is still in them is ended before this
// incarnation registers, so no rank of a dead attempt outlives it.
void EndPreviousIncarnationsRanks(const RankLedger& ledger) {
  int left = 0;
  for (const LedgerEntry& e : ledger.previous()) {
    const std::vector<int> ended = EndProcessGroup(e);
    if (ended.empty()) continue;
    left += static_cast<int>(ended.size());
    DDP_LOG(WARNING) << "the previous incarnation of this worker left " << ended.size()
                     << " process(es) of job " << e.job_id << " attempt " << e.attempt
                     << " rank " << e.rank << " (process group " << e.pgid
                     << ", pids " << absl::StrJoin(ended, " ") << "); ended them (SIGKILL)";
  }
  if (!ledger.previous().empty() && left == 0) {
    DDP_LOG(INFO) << "the previous incarnation's " << ledger.previous().size()
                  << " rank process group(s) (" << ledger.path() << ") are all gone";
  }
}

std::string DefaultTrainerPath(const char* argv0) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path dir = ec ? std::filesystem::path(argv0).parent_path() : self.parent_path();
  return (dir / "ddp-trainer").string();
}

// The directory of ddp_report.py: share/ddp/python beside the bin/ directory this
// binary is in (the install tree and the build tree are laid out alike).
std::string DefaultPythonPath(const char* argv0) {
  const std::filesystem::path dir =
      std::filesystem::path(DefaultTrainerPath(argv0)).parent_path().parent_path() / "share" /
      "ddp" / "python";
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) ? dir.lexically_normal().string() : "";
}

// --allow-exec entries: absolute paths (lexically normal, and their canonical form
// too), '*' for any program, 'none' for none.
absl::StatusOr<ExecPolicy> ExecPolicyFromFlags(const std::vector<std::string>& entries,
                                                    bool secured) {
  ExecPolicy policy;
  if (entries.empty()) {
    policy.allow_all = !secured;
    return policy;
  }
  for (const std::string& e : entries) {
    if (e == "*") {
      policy.allow_all = true;
      continue;
    }
    if (e == "none") continue;
    if (e.empty() || e[0] != '/') {
      return absl::InvalidArgumentError("--allow-exec " + e +
                                        ": give an absolute path (a program or a directory), "
                                        "'*' or 'none'");
    }
    const std::string normal = std::filesystem::path(e).lexically_normal().string();
    policy.allowed.push_back(normal);
    std::error_code ec;
    const std::string canonical = std::filesystem::canonical(normal, ec).string();
    if (ec) {
      return absl::InvalidArgumentError("--allow-exec " + e + ": " + ec.message());
    }
    if (canonical != normal) policy.allowed.push_back(canonical);
  }
  return policy;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(WorkerServerOptions options) {
  AgentOptions& opts = options.agent;
  ChannelSecurity& security = options.security;
  auto coordinators = ParseCoordinatorList(options.coordinator);
  if (!coordinators.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator: ", coordinators.status().message()));
  }
  auto target = ParseHostPort(coordinators->front());
  if (opts.name.empty() && !security.cert_file.empty()) {
    auto cn = CertificateCommonName(security.cert_file);
    if (cn.ok()) opts.name = *cn;  // The name the certificate lets us speak for.
  }
  if (opts.name.empty()) opts.name = LocalHostname();
  auto labels = ParseLabelList(options.labels);
  if (!labels.ok()) return absl::InvalidArgumentError("--label: " + std::string(labels.status().message()));
  opts.labels = *std::move(labels);
  if (!options.token_file.empty()) {
    auto token = ReadClientToken(options.token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--token-file: ", token.status().message()));
    }
    security.token = *token;
  }
  // One channel per coordinator (several: coordinators in standby; calls follow the
  // leader).
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (const std::string& address : *coordinators) {
    auto channel = MakeChannel(address, security, CoordinatorChannelArgs());
    if (!channel.ok()) return absl::InvalidArgumentError(channel.status().message());
    clients.push_back(MakeGrpcCoordinatorClient(*channel));
  }
  std::unique_ptr<CoordinatorClient> client =
      clients.size() == 1 ? std::move(clients.front())
                          : MakeFollowingCoordinatorClient(*coordinators, std::move(clients));
  if (!options.store_ports.empty()) {
    auto range = ParsePortRange(options.store_ports);
    if (!range.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--store-ports: ", range.status().message()));
    }
    opts.store_ports = *range;
  }
  auto roots = CanonicalRoots(options.allow_roots);
  if (!roots.ok()) return absl::InvalidArgumentError(roots.status().message());
  opts.allowed_roots = *roots;
  auto exec = ExecPolicyFromFlags(options.allow_exec, /*secured=*/!security.ca_file.empty() ||
                                                          !security.token.empty() ||
                                                          !IsLoopbackHost(target->host));
  if (!exec.ok()) return exec.status();
  opts.exec = *exec;
  const char* argv0 = options.argv0.c_str();
  opts.python_path =
      options.python_path.empty() ? DefaultPythonPath(argv0) : options.python_path;
  opts.stacks.py_spy = FindTool(options.py_spy);
  opts.stacks.eu_stack = FindTool(options.eu_stack);
  DDP_LOG(INFO) << "ranks' stacks, when asked for (a stall, ddpctl diagnose --now): "
                << (opts.stacks.py_spy.empty() ? "no Python stacks (no " + options.py_spy + ")"
                                               : "Python by " + opts.stacks.py_spy)
                << ", "
                << (opts.stacks.eu_stack.empty() ? "no native stacks (no " + options.eu_stack + ")"
                                                 : "native by " + opts.stacks.eu_stack);
  if (options.environ != nullptr) opts.trainer_env = TrainerBaseEnv(options.environ, options.pass_env);
  std::shared_ptr<GpuInventory> gpus = DiscoverGpus();
  opts.gpu_inventory = gpus;
  auto selected = SelectGpus(gpus->Devices(), options.gpus);
  if (!selected.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus: ", selected.status().message()));
  }
  opts.gpus = *std::move(selected);
  opts.slots = options.slots > 0 ? options.slots : std::max(1, static_cast<int>(opts.gpus.size()));
  for (const GpuDevice& g : opts.gpus) {
    DDP_LOG(INFO) << "GPU " << g.index << ": " << g.model << ", " << (g.memory_bytes >> 20)
                  << " MiB, " << g.uuid;
  }
  if (opts.advertise_addr.empty()) opts.advertise_addr = RouteAddressTo(target->host, target->port);
  if (opts.advertise_addr.empty()) opts.advertise_addr = LocalHostname();
  // Ranks' Gloo listens on the interface other hosts reach this one at (a host name
  // that resolves to loopback would make it listen there alone). The operator's own
  // GLOO_SOCKET_IFNAME, passed to ranks, and a job's, win.
  if (!IsLoopbackHost(opts.advertise_addr) && !opts.trainer_env.count("GLOO_SOCKET_IFNAME")) {
    opts.gloo_socket_ifname = InterfaceOfAddress(opts.advertise_addr);
    if (opts.gloo_socket_ifname.empty()) {
      DDP_LOG(WARNING) << "--advertise-addr " << opts.advertise_addr
                       << " is not an address of this host's interfaces: ranks' Gloo binds "
                          "where the host name resolves; set GLOO_SOCKET_IFNAME for multi-host jobs";
    } else {
      DDP_LOG(INFO) << "ranks' Gloo binds " << opts.gloo_socket_ifname << " (the interface of "
                    << opts.advertise_addr << ")";
    }
  }
  if (opts.trainer_path.empty()) opts.trainer_path = DefaultTrainerPath(argv0);
  if (access(opts.trainer_path.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError("--trainer: cannot execute " + opts.trainer_path);
  }
  auto work_dir = PrepareWorkDir(opts.work_dir, opts.name);
  if (!work_dir.ok()) return absl::InvalidArgumentError(work_dir.status().message());
  opts.work_dir = *work_dir;
  SetLogPrefix("[worker " + opts.name + "] ");

  std::unique_ptr<WorkerServer> server(new WorkerServer());
  auto ledger = RankLedger::Open(opts.work_dir, opts.name);
  if (!ledger.ok()) return ledger.status();
  server->ledger_ = *std::move(ledger);
  EndPreviousIncarnationsRanks(*server->ledger_);
  opts.ledger = server->ledger_.get();
  server->coordinator_ = options.coordinator;
  // The shared plaintext health server (common/rpc/health_server.h), as the
  // coordinator's. "" (what readiness probes ask) is SERVING only while the
  // coordinator hears from us: a node that cannot reach it is not healthy, whatever
  // its trainers do. "liveness" is SERVING while the process runs, so a liveness
  // probe never restarts an agent (and kills its trainers) only because the
  // coordinator is away.
  // Other workers ask it too, whether this one reaches the coordinator (fence.h): by
  // default it listens where they reach this host.
  std::string health_listen = options.health_listen;
  if (health_listen.empty()) {
    const std::string host = IsLoopbackHost(opts.advertise_addr) ? "127.0.0.1"
                             : !InterfaceOfAddress(opts.advertise_addr).empty() ? opts.advertise_addr
                                                                                : "0.0.0.0";
    health_listen = HostPort{host, 0}.ToString();
  }
  auto health = HealthServer::Start(health_listen);
  if (!health.ok()) {
    return absl::UnavailableError(absl::StrCat("--health-listen: ", health.status().message()));
  }
  server->health_ = *std::move(health);
  server->health_->Set("liveness", true);
  if (auto bound = ParseHostPort(health_listen);
      bound.ok() && (bound->host == opts.advertise_addr || bound->host == "0.0.0.0" ||
                     bound->host == "::" || bound->host.empty() ||
                     (IsLoopbackHost(bound->host) && IsLoopbackHost(opts.advertise_addr)))) {
    opts.witness_port = server->health_->port();
  } else {
    DDP_LOG(WARNING) << "--health-listen " << health_listen << " is not on --advertise-addr "
                     << opts.advertise_addr
                     << ": other workers cannot ask this one whether it reaches the "
                        "coordinator (partitions look like outages to them when it is "
                        "their only witness)";
  }
  DDP_LOG(INFO) << "health service on port " << server->health_->port() << "; coordinator "
                << options.coordinator
                << (security.ca_file.empty() ? " (plaintext)" : " (TLS)")
                << (security.cert_file.empty() ? "" : " with a client certificate")
                << (security.token.empty() ? "" : " with a token") << "; work dir "
                << opts.work_dir;
  if (opts.allowed_roots.empty()) {
    DDP_LOG(WARNING) << "no --allow-root: jobs may read and write any path this user can";
  }
  if (opts.exec.allow_all) {
    DDP_LOG(WARNING) << "command jobs may start any program as this user (no --allow-exec"
                     << (options.allow_exec.empty() ? " on a plaintext loopback worker" : " '*'")
                     << ")";
  } else {
    DDP_LOG(INFO) << "command jobs may start: "
                  << (opts.exec.allowed.empty() ? std::string("nothing (no --allow-exec)")
                                                : absl::StrJoin(opts.exec.allowed, ", "));
  }
  server->agent_options_ = opts;
  server->agent_ =
      std::make_unique<Agent>(opts, std::move(client), RealClock());
  server->agent_metrics_ = MakeAgentMetrics(server->agent_.get());
  if (!options.metrics_listen.empty()) {
    auto started = MetricsServer::Start(options.metrics_listen);
    if (!started.ok()) {
      return absl::UnavailableError(
          absl::StrCat("--metrics-listen: ", started.status().message()));
    }
    server->metrics_ = *std::move(started);
    server->metrics_->Register(server->agent_metrics_);
    DDP_LOG(INFO) << "Prometheus metrics on port " << server->metrics_->port();
  }
  HealthServer* health_server = server->health_.get();
  const std::string coordinator = options.coordinator;
  server->agent_->set_on_reachable([health_server, coordinator](bool ok) {
    health_server->Set("", ok);
    health_server->Set(kWitnessService, ok);
    // Type=notify: the unit is up once the agent is registered.
    if (ok) {
      daemon::NotifyReady("registered with " + coordinator);
    } else {
      daemon::NotifyStatus("cannot reach " + coordinator);
    }
  });
  return server;
}

WorkerServer::~WorkerServer() {
  metrics_.reset();  // Scrapes stop before the agent they read goes.
  agent_metrics_.reset();
  agent_.reset();
  if (health_) health_->Shutdown();
}

absl::Status WorkerServer::Run() {
  absl::Status st = agent_->Run();
  health_->Shutdown();
  return st;
}

void WorkerServer::Stop(const std::string& reason) { agent_->Stop(reason); }

int WorkerServer::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

}  // namespace ddp
