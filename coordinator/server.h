// The coordinator's composition root: builds the parts in dependency order
// (state store -> event hub -> coordinator, recovered from the store -> gRPC services
// with the standard health service -> housekeeping thread) and tears them down in
// reverse.
#ifndef DDP_COORDINATOR_SERVER_H_
#define DDP_COORDINATOR_SERVER_H_

#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/rpc/credentials.h"
#include "common/rpc/health_server.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/rpc/grpc_service.h"
#include "coordinator/store/state_store.h"

namespace ddp {

class CoordinatorMetricsExporter;  // coordinator/metrics.h
class MetricsServer;               // common/metrics/metrics_server.h
class DashboardServer;             // coordinator/http/dashboard_server.h
class TensorBoardWriter;           // coordinator/tracking/tensorboard_writer.h
class MlflowTracker;               // coordinator/tracking/mlflow_tracker.h

// Coordinators in standby over a PostgreSQL store (coordinator/standby.h).
struct LeaseOptions {
  // --lease-ttl: how long a leader's lease lasts unrenewed; a standby takes over once
  // it lapsed (a leader killed: within about ttl + renew).
  absl::Duration ttl = absl::Seconds(3);
  // --lease-renew: how often the leader renews it (and standbys try to take it): at
  // most ttl / 2, so one failed renewal does not depose a leader.
  absl::Duration renew = absl::Seconds(1);
  // --store-wait: how long a coordinator starting waits for an unreachable store
  // before it gives up (exit 1). One that stepped down waits without end.
  absl::Duration store_wait = absl::Seconds(30);
};

struct CoordinatorServerOptions {
  std::string listen = "127.0.0.1:29400";
  std::string state_dir;
  // --store postgresql://...: the state in PostgreSQL, shared by coordinators in
  // standby (instead of --state-dir).
  std::string store_uri;
  LeaseOptions lease;
  // --advertise-addr: the HOST:PORT standbys name as the leader's when this one leads
  // (default: --listen's, or this host's name when --listen is a wildcard).
  std::string advertise_addr;
  CoordinatorOptions timing;
  RetentionOptions retention;
  absl::Duration tick = absl::Milliseconds(100);  // Housekeeping period.
  // Completion queues (each with its thread) heartbeat streams are spread over
  // (coordinator/rpc/heartbeat_streams.h); 0: one per core, at most 8. Measured on 2
  // cores at 10,000 streams: 1 queue 0.75 core, 2 0.58, 4 0.65, 8 0.72
  // (docs/benchmarks.md).
  int heartbeat_stream_queues = 0;
  ServerTlsOptions tls;  // --tls-cert, --tls-key, --tls-ca
  AuthOptions auth;      // --auth-token-file (client_certificates follows --tls-ca)
  UsageLimits usage;     // --max-queued-jobs[-per-user], --max-log-bytes-per-job
  StreamLimits streams;  // --max-streams, --max-streams-per-caller
  // --insecure: serve a non-loopback address without TLS or tokens (warned at start).
  bool insecure = false;
  // How often the token file is checked for changes (certificates: tls.refresh).
  absl::Duration auth_refresh = absl::Seconds(10);
  // --health-listen: a plaintext grpc.health.v1 port of its own ("" is SERVING while
  // the store can write, "liveness" while the process runs); empty: none (the main
  // port serves the health service either way).
  std::string health_listen;
  // --metrics-listen: Prometheus /metrics over HTTP (coordinator/metrics.h); empty: none.
  std::string metrics_listen;
  // --http-listen: the read-only web dashboard (coordinator/http/dashboard.h), with the
  // same tokens and roles as the gRPC reads. HTTPS with `tls`'s certificate when
  // given; plain HTTP otherwise, then loopback only unless --insecure. Empty: none.
  std::string http_listen;
  // --tensorboard-dir: every job as a TensorBoard run there, written as its points are
  // stored (coordinator/tracking/tensorboard_writer.h). Empty: none.
  std::string tensorboard_dir;
  // --quota OWNER=SLOTS entries and --quota-file: usage.quotas holds both as read at
  // start; ReloadQuotas() reads the file again.
  std::vector<std::string> quota_flags;
  std::string quota_file;
  // Asked before every call (Authorizer::SetGate): a leader whose lease lapsed refuses
  // calls. Empty: none.
  std::function<absl::Status()> gate;
};

// The quotas of --quota entries and --quota-file (one OWNER=SLOTS per line, `#`
// comments; empty: none). INVALID_ARGUMENT naming the flag, the file or the entry.
absl::StatusOr<Quotas> LoadQuotas(const std::vector<std::string>& flags,
                                  const std::string& file);

// Whether `uri` is http(s)://HOST[:PORT][/PATH] without a trailing slash.
bool IsTrackingServerUri(const std::string& uri);

// INVALID_ARGUMENT naming the flag: neither or both of --state-dir and --store, a
// malformed --store URI, lease timings out of order, a bad --listen, timeouts
// out of order, retention, queue and stream limits < 1, a --listen address that
// other machines can reach without TLS (--tls-cert/--tls-key) and tokens
// (--auth-token-file), and a non-loopback --http-listen without them, unless
// --insecure. main() exits 2 on these, as for any bad flag.
absl::Status ValidateServerOptions(const CoordinatorServerOptions& options);

class CoordinatorServer {
 public:
  // Errors: INVALID_ARGUMENT (options), UNAVAILABLE (state dir in use by another
  // coordinator or unusable, port in use), DATA_LOSS (a state database that is not
  // ours). The state dir stays locked until the server is destroyed. With `store`
  // (the PostgreSQL store of a coordinator that took the lead), the state is that
  // store's, not --state-dir's.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options, Clock* clock = RealClock(),
      std::shared_ptr<Store> store = nullptr);
  ~CoordinatorServer();

  int port() const { return port_; }
  // 0 when not serving them.
  int health_port() const { return health_ ? health_->port() : 0; }
  int metrics_port() const;
  int http_port() const;  // The dashboard's (--http-listen); 0 when not serving it.
  // Re-reads the token file now (SIGHUP); certificates are re-read by gRPC's file
  // watcher when they change. On error the previous tokens stay in force.
  absl::Status ReloadCredentials();
  // Re-reads --quota-file (SIGHUP), keeping --quota's entries; a file that does not
  // read or parse leaves the quotas in force (logged, returned). OK without a file.
  absl::Status ReloadQuotas();
  // Waits until every change staged so far is stored.
  absl::Status FlushStore();
  // Stops accepting calls, ends open streams, stops housekeeping. Idempotent.
  void Shutdown();
  void Wait();

 private:
  CoordinatorServer() = default;
  // Housekeeping's health check: "" follows whether the store writes.
  void UpdateHealth();

  std::shared_ptr<Store> store_;
  std::unique_ptr<EventHub> hub_;
  std::unique_ptr<Coordinator> coordinator_;
  // A sink of hub_'s that reads coordinator_: taken off the hub and destroyed first.
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<MlflowTracker> mlflow_;  // Likewise.
  std::unique_ptr<CoordinatorMetricsExporter> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;  // Scrapes read coordinator_.
  std::unique_ptr<DashboardServer> dashboard_;     // Reads coordinator_, hub_, auth_.
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthServer> health_;
  // Housekeeping thread only (and Start, before it runs).
  std::vector<std::string> quota_flags_;  // --quota, kept for ReloadQuotas.
  std::string quota_file_;
  bool store_failing_ = false;
  bool first_health_update_ = true;
  int port_ = 0;
  absl::Notification stop_;
  std::thread housekeeping_;
  std::once_flag shutdown_once_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_SERVER_H_
