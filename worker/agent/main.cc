// ddp-worker: the node agent, one per node (systemd unit or Kubernetes DaemonSet).
// Flags are parsed here and nowhere else.
//
//   ddp-worker --coordinator 10.0.0.1:29400 --name node-a [--slots 8] [--advertise-addr IP]
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/server_callback.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "common/flags.h"
#include "common/logging.h"
#include "common/net.h"
#include "worker/agent/agent.h"

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

int CountGpus() {
  int n = 0;
  for (int i = 0; i < 64; ++i) {
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) ++n;
  }
  return n;
}

// The worker serves only the standard health service; gRPC needs at least one
// callback service to run it, so every other method answers UNIMPLEMENTED.
class UnimplementedService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "ddp-worker serves only "
                                                                        "grpc.health.v1.Health")); }
      void OnDone() override { delete this; }
    };
    return new Reactor();
  }
};

std::string DefaultTrainerPath(const char* argv0) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path dir = ec ? std::filesystem::path(argv0).parent_path() : self.parent_path();
  return (dir / "ddp-trainer").string();
}

}  // namespace

int main(int argc, char** argv) {
  ddp::AgentOptions opts;
  std::string coordinator = "127.0.0.1:29400";
  std::string health_listen = "127.0.0.1:0";
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
  flags.String("work-dir", &opts.work_dir, "per-job files (default: /tmp/ddp-worker-NAME)");
  flags.Duration("stop-grace", &opts.stop_grace, "SIGTERM to SIGKILL grace for trainers");
  flags.String("health-listen", &health_listen, "HOST:PORT of the gRPC health service");
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
  if (opts.name.empty()) opts.name = ddp::LocalHostname();
  opts.gpus = CountGpus();
  opts.slots = slots > 0 ? slots : std::max(1, opts.gpus);
  if (opts.advertise_addr.empty()) opts.advertise_addr = RouteAddressTo(target->host, target->port);
  if (opts.advertise_addr.empty()) opts.advertise_addr = ddp::LocalHostname();
  if (opts.trainer_path.empty()) opts.trainer_path = DefaultTrainerPath(argv[0]);
  if (opts.work_dir.empty()) opts.work_dir = "/tmp/ddp-worker-" + opts.name;
  if (access(opts.trainer_path.c_str(), X_OK) != 0) {
    std::cerr << "ddp-worker: --trainer: cannot execute " << opts.trainer_path << "\n";
    return 2;
  }
  ddp::SetLogPrefix("[worker " + opts.name + "] ");

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  UnimplementedService unimplemented;
  builder.RegisterCallbackGenericService(&unimplemented);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // Port taken: fail, don't share.
  int health_port = 0;
  builder.AddListeningPort(health_listen, grpc::InsecureServerCredentials(), &health_port);
  std::unique_ptr<grpc::Server> health = builder.BuildAndStart();
  if (health == nullptr || health_port == 0) {
    std::cerr << "ddp-worker: --health-listen: cannot listen on " << health_listen << "\n";
    return 1;
  }
  health->GetHealthCheckService()->SetServingStatus(false);
  DDP_LOG(INFO) << "health service on port " << health_port << "; coordinator " << coordinator;

  ddp::Agent agent(opts, ddp::MakeGrpcCoordinatorClient(coordinator), ddp::RealClock());
  agent.set_on_registered(
      [&](bool ok) { health->GetHealthCheckService()->SetServingStatus(ok); });
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&set, &sig);
    DDP_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                  << ": stopping trainers and exiting";
    agent.Stop();
  });
  absl::Status st = agent.Run();
  health->Shutdown();
  if (!st.ok()) {
    DDP_LOG(ERROR) << st.message();
    _exit(1);  // The waiter is blocked in sigwait; nothing else needs tearing down.
  }
  waiter.join();
  return 0;
}
