// ddp-worker: the node agent, one per node (systemd unit or Kubernetes DaemonSet).
// Flags are parsed here and nowhere else; worker/agent/server.h builds the rest.
//
//   ddp-worker --coordinator 10.0.0.1:29400 --name node-a [--slots 8] [--gpus 0,1]
//       [--advertise-addr IP] [--store-ports LO-HI]
//       [--tls-ca ca.pem --tls-cert node-a.pem --tls-key node-a.key | --token-file F]
//       [--allow-root /srv/ddp ...]
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/daemon/daemon.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/version.h"
#include "worker/agent/server.h"

extern char** environ;

int main(int argc, char** argv) {
  if (ddp::VersionRequested(argc, argv)) {
    std::cout << ddp::VersionLine("ddp-worker") << "\n";
    return ddp::daemon::kExitOk;
  }
  // Before any thread starts (gRPC's start with the first channel): the waiter below
  // takes SIGTERM and SIGINT.
  ddp::daemon::ShutdownSignals signals;
  ddp::WorkerServerOptions options;
  ddp::AgentOptions& opts = options.agent;
  opts.cpus = static_cast<int>(std::thread::hardware_concurrency());
  ddp::FlagSet flags("ddp-worker",
                     "Node agent: registers this node's slots with ddp-coordinator and runs one "
                     "ddp-trainer per local rank of the jobs it is given.");
  flags.String("coordinator", &options.coordinator,
               "the coordinator's HOST:PORT; several, comma-separated, for coordinators in "
               "standby (the worker follows the leader)");
  flags.String("name", &opts.name, "this worker's unique name (default: the host name)");
  flags.Int("slots", &options.slots, "trainer slots (default: one per GPU, or 1 on a CPU-only node)");
  flags.String("gpus", &options.gpus,
               "the node's GPUs this worker offers: NVML indices or UUIDs, comma-separated "
               "(CUDA_VISIBLE_DEVICES' form; a Slurm task's own), 'all' or 'none'");
  flags.StringList("label", &options.labels,
                   "KEY=VALUE label of this node (repeatable: pool=team-a, gpu=h100); jobs "
                   "select nodes by them (node_selector)");
  flags.Bool("leave-on-exit", &opts.leave_on_exit,
             "on SIGTERM/SIGINT, once trainers are stopped, leave the cluster (the coordinator "
             "forgets this worker at once): for nodes that do not come back, as a Slurm "
             "allocation's");
  flags.String("advertise-addr", &opts.advertise_addr,
               "address other nodes reach this one at (default: the route to the coordinator)");
  flags.Int("cpus", &opts.cpus, "cores for trainers, split evenly over the slots");
  flags.String("trainer", &opts.trainer_path, "ddp-trainer binary (default: next to ddp-worker)");
  flags.String("work-dir", &opts.work_dir,
               "per-job files (default: a new private directory under $TMPDIR)");
  flags.Duration("stop-grace", &opts.stop_grace, "SIGTERM to SIGKILL grace for trainers");
  flags.String("health-listen", &options.health_listen,
               "HOST:PORT of the gRPC health service, which other workers ask too (default: a "
               "free port on --advertise-addr)");
  flags.String("store-ports", &options.store_ports,
               "LO-HI: the ports this node offers its jobs' rank 0 for the rendezvous store "
               "(MASTER_PORT), free ones in turn: a range a firewall lets through, outside the "
               "kernel's ephemeral range (default: any free port)");
  flags.Bool("long-poll", &opts.long_poll,
             "keep a WaitForTasks call open so new tasks arrive at once (--long-poll=false: "
             "only with heartbeats)");
  flags.Bool("quiet-heartbeats", &opts.quiet_heartbeats,
             "on the heartbeat stream, have the coordinator answer only beats with news and "
             "one in k where its timeouts allow k > 1 (decision 161; false: every beat)");
  flags.String("metrics-listen", &options.metrics_listen,
               "HOST:PORT to serve Prometheus metrics on (http://HOST:PORT/metrics)");
  ddp::ChannelSecurity& security = options.security;
  flags.String("tls-ca", &security.ca_file, "CA of the coordinator's certificate: use TLS");
  flags.String("tls-cert", &security.cert_file,
               "this worker's client certificate (CN or SAN = --name), re-read when it changes");
  flags.String("tls-key", &security.key_file, "the private key of --tls-cert");
  flags.String("token-file", &options.token_file, "file holding a `worker` token for --name");
  flags.StringList("allow-root", &options.allow_roots,
                   "directory jobs may use (workdir, data, model, checkpoints); default: any");
  flags.StringList("allow-exec", &options.allow_exec,
                   "program, or directory of programs, that command jobs may start (repeatable; "
                   "'*': any, 'none': none); default: any on a plaintext loopback worker, none "
                   "on a secured one");
  flags.String("python-path", &options.python_path,
               "directory appended to command jobs' PYTHONPATH (default: ../share/ddp/python "
               "next to this binary, where ddp_report.py is installed)");
  flags.String("py-spy", &options.py_spy,
               "py-spy (PyPI) for command jobs' Python stacks when a stall is suspected or "
               "`ddpctl diagnose --now` asks: a name on PATH or a path; empty: none");
  flags.String("eu-stack", &options.eu_stack,
               "eu-stack (Debian's elfutils) for the ranks' native stacks, likewise");
  flags.StringList("pass-env", &options.pass_env,
                   "agent variable (NAME or PREFIX*) trainers inherit beyond the defaults");
  if (auto exit_code = ddp::daemon::ParseFlags(flags, argc, argv)) return *exit_code;
  options.argv0 = argv[0];
  options.environ = environ;
  auto server = ddp::WorkerServer::Start(std::move(options));
  if (!server.ok()) {
    return absl::IsInvalidArgument(server.status())
               ? ddp::daemon::UsageError("ddp-worker", server.status())
               : ddp::daemon::StartError("ddp-worker", server.status());
  }
  std::thread waiter([&] {
    const int sig = signals.Wait();
    DDP_LOG(INFO) << "received " << ddp::daemon::ShutdownSignals::Name(sig)
                  << ": stopping trainers and exiting";
    ddp::daemon::NotifyStopping();
    (*server)->Stop(absl::StrCat("received ", ddp::daemon::ShutdownSignals::Name(sig)));
  });
  absl::Status st = (*server)->Run();
  if (!st.ok()) {
    DDP_LOG(ERROR) << st.message();
    _exit(ddp::daemon::kExitCannotStart);  // The waiter is blocked in sigwait.
  }
  waiter.join();
  return ddp::daemon::kExitOk;
}
