#include "coordinator/standby.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/rpc/leader.h"
#include "common/rpc/status.h"
#include "coordinator/store/postgres_store.h"

namespace ddp {
namespace {

// Set in the environment of a coordinator that stepped down and executed itself
// again: it waits for the store without end (it led before; the store will return).
constexpr char kSteppedDownEnv[] = "DDP_COORDINATOR_STEPPED_DOWN";

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool Stops(int sig) { return sig == SIGTERM || sig == SIGINT; }

[[noreturn]] void StepDown(const std::string& why, char** argv) {
  DDP_LOG(WARNING) << "stepping down: " << why
                   << "; this coordinator serves and writes nothing more and starts again as a "
                      "standby";
  std::fflush(nullptr);
  ::setenv(kSteppedDownEnv, "1", 1);
  ::execv("/proc/self/exe", argv);
  DDP_LOG(ERROR) << "cannot execute /proc/self/exe again: " << std::strerror(errno);
  std::_Exit(daemon::kExitCannotStart);
}

}  // namespace

// Answers every call with the status last set.
class NotLeaderService final : public grpc::CallbackGenericService {
 public:
  void Set(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    status_ = ToGrpcStatus(status);
  }
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    absl::MutexLock lock(&mu_);
    return new Refusal(status_);
  }

 private:
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refusal(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  absl::Mutex mu_;
  grpc::Status status_ ABSL_GUARDED_BY(mu_) =
      ToGrpcStatus(NotLeaderError("this coordinator is starting as a standby", ""));
};

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen, const ServerTlsOptions& tls, const std::string& health_listen) {
  auto credentials = MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<StandbyServer> s(new StandbyServer());
  s->service_ = std::make_unique<NotLeaderService>();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // As the leader's (server.cc).
  // Connections are closed after a few seconds: a client that reached a standby through
  // a load balancer (a Kubernetes Service) connects again and lands on the leader.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 1000);
  builder.AddListeningPort(listen, *credentials, &s->port_);
  builder.RegisterCallbackGenericService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen,
                                               ": is another coordinator running there?"));
  }
  // Probes on the main port see a standby as not ready (a Service routes to the leader).
  if (auto* health = s->server_->GetHealthCheckService()) health->SetServingStatus(false);
  if (!health_listen.empty()) {
    auto health = HealthServer::Start(health_listen);
    if (!health.ok()) return health.status();
    s->health_ = *std::move(health);
    s->health_->Set("liveness", true);
    s->health_->Set("", false);
  }
  return s;
}

StandbyServer::~StandbyServer() {
  if (health_) health_->Shutdown();
  if (server_) {
    // Calls here are only ever refused: nothing in flight is worth waiting for.
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

void StandbyServer::SetLeader(const std::string& why, const std::string& leader) {
  service_->Set(NotLeaderError(why, leader));
}

int RunStandbyCoordinator(const CoordinatorServerOptions& options,
                          daemon::ShutdownSignals& signals, char** argv) {
  const LeaseOptions& lease = options.lease;
  const bool stepped_down = std::getenv(kSteppedDownEnv) != nullptr;
  auto standby = StandbyServer::Start(options.listen, options.tls, options.health_listen);
  if (!standby.ok()) return daemon::StartError("ddp-coordinator", standby.status());
  const HostPort listen{ParseHostPort(options.listen)->host, (*standby)->port()};
  std::string address = options.advertise_addr;
  if (address.empty()) {
    const bool wildcard = listen.host.empty() || listen.host == "0.0.0.0" || listen.host == "::";
    address = HostPort{wildcard ? LocalHostname() : listen.host, listen.port}.ToString();
  }
  const std::string uri = pg::Redact(options.store_uri);
  DDP_LOG(INFO) << "ddp-coordinator standing by on " << listen.ToString() << " (advertised as "
                << address << "), state in PostgreSQL " << uri << "; lease "
                << absl::FormatDuration(lease.ttl) << ", renewed every "
                << absl::FormatDuration(lease.renew);

  // The store: a coordinator starting gives up after --store-wait; one that stepped
  // down waits for it.
  std::shared_ptr<PostgresStore> store;
  const absl::Time give_up = absl::Now() + lease.store_wait;
  std::string said;
  for (;;) {
    auto opened = PostgresStore::Open(
        {options.store_uri, options.retention, std::max(lease.ttl / 3, absl::Milliseconds(300))});
    if (opened.ok()) {
      store = std::move(*opened);
      break;
    }
    if (!absl::IsUnavailable(opened.status())) {
      return daemon::StartError("ddp-coordinator", opened.status());
    }
    if (!stepped_down && absl::Now() >= give_up) {
      return daemon::StartError(
          "ddp-coordinator",
          absl::UnavailableError(absl::StrCat(opened.status().message(), " (waited --store-wait ",
                                              absl::FormatDuration(lease.store_wait), ")")));
    }
    const std::string why = absl::StrCat("the store is unreachable: ", opened.status().message());
    if (why != said) DDP_LOG(WARNING) << why << "; retrying every " << absl::FormatDuration(lease.renew);
    said = why;
    (*standby)->SetLeader(why, "");
    if (Stops(signals.WaitFor(lease.renew))) return daemon::kExitOk;
  }
  daemon::NotifyReady("standby on port " + std::to_string(listen.port));

  // Stand by until the lease is ours.
  const std::string id = LeaderId();
  int64_t epoch = 0;
  int64_t renewed_at = 0;  // Monotonic: just before the last successful take or renewal.
  said.clear();
  std::string previous_leader;
  for (;;) {
    const int64_t t0 = MonotonicNanos();
    auto taken = store->TryAcquire(id, address, lease.ttl);
    if (taken.ok() && taken->has_value()) {
      epoch = **taken;
      renewed_at = t0;
      break;
    }
    std::string why, leader;
    auto holder = store->Holder();
    if (!taken.ok() && !absl::IsFailedPrecondition(taken.status())) {
      why = absl::StrCat("cannot reach the store to take the lead: ", taken.status().message());
    } else if (holder.ok() && holder->live) {
      why = "this coordinator is a standby";
      leader = holder->address;
      previous_leader = leader;
    } else {
      why = "the leader's lease lapsed; a standby takes over within --lease-renew";
    }
    const std::string line = absl::StrCat(why, leader.empty() ? "" : "; the leader is at ", leader);
    if (line != said) DDP_LOG(INFO) << "standby: " << line;
    said = line;
    (*standby)->SetLeader(why, leader);
    if (Stops(signals.WaitFor(lease.renew))) return daemon::kExitOk;
  }
  DDP_LOG(INFO) << "leading: took the lease with epoch " << epoch
                << (previous_leader.empty() ? "" : absl::StrCat(" (after ", previous_leader, ")"))
                << "; loading the state from the store";

  // Lead: the coordinator on the standby's port, fenced to the epoch.
  std::atomic<int64_t> renewed{renewed_at};
  std::atomic<bool> stopping{false};
  const int64_t ttl_ns = absl::ToInt64Nanoseconds(lease.ttl);
  CoordinatorServerOptions leader_options = options;
  leader_options.listen = listen.ToString();
  leader_options.gate = [&renewed, &stopping, ttl_ns, ttl = lease.ttl]() -> absl::Status {
    if (stopping.load()) {
      return NotLeaderError("this coordinator is stopping and hands over to a standby", "");
    }
    if (MonotonicNanos() - renewed.load() < ttl_ns) return absl::OkStatus();
    return NotLeaderError(absl::StrCat("this coordinator's lease was not renewed for ",
                                       absl::FormatDuration(ttl), ": it is stepping down"),
                          "");
  };
  store->SetFence(epoch);
  standby->reset();  // Frees the port.
  const absl::Time loading = absl::Now();
  auto server = CoordinatorServer::Start(leader_options, RealClock(), store);
  if (!server.ok()) {
    (void)store->Release(epoch);
    return daemon::StartError("ddp-coordinator", server.status());
  }
  DDP_LOG(INFO) << "leading on " << listen.ToString() << " (epoch " << epoch << "), "
                << absl::FormatDuration(absl::Now() - loading) << " after taking the lease";
  daemon::NotifyStatus("leading on port " + std::to_string(listen.port));

  absl::Notification stop;
  absl::Mutex lost_mu;
  std::string lost;  // Why the lease is gone, once it is.
  std::thread renewer([&] {
    bool failing = false;
    while (!stop.WaitForNotificationWithTimeout(lease.renew)) {
      const int64_t t0 = MonotonicNanos();
      absl::Status st = store->Renew(epoch, lease.ttl);
      if (st.ok()) {
        renewed.store(t0);
        if (failing) DDP_LOG(INFO) << "renewed the lease again";
        failing = false;
      } else if (absl::IsFailedPrecondition(st)) {
        absl::MutexLock lock(&lost_mu);
        lost = std::string(st.message());
        return;
      } else if (!failing) {
        DDP_LOG(WARNING) << "cannot renew the lease (" << st.message()
                         << "); stepping down if this lasts " << absl::FormatDuration(lease.ttl);
        failing = true;
      }
    }
  });
  for (;;) {
    const int sig = signals.WaitFor(absl::Milliseconds(100));
    {
      absl::MutexLock lock(&lost_mu);
      if (!lost.empty()) StepDown(lost, argv);
    }
    if (MonotonicNanos() - renewed.load() >= ttl_ns) {
      StepDown(absl::StrCat("the lease was not renewed for ", absl::FormatDuration(lease.ttl),
                            " (a pause, or the store unreachable): another coordinator may lead"),
               argv);
    }
    if (sig == SIGHUP) {
      (void)(*server)->ReloadCredentials();
      (void)(*server)->ReloadQuotas();
    } else if (Stops(sig)) {
      DDP_LOG(INFO) << "received " << daemon::ShutdownSignals::Name(sig) << ", shutting down";
      break;
    }
  }
  daemon::NotifyStopping();
  stop.Notify();
  renewer.join();
  // Hand over first, then shut down: refuse every call from now on (clients turn to
  // the standbys), store what is staged, and let the lease go; a standby takes over
  // while open streams (ddpctl watch) are still being wound down.
  stopping.store(true);
  if (absl::Status st = (*server)->FlushStore(); !st.ok()) {
    DDP_LOG(WARNING) << "storing the last changes before the hand-over: " << st.message();
  }
  if (absl::Status st = store->Release(epoch); st.ok()) {
    DDP_LOG(INFO) << "released the lease: a standby takes over at its next try";
  } else {
    DDP_LOG(WARNING) << "cannot release the lease (" << st.message()
                     << "): a standby takes over once it lapses";
  }
  (*server)->Shutdown();
  (*server)->Wait();
  server->reset();
  DDP_LOG(INFO) << "ddp-coordinator stopped";
  return daemon::kExitOk;
}

}  // namespace ddp
