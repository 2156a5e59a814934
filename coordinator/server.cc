#include "coordinator/server.h"

#include <grpc/grpc.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/metrics/metrics_server.h"
#include "common/net.h"
#include "coordinator/http/dashboard_server.h"
#include "coordinator/metrics.h"
#include "coordinator/rpc/request_limits.h"
#include "coordinator/store/postgres_store.h"
#include "coordinator/tracking/mlflow_tracker.h"
#include "coordinator/tracking/tensorboard_writer.h"

namespace ddp {

bool IsTrackingServerUri(const std::string& uri) {
  const size_t scheme = uri.find("://");
  if (scheme == std::string::npos) return false;
  const std::string name = uri.substr(0, scheme);
  if (name != "http" && name != "https") return false;
  if (scheme + 3 >= uri.size() || uri[scheme + 3] == '/' || uri.back() == '/') return false;
  return uri.find_first_of(" \t\r\n") == std::string::npos;
}

absl::Status ValidateServerOptions(const CoordinatorServerOptions& options) {
  if (options.state_dir.empty() == options.store_uri.empty()) {
    return absl::InvalidArgumentError(
        options.state_dir.empty()
            ? "--state-dir (SQLite) or --store (postgresql://...) is required: where jobs and "
              "metrics live"
            : "--state-dir and --store: give one (--store shares the state with standby "
              "coordinators, --state-dir keeps it in this coordinator's SQLite)");
  }
  if (!options.store_uri.empty()) {
    if (absl::Status st = pg::CheckUri(options.store_uri); !st.ok()) return st;
    const LeaseOptions& lease = options.lease;
    if (lease.ttl < absl::Seconds(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--lease-ttl ", absl::FormatDuration(lease.ttl), ": must be at least 1s"));
    }
    if (lease.renew <= absl::ZeroDuration() || lease.renew * 2 > lease.ttl) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--lease-renew ", absl::FormatDuration(lease.renew), " must be above 0 and at most "
          "half of --lease-ttl ", absl::FormatDuration(lease.ttl),
          ", so that one late renewal does not depose the leader"));
    }
    if (lease.store_wait < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--store-wait: must not be negative");
    }
    if (!options.advertise_addr.empty()) {
      if (auto parsed = ParseHostPort(options.advertise_addr); !parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--advertise-addr: ", parsed.status().message()));
      }
    }
  }
  if (absl::Status st = ValidateTimeouts(options.timing); !st.ok()) return st;
  if (absl::Status st = ValidateRetention(options.retention); !st.ok()) return st;
  auto listen = ParseHostPort(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", listen.status().message()));
  }
  if (options.tls.cert_file.empty() != options.tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both");
  }
  if (!options.tls.ca_file.empty() && options.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca needs --tls-cert and --tls-key: client certificates are checked only over TLS");
  }
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{
                                        "--health-listen", options.health_listen},
                                    {"--metrics-listen", options.metrics_listen},
                                    {"--http-listen", options.http_listen}}) {
    if (value.empty()) continue;
    if (auto parsed = ParseHostPort(value); !parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", parsed.status().message()));
    }
  }
  for (const auto& [flag, value] :
       {std::pair{"--max-queued-jobs", options.usage.queued_jobs},
        std::pair{"--max-queued-jobs-per-user", options.usage.queued_jobs_per_user},
        std::pair{"--max-log-bytes-per-job", options.usage.log_bytes_per_job},
        std::pair{"--max-streams", options.streams.total},
        std::pair{"--max-streams-per-caller", options.streams.per_caller}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": must be >= 1 (got ", value, ")"));
    }
  }
  if (!IsLoopbackHost(listen->host) && !options.insecure) {
    const bool tls = !options.tls.cert_file.empty();
    const bool tokens = !options.auth.token_file.empty();
    if (!tls || !tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", options.listen, " is reachable from other machines, but ",
          !tls ? (tokens ? "TLS is" : "TLS and authentication are") : "authentication is",
          " not configured: add ",
          !tls ? "--tls-cert FILE --tls-key FILE [--tls-ca FILE] " : "",
          !tokens ? "--auth-token-file FILE " : "",
          "(scripts/make_certs.sh makes them), listen on 127.0.0.1, or pass --insecure to "
          "serve it unprotected anyway"));
    }
  }
  // The dashboard carries tokens (a form, a cookie) and shows what GetJob shows: off
  // loopback, only over HTTPS (the coordinator's --tls-cert) and to tokens, as --listen
  // (decision 153), unless --insecure.
  if (!options.http_listen.empty() && !options.insecure &&
      !IsLoopbackHost(ParseHostPort(options.http_listen)->host)) {
    const bool tls = !options.tls.cert_file.empty();
    const bool tokens = !options.auth.token_file.empty();
    if (!tls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-listen ", options.http_listen,
          " is reachable from other machines, but the dashboard would serve plain HTTP (no "
          "TLS), so tokens and jobs would cross the network in the clear: add --tls-cert FILE "
          "--tls-key FILE (it then serves HTTPS with them), serve it on 127.0.0.1 and reach it "
          "through an SSH tunnel or kubectl port-forward, or pass --insecure to serve it "
          "unprotected anyway"));
    }
    if (!tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-listen ", options.http_listen,
          " is reachable from other machines, but authentication is not configured, so "
          "anyone reaching it would read every job: add --auth-token-file FILE, serve it on "
          "127.0.0.1, or pass --insecure to serve it unprotected anyway"));
    }
  }
  std::vector<std::string> mlflow = options.timing.mlflow_allowed;
  if (!options.timing.mlflow_uri.empty()) mlflow.push_back(options.timing.mlflow_uri);
  for (const std::string& uri : mlflow) {
    if (!IsTrackingServerUri(uri)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mlflow-uri/--mlflow-allow: '", uri,
          "' is not an MLflow tracking server's address: give http://HOST:PORT or "
          "https://HOST:PORT, without a trailing slash"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options, Clock* clock, std::shared_ptr<Store> store) {
  if (absl::Status st = ValidateServerOptions(options); !st.ok()) return st;
  auto listen = ParseHostPort(options.listen);
  // Credentials first: unusable certificate or token files stop us before the state
  // dir is locked.
  auto credentials = MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  AuthOptions auth_options = options.auth;
  auth_options.client_certificates = !options.tls.ca_file.empty();
  auto auth = Authorizer::Create(auth_options);
  if (!auth.ok()) return auth.status();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->auth_ = *std::move(auth);
  if (options.gate) s->auth_->SetGate(options.gate);
  if (store != nullptr) {
    s->store_ = std::move(store);
  } else {
    // Locks the state dir: a second coordinator on it stops here.
    auto opened = StateStore::Open(options.state_dir, options.retention);
    if (!opened.ok()) return opened.status();
    s->store_ = std::move(*opened);
  }
  s->hub_ = std::make_unique<EventHub>(s->store_.get(), clock, EventHub::Options{});
  s->coordinator_ =
      std::make_unique<Coordinator>(options.timing, s->store_.get(), s->hub_.get(), clock,
                                    options.usage);
  s->quota_flags_ = options.quota_flags;
  s->quota_file_ = options.quota_file;
  if (absl::Status st = s->coordinator_->Recover(); !st.ok()) return st;
  if (!options.tensorboard_dir.empty()) {
    Coordinator* coordinator = s->coordinator_.get();
    TensorBoardWriter::Options tb;
    tb.dir = options.tensorboard_dir;
    auto writer = TensorBoardWriter::Start(
        tb,
        [coordinator](const std::string& id) { return coordinator->GetJob(id); });
    if (!writer.ok()) return writer.status();
    s->tensorboard_ = *std::move(writer);
    s->hub_->AddSink(s->tensorboard_.get());
  }
  if (!options.timing.mlflow_uri.empty() || !options.timing.mlflow_allowed.empty()) {
    Coordinator* coordinator = s->coordinator_.get();
    const CoordinatorOptions timing = options.timing;
    s->mlflow_ = std::make_unique<MlflowTracker>(
        MlflowTracker::Options{},
        [coordinator](const std::string& id) { return coordinator->GetJob(id); },
        [timing](const v1::Job& job) -> absl::StatusOr<MlflowTracker::Target> {
          auto spec = ParseJobSpec(job.spec_yaml(), job.id());
          if (!spec.ok()) return spec.status();
          auto uri = MlflowServerFor(*spec, job.id(), timing);
          if (!uri.ok()) return uri.status();
          return MlflowTracker::Target{*uri, spec->tracking.mlflow_experiment.empty()
                                                 ? spec->name
                                                 : spec->tracking.mlflow_experiment};
        },
        [coordinator](const std::string& id) -> absl::StatusOr<JobOutput> {
          auto job = coordinator->GetJob(id, /*metric_history=*/true);
          if (!job.ok()) return job.status();
          JobOutput out;
          out.job_id = id;
          out.metrics.assign(job->history().begin(), job->history().end());
          out.epochs.assign(job->epoch_history().begin(), job->epoch_history().end());
          return out;
        });
    s->hub_->AddSink(s->mlflow_.get());
    // What a coordinator before this one may have left unsent: the runs of the jobs that
    // have not ended, or ended lately, are caught up from the store (mlflow_tracker.h).
    const int64_t since =
        absl::ToUnixMillis(absl::Now() - MlflowTracker::Options{}.catch_up_window);
    std::vector<std::string> resume;
    for (const v1::Job& job : coordinator->ListJobs(std::numeric_limits<int>::max())) {
      if (job.end_ms() == 0 || job.end_ms() >= since) resume.push_back(job.id());
    }
    s->mlflow_->Resume(resume);
  }
  s->job_service_ =
      std::make_unique<JobServiceImpl>(s->coordinator_.get(), s->hub_.get(), s->auth_.get(),
                                       options.streams);
  s->worker_service_ =
      std::make_unique<WorkerServiceImpl>(
          s->coordinator_.get(), s->auth_.get(),
          options.heartbeat_stream_queues > 0
              ? options.heartbeat_stream_queues
              : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  s->metrics_ = std::make_unique<CoordinatorMetricsExporter>(s->coordinator_.get());
  if (!options.metrics_listen.empty()) {
    auto metrics_server = MetricsServer::Start(options.metrics_listen);
    if (!metrics_server.ok()) return metrics_server.status();
    s->metrics_server_ = *std::move(metrics_server);
    for (const auto& c : s->metrics_->collectables()) s->metrics_server_->Register(c);
  }

  if (!options.http_listen.empty()) {
    DashboardServerOptions dashboard_options;
    dashboard_options.listen = options.http_listen;
    // HTTPS with gRPC's own certificate and key, re-read as often as gRPC re-reads them.
    dashboard_options.cert_file = options.tls.cert_file;
    dashboard_options.key_file = options.tls.key_file;
    dashboard_options.tls_refresh = options.tls.refresh;
    auto dashboard = DashboardServer::Start(
        dashboard_options,
        std::make_unique<DashboardHandler>(s->coordinator_.get(), s->hub_.get(), s->auth_.get(),
                                           clock));
    if (!dashboard.ok()) return dashboard.status();
    s->dashboard_ = *std::move(dashboard);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default on Linux: a second coordinator could then bind
  // the same port and take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A request over the limit is refused by the transport with RESOURCE_EXHAUSTED.
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  // A connection that never completes its TLS and HTTP/2 handshakes is dropped after
  // 10 s (gRPC's default is 120 s), so idle or garbage connections cannot pile up.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  // Thousands of agents each send a small RPC a second: bandwidth probing (a PING
  // per read, and its ack) would cost more syscalls than the RPCs themselves.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Agents' keepalive pings (worker/agent/coordinator_client.h: every 5 s, also
  // without calls) are welcome: by default gRPC answers pings more often than every
  // 5 minutes without data with GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 4000);
  builder.AddListeningPort(options.listen, *credentials, &s->port_);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  s->worker_service_->AddStreamQueues(builder);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counting;
  counting.push_back(s->metrics_->InterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(counting));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen,
                                               ": is another coordinator running there?"));
  }
  s->worker_service_->StartStreams();
  if (!options.health_listen.empty()) {
    auto health = HealthServer::Start(options.health_listen);
    if (!health.ok()) return health.status();
    s->health_ = *std::move(health);
    s->health_->Set("liveness", true);
    s->UpdateHealth();
  }
  s->housekeeping_ = std::thread([srv = s.get(), tick = options.tick,
                                  refresh = options.auth_refresh] {
    absl::Time next_auth_check = absl::Now() + refresh;
    while (!srv->stop_.WaitForNotificationWithTimeout(tick)) {
      srv->coordinator_->Tick();
      srv->UpdateHealth();
      if (absl::Now() >= next_auth_check) {
        next_auth_check = absl::Now() + refresh;
        if (absl::Status st = srv->auth_->ReloadIfChanged(); !st.ok()) {
          DDP_LOG(ERROR) << "--auth-token-file changed but cannot be used (" << st.message()
                         << "); the previous tokens stay in force";
        }
      }
    }
  });
  DDP_LOG(INFO) << "ddp-coordinator serving on " << listen->host << ":" << s->port_
                << (options.tls.cert_file.empty() ? " (plaintext)"
                    : options.tls.ca_file.empty() ? " (TLS)"
                                                  : " (TLS, worker certificates verified)")
                << (options.auth.token_file.empty() ? "" : " with tokens")
                << ", state in "
                << (options.store_uri.empty() ? options.state_dir
                                              : "PostgreSQL " + pg::Redact(options.store_uri));
  if (s->health_) DDP_LOG(INFO) << "health service on port " << s->health_->port();
  if (s->metrics_server_) {
    DDP_LOG(INFO) << "Prometheus metrics on http://" << ParseHostPort(options.metrics_listen)->host
                  << ":" << s->metrics_server_->port() << "/metrics";
  }
  if (s->dashboard_) {
    const std::string host = ParseHostPort(options.http_listen)->host;
    DDP_LOG(INFO) << "web dashboard on " << (s->dashboard_->https() ? "https://" : "http://")
                  << (host.find(':') != std::string::npos ? "[" + host + "]" : host) << ":"
                  << s->dashboard_->port() << "/"
                  << (options.auth.token_file.empty() ? " (open: no tokens)" : "");
    if (!IsLoopbackHost(host) && !s->dashboard_->https()) {
      DDP_LOG(WARNING) << "--insecure: the dashboard on " << options.http_listen
                       << " is plain HTTP reachable from other machines: tokens and jobs "
                          "cross the network in the clear";
    }
  }
  if (!IsLoopbackHost(listen->host) &&
      (options.tls.cert_file.empty() || options.auth.token_file.empty())) {
    DDP_LOG(WARNING) << "--insecure: " << options.listen
                     << " is reachable from other machines without "
                     << (options.tls.cert_file.empty() ? "TLS" : "tokens")
                     << ": anyone who can reach it can run jobs on every worker";
  }
  return s;
}

int CoordinatorServer::metrics_port() const {
  return metrics_server_ ? metrics_server_->port() : 0;
}

int CoordinatorServer::http_port() const { return dashboard_ ? dashboard_->port() : 0; }

void CoordinatorServer::UpdateHealth() {
  if (!health_) return;
  const bool failing = coordinator_->stats().store.failing;
  if (failing == store_failing_ && !first_health_update_) return;
  first_health_update_ = false;
  store_failing_ = failing;
  health_->Set("", !failing);
  if (failing) {
    DDP_LOG(ERROR) << "health: NOT_SERVING: the state store cannot write (see above)";
  } else {
    DDP_LOG(INFO) << "health: SERVING";
  }
}

absl::StatusOr<Quotas> LoadQuotas(const std::vector<std::string>& flags,
                                  const std::string& file) {
  std::vector<std::string> entries = flags;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return absl::InvalidArgumentError("--quota-file: cannot read " + file);
    for (std::string line; std::getline(in, line);) {
      line = line.substr(0, line.find('#'));
      if (!absl::StripAsciiWhitespace(line).empty()) entries.push_back(line);
    }
  }
  auto quotas = ParseQuotas(entries);
  if (!quotas.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.empty() ? "--quota: " : absl::StrCat("--quota/--quota-file ", file, ": "),
                     quotas.status().message()));
  }
  return quotas;
}

absl::Status CoordinatorServer::ReloadQuotas() {
  if (quota_file_.empty()) return absl::OkStatus();
  auto quotas = LoadQuotas(quota_flags_, quota_file_);
  if (!quotas.ok()) {
    DDP_LOG(ERROR) << "cannot reload quotas (" << quotas.status().message()
                   << "); the previous quotas stay in force";
    return quotas.status();
  }
  DDP_LOG(INFO) << "reloaded --quota-file: " << quotas->slots.size() << " quota(s)";
  coordinator_->SetQuotas(*std::move(quotas));
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ReloadCredentials() {
  absl::Status st = auth_->Reload();
  if (st.ok()) {
    DDP_LOG(INFO) << "reloaded --auth-token-file";
  } else {
    DDP_LOG(ERROR) << "cannot reload --auth-token-file (" << st.message()
                   << "); the previous tokens stay in force";
  }
  return st;
}

absl::Status CoordinatorServer::FlushStore() { return coordinator_->Flush(); }

void CoordinatorServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (housekeeping_.joinable()) housekeeping_.join();
    // Probes see it going before it is gone. Open long polls are answered (the server
    // waits for every call); open streams are cancelled, and their reactors finish.
    if (health_) health_->Set("", false);
    if (coordinator_) coordinator_->CloseLongPolls();
    if (worker_service_) worker_service_->CloseStreams();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (worker_service_) worker_service_->StopStreams();
    dashboard_.reset();  // Waits for requests in progress; they read coordinator_.
    if (health_) health_->Shutdown();
  });
}

void CoordinatorServer::Wait() {
  if (server_) server_->Wait();
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  Wait();
  if (tensorboard_) {
    hub_->RemoveSink(tensorboard_.get());
    tensorboard_.reset();  // Writes what it has queued.
  }
  if (mlflow_) {
    hub_->RemoveSink(mlflow_.get());
    mlflow_.reset();  // Tries once more to send what it keeps.
  }
}

}  // namespace ddp
