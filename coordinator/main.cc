// ddp-coordinator: one per cluster. Flags are parsed here and nowhere else.
//
//   ddp-coordinator --listen 0.0.0.0:29400 --state-dir /var/lib/ddp
//   (or --store postgresql://ddp@db/ddp: coordinators in standby, coordinator/standby.h)
//       --tls-cert coordinator.pem --tls-key coordinator.key --tls-ca ca.pem
//       --auth-token-file tokens --health-listen 0.0.0.0:29402
//       --metrics-listen 0.0.0.0:29403 --http-listen 127.0.0.1:29405
//   (one command line)
//
// Without TLS and tokens it serves only loopback addresses (or anything with
// --insecure). SIGHUP re-reads the token file and --quota-file; certificates are
// re-read when they change.
//
// Exit codes: 0 after SIGTERM/SIGINT; 1 when it cannot start (state dir in use or
// unreadable, port taken, unusable certificates or tokens); 2 for bad flags or flag
// values.
#include <sys/resource.h>

#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon/daemon.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/version.h"
#include "coordinator/server.h"
#include "coordinator/standby.h"
#include "coordinator/tracking/tensorboard_writer.h"

int main(int argc, char** argv) {
  if (ddp::VersionRequested(argc, argv)) {
    std::cout << ddp::VersionLine("ddp-coordinator") << "\n";
    return ddp::daemon::kExitOk;
  }
  ddp::CoordinatorServerOptions opts;
  int64_t retain_jobs = opts.retention.retain_jobs;
  int64_t max_log_lines = opts.retention.max_log_lines;
  int64_t max_metric_rows = opts.retention.max_metric_rows;
  ddp::FlagSet flags("ddp-coordinator",
                     "Runs the cluster's coordinator: job queue, worker registry, rendezvous, "
                     "metrics and logs (gRPC).");
  flags.String("listen", &opts.listen, "HOST:PORT to serve gRPC on (port 0: any free port)");
  flags.String("state-dir", &opts.state_dir,
               "directory for the SQLite state (this or --store is required)");
  flags.String("store", &opts.store_uri,
               "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE: the state in PostgreSQL, "
               "shared by coordinators in standby (one leads; the others take over when it "
               "dies); instead of --state-dir");
  flags.Duration("lease-ttl", &opts.lease.ttl,
                 "with --store: how long the leader's lease lasts unrenewed (a standby takes "
                 "over within about --lease-ttl + --lease-renew of the leader's death)");
  flags.Duration("lease-renew", &opts.lease.renew,
                 "with --store: how often the leader renews its lease and standbys try to "
                 "take it (at most half of --lease-ttl)");
  flags.Duration("store-wait", &opts.lease.store_wait,
                 "with --store: how long to wait at start for an unreachable store before "
                 "giving up");
  flags.String("advertise-addr", &opts.advertise_addr,
               "with --store: the HOST:PORT standbys send clients to while this coordinator "
               "leads (default: --listen's, or this host's name for a wildcard address)");
  flags.Duration("rpc-deadline", &opts.timing.rpc_deadline, "deadline of workers' RPCs");
  flags.Duration("heartbeat-interval", &opts.timing.heartbeat_interval,
                 "how often workers heartbeat");
  flags.Duration("heartbeat-timeout", &opts.timing.heartbeat_timeout,
                 "silence after which a worker is lost and its attempts fail");
  flags.Double("max-heartbeats-per-second", &opts.timing.max_heartbeats_per_second,
               "spread heartbeats out past this many a second: the workers are told a "
               "--heartbeat-interval and --heartbeat-timeout stretched by the same whole "
               "factor (up to 4) that keeps the live workers under it (0: never; the "
               "default 5000 first stretches the 1s interval past 5,000 live workers)");
  flags.Duration("recovery-grace", &opts.timing.recovery_grace,
                 "after a restart, how long recovered workers have to check in (at least "
                 "--heartbeat-timeout; keep it above the agents' reconnect bound)");
  flags.Duration("start-timeout", &opts.timing.start_timeout,
                 "how long a formed attempt's trainers may take to start (0: max(5 "
                 "heartbeat intervals, 10s))");
  flags.Int("retain-jobs", &retain_jobs, "finished jobs kept with their metrics and logs");
  flags.Int("max-log-lines", &max_log_lines, "output lines kept per job");
  flags.Int("max-metric-rows", &max_metric_rows, "step metrics kept per job");
  flags.String("tls-cert", &opts.tls.cert_file,
               "PEM certificate to serve TLS with (re-read when it changes)");
  flags.String("tls-key", &opts.tls.key_file, "PEM private key of --tls-cert");
  flags.String("tls-ca", &opts.tls.ca_file,
               "CA whose client certificates identify workers (mTLS; CN or SAN = worker name)");
  flags.String("auth-token-file", &opts.auth.token_file,
               "file of `token role [name]` lines (roles admin, user, viewer, worker); "
               "SIGHUP or a change re-reads it");
  flags.String("health-listen", &opts.health_listen,
               "HOST:PORT of a plaintext gRPC health service for probes (\"\": SERVING while "
               "the state store writes; \"liveness\": while the process runs)");
  flags.String("metrics-listen", &opts.metrics_listen,
               "HOST:PORT to serve Prometheus metrics on (http://HOST:PORT/metrics)");
  flags.String("http-listen", &opts.http_listen,
               "HOST:PORT to serve the read-only web dashboard on (port 0: any free port; "
               "the same tokens and roles as the gRPC reads): https://HOST:PORT/ with "
               "--tls-cert/--tls-key, else plain http://, so a loopback address unless "
               "--insecure");
  flags.String("mlflow-uri", &opts.timing.mlflow_uri,
               "MLflow tracking server (http://HOST:PORT) every job is a run on, unless its "
               "job.yaml says tracking: {mlflow: false}");
  std::string mlflow_allow;
  flags.String("mlflow-allow", &mlflow_allow,
               "further MLflow servers, comma-separated, that a job may name itself "
               "(tracking.mlflow.uri); a job naming any other is refused");
  flags.String("tensorboard-dir", &opts.tensorboard_dir,
               "directory to write every job's TensorBoard run into as its points are stored "
               "(DIR/JOB/events.out.tfevents.*; point `tensorboard --logdir DIR` at it)");
  flags.Int("max-queued-jobs", &opts.usage.queued_jobs,
            "jobs that may wait in the queue; a submission past it is refused");
  flags.Int("max-queued-jobs-per-user", &opts.usage.queued_jobs_per_user,
            "jobs one token name may have waiting in the queue");
  flags.Int("max-log-bytes-per-job", &opts.usage.log_bytes_per_job,
            "output bytes kept per job; what a job prints past it is dropped");
  std::string command_jobs;
  flags.String("command-jobs", &command_jobs,
               "who may submit jobs that run their own program (command:): users (anyone who "
               "may submit), admins, or off (default: users; off with --insecure on a "
               "non-loopback address)");
  flags.Int("max-user-priority", &opts.usage.max_user_priority,
            "highest job priority a non-admin caller may submit (default 0: raising a job "
            "above the rest is an admin's call)");
  std::vector<std::string> quotas;
  flags.StringList("quota", &quotas,
                   "OWNER=SLOTS: at most SLOTS slots held at once by the running jobs of "
                   "token name OWNER (repeatable; * = every owner not named); the rest wait");
  std::string quota_file;
  flags.String("quota-file", &quota_file,
               "file of OWNER=SLOTS lines (# comments), as --quota; SIGHUP re-reads it");
  flags.Int("max-streams", &opts.streams.total, "watch and log streams open at once, in all");
  flags.Int("max-streams-per-caller", &opts.streams.per_caller,
            "watch and log streams one token name may have open at once");
  flags.Bool("insecure", &opts.insecure,
             "allow a non-loopback --listen without TLS or tokens (not for shared networks)");
  if (auto exit_code = ddp::daemon::ParseFlags(flags, argc, argv)) return *exit_code;
  opts.retention = {max_metric_rows, max_log_lines, retain_jobs};
  if (command_jobs.empty()) {
    // Anyone who reaches an --insecure coordinator may submit: running programs on the
    // workers is then for the operator to switch on knowingly.
    auto listen = ddp::ParseHostPort(opts.listen);
    command_jobs = opts.insecure && listen.ok() && !ddp::IsLoopbackHost(listen->host) ? "off"
                                                                                      : "users";
  }
  if (command_jobs == "users") {
    opts.usage.command_jobs = ddp::UsageLimits::CommandJobs::kUsers;
  } else if (command_jobs == "admins") {
    opts.usage.command_jobs = ddp::UsageLimits::CommandJobs::kAdmins;
  } else if (command_jobs == "off") {
    opts.usage.command_jobs = ddp::UsageLimits::CommandJobs::kOff;
  } else {
    return ddp::daemon::UsageError(
        "ddp-coordinator",
        absl::InvalidArgumentError("--command-jobs: must be users, admins or off (got '" +
                                   command_jobs + "')"),
        &flags);
  }
  if (auto loaded = ddp::LoadQuotas(quotas, quota_file); loaded.ok()) {
    opts.usage.quotas = *std::move(loaded);
    opts.quota_flags = quotas;
    opts.quota_file = quota_file;
  } else {
    return ddp::daemon::UsageError("ddp-coordinator", loaded.status(), &flags);
  }
  for (absl::string_view uri : absl::StrSplit(mlflow_allow, ',', absl::SkipWhitespace())) {
    opts.timing.mlflow_allowed.emplace_back(absl::StripAsciiWhitespace(uri));
  }
  // Bad flag values, like unknown flags, exit 2 before anything starts.
  if (absl::Status st = ddp::ValidateServerOptions(opts); !st.ok()) {
    return ddp::daemon::UsageError("ddp-coordinator", st, &flags);
  }

  // Debian's Abseil is built with Mutex deadlock detection on, which records every
  // lock in a global graph: a tenth of the coordinator's CPU at thousands of
  // heartbeats a second. The lock order is documented and kept by hand.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Before any thread starts (threads inherit the mask): the main thread takes the
  // signals while gRPC's threads serve. SIGHUP re-reads the token and quota files.
  ddp::daemon::ShutdownSignals signals(/*reload=*/true);

  // Every connection costs a descriptor: take all the kernel allows us.
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  // Checked here, not only when the server starts: a coordinator in standby starts it
  // when it takes over.
  if (!opts.tensorboard_dir.empty()) {
    if (absl::Status st = ddp::TensorBoardWriter::CheckDirectory(opts.tensorboard_dir); !st.ok()) {
      return ddp::daemon::StartError("ddp-coordinator", st);
    }
  }
  if (!opts.store_uri.empty()) return ddp::RunStandbyCoordinator(opts, signals, argv);

  auto server = ddp::CoordinatorServer::Start(opts);
  if (!server.ok()) {  // The state dir, the port, certificates or tokens.
    return ddp::daemon::StartError("ddp-coordinator", server.status());
  }
  // Type=notify units start their dependents only now, with the port open.
  ddp::daemon::NotifyReady("serving on port " + std::to_string((*server)->port()));
  DDP_LOG(INFO) << ddp::VersionLine("ddp-coordinator") << " serving on port " << (*server)->port();
  int sig = 0;
  while ((sig = signals.Wait()) == SIGHUP) {
    (void)(*server)->ReloadCredentials();
    (void)(*server)->ReloadQuotas();
  }
  DDP_LOG(INFO) << "received " << ddp::daemon::ShutdownSignals::Name(sig) << ", shutting down";
  ddp::daemon::NotifyStopping();
  (*server)->Shutdown();
  (*server)->Wait();
  DDP_LOG(INFO) << "ddp-coordinator stopped";
  return ddp::daemon::kExitOk;
}
