// ddp-coordinator: one per cluster. Flags are parsed here and nowhere else.
//
//   ddp-coordinator --listen 0.0.0.0:29400 --state-dir /var/lib/ddp
//
// Exit codes: 0 after SIGTERM/SIGINT; 1 when it cannot start (state dir in use or
// unreadable, port taken); 2 for bad flags or flag values.
#include <signal.h>

#include <iostream>

#include "absl/status/status.h"
#include "common/flags.h"
#include "common/logging.h"
#include "coordinator/server.h"

int main(int argc, char** argv) {
  ddp::CoordinatorServerOptions opts;
  int64_t retain_jobs = opts.retention.retain_jobs;
  int64_t max_log_lines = opts.retention.max_log_lines;
  int64_t max_metric_rows = opts.retention.max_metric_rows;
  ddp::FlagSet flags("ddp-coordinator",
                     "Runs the cluster's coordinator: job queue, worker registry, rendezvous, "
                     "metrics and logs (gRPC).");
  flags.String("listen", &opts.listen, "HOST:PORT to serve gRPC on (port 0: any free port)");
  flags.String("state-dir", &opts.state_dir, "directory for the SQLite state (required)");
  flags.Duration("rpc-deadline", &opts.timing.rpc_deadline, "deadline of workers' RPCs");
  flags.Duration("heartbeat-interval", &opts.timing.heartbeat_interval,
                 "how often workers heartbeat");
  flags.Duration("heartbeat-timeout", &opts.timing.heartbeat_timeout,
                 "silence after which a worker is lost and its attempts fail");
  flags.Int("retain-jobs", &retain_jobs, "finished jobs kept with their metrics and logs");
  flags.Int("max-log-lines", &max_log_lines, "output lines kept per job");
  flags.Int("max-metric-rows", &max_metric_rows, "step metrics kept per job");
  auto positional = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  if (!positional.ok() || !positional->empty()) {
    std::cerr << "ddp-coordinator: "
              << (positional.ok() ? "unexpected argument " + positional->front()
                                  : std::string(positional.status().message()))
              << "\n" << flags.Usage();
    return 2;
  }
  opts.retention = {max_metric_rows, max_log_lines, retain_jobs};
  // Bad flag values, like unknown flags, exit 2 before anything starts.
  if (absl::Status st = ddp::ValidateServerOptions(opts); !st.ok()) {
    std::cerr << "ddp-coordinator: " << st.message() << "\n" << flags.Usage();
    return 2;
  }

  // Block the shutdown signals before any thread starts (threads inherit the mask);
  // the main thread waits for them while gRPC's threads serve.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  auto server = ddp::CoordinatorServer::Start(opts);
  if (!server.ok()) {  // The state dir or the port.
    std::cerr << "ddp-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  DDP_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", shutting down";
  (*server)->Shutdown();
  (*server)->Wait();
  DDP_LOG(INFO) << "ddp-coordinator stopped";
  return 0;
}
