// Coordinators in standby over one PostgreSQL store (`ddp-coordinator --store
// postgresql://...`; docs/high-availability.md).
//
// Any number run; one leads. Each starts as a standby: it serves --listen (and
// --health-listen) with StandbyServer, which answers every call with UNAVAILABLE "not
// the leader: ...; the leader is at HOST:PORT" (clients follow it: common/rpc/leader.h)
// and reports NOT_SERVING to readiness probes, and tries to take the store's lease
// every --lease-renew. Once it holds the lease it closes the standby server and starts
// the CoordinatorServer on the same port, fenced to the lease's epoch: it rebuilds its
// state from the store and the workers' reports exactly as a restarted coordinator
// does (running trainers keep training; workers get --recovery-grace to check in).
//
// The leader renews the lease every --lease-renew. It steps down when another took
// the lease (a pause or a partition outlasted it) or when it could not renew it for
// --lease-ttl (the store unreachable): from the moment its lease may have lapsed, by
// its own monotonic clock, it refuses every call ("not the leader"), so a leader
// resumed after a SIGSTOP serves nothing stale; the store's fencing refuses its
// writes. It then logs why and executes itself again as a fresh standby (the same
// command line), leaving nothing of the old state behind.
//
// SIGTERM/SIGINT: a leader stops serving and releases the lease (a standby takes over
// at its next try); a standby just stops.
#ifndef DDP_COORDINATOR_STANDBY_H_
#define DDP_COORDINATOR_STANDBY_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon/daemon.h"
#include "common/rpc/health_server.h"
#include "coordinator/server.h"

namespace ddp {

class NotLeaderService;

// The gRPC server of a coordinator in standby: every call on `listen` is answered with
// NotLeaderError(why, leader) as last set; the health service on `health_listen` (if
// any) says "liveness" SERVING and "" (readiness) NOT_SERVING.
class StandbyServer {
 public:
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen, const ServerTlsOptions& tls, const std::string& health_listen);
  ~StandbyServer();

  int port() const { return port_; }
  void SetLeader(const std::string& why, const std::string& leader);

 private:
  StandbyServer() = default;
  std::unique_ptr<NotLeaderService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthServer> health_;
  int port_ = 0;
};

// Runs a coordinator of `options.store_uri` as above until SIGTERM or SIGINT; returns
// the process's exit code (daemon::kExit*). `argv` is what it executes again with
// after stepping down (this call then does not return).
int RunStandbyCoordinator(const CoordinatorServerOptions& options,
                          daemon::ShutdownSignals& signals, char** argv);

}  // namespace ddp

#endif  // DDP_COORDINATOR_STANDBY_H_
