// ddp-worker: the node agent, one per node (systemd unit or Kubernetes DaemonSet).
// Flags are parsed here and nowhere else.
//
//   ddp-worker --coordinator 10.0.0.1:29400 --name node-a [--slots 8] [--advertise-addr IP]
//       [--tls-ca ca.pem --tls-cert node-a.pem --tls-key node-a.key | --token-file F]
//       [--allow-root /srv/ddp ...]
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>


#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/strings/str_join.h"
#include "common/auth/tokens.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/net.h"
#include "common/rpc/credentials.h"
#include "common/rpc/health_server.h"
#include "common/version.h"
#include "worker/agent/agent.h"
#include "worker/agent/agent_metrics.h"
#include "worker/agent/job_sandbox.h"

extern char** environ;
#include "worker/agent/gpu_inventory.h"

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
absl::StatusOr<ddp::ExecPolicy> ExecPolicyFromFlags(const std::vector<std::string>& entries,
                                                    bool secured) {
  ddp::ExecPolicy policy;
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

int main(int argc, char** argv) {
  if (ddp::VersionRequested(argc, argv)) {
    std::cout << ddp::VersionLine("ddp-worker") << "\n";
    return 0;
  }
  // Block the shutdown signals before any thread starts (threads inherit the mask:
  // gRPC's start with the first channel): the waiter below takes them with sigwait.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ddp::AgentOptions opts;
  std::string coordinator = "127.0.0.1:29400";
  std::string health_listen = "127.0.0.1:0";
  std::string metrics_listen;
  int slots = 0;
  opts.cpus = static_cast<int>(std::thread::hardware_concurrency());
  ddp::FlagSet flags("ddp-worker",
                     "Node agent: registers this node's slots with ddp-coordinator and runs one "
                     "ddp-trainer per local rank of the jobs it is given.");
  flags.String("coordinator", &coordinator, "the coordinator's HOST:PORT");
  flags.String("name", &opts.name, "this worker's unique name (default: the host name)");
  flags.Int("slots", &slots, "trainer slots (default: one per GPU, or 1 on a CPU-only node)");
  flags.String("advertise-addr", &opts.advertise_addr,
               "address other nodes reach this one at (default: the route to the coordinator)");
  flags.Int("cpus", &opts.cpus, "cores for trainers, split evenly over the slots");
  flags.String("trainer", &opts.trainer_path, "ddp-trainer binary (default: next to ddp-worker)");
  flags.String("work-dir", &opts.work_dir,
               "per-job files (default: a new private directory under $TMPDIR)");
  flags.Duration("stop-grace", &opts.stop_grace, "SIGTERM to SIGKILL grace for trainers");
  flags.String("health-listen", &health_listen, "HOST:PORT of the gRPC health service");
  flags.Bool("long-poll", &opts.long_poll,
             "keep a WaitForTasks call open so new tasks arrive at once (--long-poll=false: "
             "only with heartbeats)");
  flags.String("metrics-listen", &metrics_listen,
               "HOST:PORT to serve Prometheus metrics on (http://HOST:PORT/metrics)");
  ddp::ChannelSecurity security;
  std::string token_file;
  std::vector<std::string> allow_roots, pass_env;
  flags.String("tls-ca", &security.ca_file, "CA of the coordinator's certificate: use TLS");
  flags.String("tls-cert", &security.cert_file,
               "this worker's client certificate (CN or SAN = --name), re-read when it changes");
  flags.String("tls-key", &security.key_file, "the private key of --tls-cert");
  flags.String("token-file", &token_file, "file holding a `worker` token for --name");
  flags.StringList("allow-root", &allow_roots,
                   "directory jobs may use (workdir, data, model, checkpoints); default: any");
  std::vector<std::string> allow_exec;
  flags.StringList("allow-exec", &allow_exec,
                   "program, or directory of programs, that command jobs may start (repeatable; "
                   "'*': any, 'none': none); default: any on a plaintext loopback worker, none "
                   "on a secured one");
  std::string python_path;
  flags.String("python-path", &python_path,
               "directory appended to command jobs' PYTHONPATH (default: ../share/ddp/python "
               "next to this binary, where ddp_report.py is installed)");
  flags.StringList("pass-env", &pass_env,
                   "agent variable (NAME or PREFIX*) trainers inherit beyond the defaults");
  auto positional = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (!positional.ok() || !positional->empty()) {
    std::cerr << "ddp-worker: "
              << (positional.ok() ? "unexpected argument " + positional->front()
                                  : std::string(positional.status().message()))
              << "\n";
    return 2;
  }
  auto target = ddp::ParseHostPort(coordinator);
  if (!target.ok()) {
    std::cerr << "ddp-worker: --coordinator: " << target.status().message() << "\n";
    return 2;
  }
  if (opts.name.empty() && !security.cert_file.empty()) {
    auto cn = ddp::CertificateCommonName(security.cert_file);
    if (cn.ok()) opts.name = *cn;  // The name the certificate lets us speak for.
  }
  if (opts.name.empty()) opts.name = ddp::LocalHostname();
  if (!token_file.empty()) {
    auto token = ddp::ReadClientToken(token_file);
    if (!token.ok()) {
      std::cerr << "ddp-worker: --token-file: " << token.status().message() << "\n";
      return 2;
    }
    security.token = *token;
  }
  auto channel = ddp::MakeChannel(coordinator, security, ddp::CoordinatorChannelArgs());
  if (!channel.ok()) {
    std::cerr << "ddp-worker: " << channel.status().message() << "\n";
    return 2;
  }
  auto roots = ddp::CanonicalRoots(allow_roots);
  if (!roots.ok()) {
    std::cerr << "ddp-worker: " << roots.status().message() << "\n";
    return 2;
  }
  opts.allowed_roots = *roots;
  auto exec = ExecPolicyFromFlags(allow_exec, /*secured=*/!security.ca_file.empty() ||
                                                  !security.token.empty() ||
                                                  !ddp::IsLoopbackHost(target->host));
  if (!exec.ok()) {
    std::cerr << "ddp-worker: " << exec.status().message() << "\n";
    return 2;
  }
  opts.exec = *exec;
  opts.python_path = python_path.empty() ? DefaultPythonPath(argv[0]) : python_path;
  opts.trainer_env = ddp::TrainerBaseEnv(environ, pass_env);
  std::unique_ptr<ddp::GpuInventory> gpus = ddp::DiscoverGpus();
  opts.gpus = gpus->Devices();
  opts.slots = slots > 0 ? slots : std::max(1, static_cast<int>(opts.gpus.size()));
  for (const ddp::GpuDevice& g : opts.gpus) {
    DDP_LOG(INFO) << "GPU " << g.index << ": " << g.model << ", " << (g.memory_bytes >> 20)
                  << " MiB, " << g.uuid;
  }
  if (opts.advertise_addr.empty()) opts.advertise_addr = RouteAddressTo(target->host, target->port);
  if (opts.advertise_addr.empty()) opts.advertise_addr = ddp::LocalHostname();
  if (opts.trainer_path.empty()) opts.trainer_path = DefaultTrainerPath(argv[0]);
  auto work_dir = PrepareWorkDir(opts.work_dir, opts.name);
  if (!work_dir.ok()) {
    std::cerr << "ddp-worker: " << work_dir.status().message() << "\n";
    return 2;
  }
  opts.work_dir = *work_dir;
  if (access(opts.trainer_path.c_str(), X_OK) != 0) {
    std::cerr << "ddp-worker: --trainer: cannot execute " << opts.trainer_path << "\n";
    return 2;
  }
  ddp::SetLogPrefix("[worker " + opts.name + "] ");

  // The shared plaintext health server (common/rpc/health_server.h), as the
  // coordinator's. "" (what readiness probes ask) is SERVING only while the coordinator
  // hears from us: a node that cannot reach it is not healthy, whatever its trainers do.
  // "liveness" is SERVING while the process runs, so a liveness probe never restarts an
  // agent (and kills its trainers) only because the coordinator is away.
  auto health = ddp::HealthServer::Start(health_listen);
  if (!health.ok()) {
    std::cerr << "ddp-worker: --health-listen: " << health.status().message() << "\n";
    return 1;
  }
  (*health)->Set("liveness", true);
  DDP_LOG(INFO) << "health service on port " << (*health)->port() << "; coordinator "
                << coordinator
                << (security.ca_file.empty() ? " (plaintext)" : " (TLS)")
                << (security.cert_file.empty() ? "" : " with a client certificate")
                << (security.token.empty() ? "" : " with a token") << "; work dir "
                << opts.work_dir;
  if (opts.allowed_roots.empty()) {
    DDP_LOG(WARNING) << "no --allow-root: jobs may read and write any path this user can";
  }
  if (opts.exec.allow_all) {
    DDP_LOG(WARNING) << "command jobs may start any program as this user (no --allow-exec"
                     << (allow_exec.empty() ? " on a plaintext loopback worker" : " '*'") << ")";
  } else {
    DDP_LOG(INFO) << "command jobs may start: "
                  << (opts.exec.allowed.empty() ? std::string("nothing (no --allow-exec)")
                                                : absl::StrJoin(opts.exec.allowed, ", "));
  }

  ddp::Agent agent(opts, ddp::MakeGrpcCoordinatorClient(*channel), ddp::RealClock());
  // Declared after the agent: destroyed (scrapes stopped) before it.
  std::shared_ptr<prometheus::Collectable> agent_metrics = ddp::MakeAgentMetrics(&agent);
  std::unique_ptr<ddp::MetricsServer> metrics;
  if (!metrics_listen.empty()) {
    auto started = ddp::MetricsServer::Start(metrics_listen);
    if (!started.ok()) {
      std::cerr << "ddp-worker: --metrics-listen: " << started.status().message() << "\n";
      return 1;
    }
    metrics = *std::move(started);
    metrics->Register(agent_metrics);
    DDP_LOG(INFO) << "Prometheus metrics on port " << metrics->port();
  }
  agent.set_on_reachable([&](bool ok) {
    (*health)->Set("", ok);
    // Type=notify: the unit is up once the agent is registered.
    if (ok) {
      sd_notifyf(0, "READY=1\nSTATUS=registered with %s", coordinator.c_str());
    } else {
      sd_notifyf(0, "STATUS=cannot reach %s", coordinator.c_str());
    }
  });
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    DDP_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                  << ": stopping trainers and exiting";
    sd_notify(0, "STOPPING=1");
    agent.Stop();
  });
  absl::Status st = agent.Run();
  (*health)->Shutdown();
  if (!st.ok()) {
    DDP_LOG(ERROR) << st.message();
    _exit(1);  // The waiter is blocked in sigwait; nothing else needs tearing down.
  }
  waiter.join();
  return 0;
}
