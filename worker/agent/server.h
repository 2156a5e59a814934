// The worker's composition root, as coordinator/server.h is the coordinator's:
// resolves what the flags leave to the node (its name, GPUs, slots, advertised
// address, work dir, trainer binary, who may be started), then builds the parts in
// dependency order (credentials -> channel -> agent -> health service -> metrics) and
// tears them down in reverse. main.cc only declares flags and handles signals.
#ifndef DDP_WORKER_AGENT_SERVER_H_
#define DDP_WORKER_AGENT_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/credentials.h"
#include "common/rpc/health_server.h"
#include "worker/agent/agent.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace ddp {

class MetricsServer;  // common/metrics/metrics_server.h

struct WorkerServerOptions {
  std::string coordinator = "127.0.0.1:29400";  // --coordinator
  // --name, --advertise-addr, --cpus, --trainer, --work-dir, --stop-grace,
  // --long-poll; what is empty is resolved by Start().
  AgentOptions agent;
  int slots = 0;  // --slots (0: one per GPU, or 1 on a CPU-only node)
  std::string gpus = "all";  // --gpus: which of the node's GPUs (SelectGpus)
  std::vector<std::string> labels;  // --label KEY=VALUE (repeatable)
  ChannelSecurity security;  // --tls-ca, --tls-cert, --tls-key
  std::string token_file;    // --token-file
  std::vector<std::string> allow_roots;  // --allow-root
  std::vector<std::string> allow_exec;   // --allow-exec
  std::vector<std::string> pass_env;     // --pass-env
  std::string python_path;               // --python-path ("" : beside this binary)
  std::string py_spy = "py-spy";         // --py-spy (a name on PATH or a path; "": none)
  std::string eu_stack = "eu-stack";     // --eu-stack (likewise)
  // --health-listen; empty: a free port on --advertise-addr (127.0.0.1 when that is
  // loopback, every interface when it is no address of this host), where other
  // workers can ask it whether this one reaches the coordinator (fence.h).
  std::string health_listen;
  std::string metrics_listen;                 // --metrics-listen ("" : none)
  std::string store_ports;                    // --store-ports LO-HI ("" : any free port)
  // Where this binary is (argv[0]): ddp-trainer and share/ddp/python are found beside it.
  std::string argv0;
  char** environ = nullptr;  // What trainers may inherit (TrainerBaseEnv).
};

class WorkerServer {
 public:
  // Errors: INVALID_ARGUMENT naming the flag (a bad --coordinator, --token-file,
  // --allow-root, --allow-exec, --store-ports, --work-dir or --trainer: main exits 2); UNAVAILABLE
  // for a port that cannot be served (--health-listen, --metrics-listen: exit 1).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(WorkerServerOptions options);
  ~WorkerServer();

  // Registers and runs the agent until Stop(); an error only when it cannot go on
  // (another agent registered under this name). Tells systemd READY once registered.
  absl::Status Run();
  void Stop(const std::string& reason = "");  // Thread-safe; `reason` as Agent::Stop.

  const AgentOptions& agent_options() const { return agent_options_; }
  int health_port() const { return health_->port(); }
  int metrics_port() const;  // 0 without --metrics-listen.

 private:
  WorkerServer() = default;

  std::string coordinator_;
  // Before the agent: it records into the ledger until it is destroyed.
  std::unique_ptr<RankLedger> ledger_;
  AgentOptions agent_options_;
  std::unique_ptr<HealthServer> health_;
  std::unique_ptr<Agent> agent_;
  // After the agent: destroyed (scrapes stopped) before it.
  std::shared_ptr<prometheus::Collectable> agent_metrics_;
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_SERVER_H_
