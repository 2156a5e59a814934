#include "coordinator/server.h"

#include <grpc/grpc.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net.h"

namespace ddp {

absl::Status ValidateServerOptions(const CoordinatorServerOptions& options) {
  if (options.state_dir.empty()) {
    return absl::InvalidArgumentError("--state-dir is required (where jobs and metrics live)");
  }
  if (absl::Status st = ValidateTimeouts(options.timing); !st.ok()) return st;
  if (absl::Status st = ValidateRetention(options.retention); !st.ok()) return st;
  auto listen = ParseHostPort(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", listen.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options, Clock* clock) {
  if (absl::Status st = ValidateServerOptions(options); !st.ok()) return st;
  auto listen = ParseHostPort(options.listen);
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  // Locks the state dir: a second coordinator on it stops here.
  auto store = StateStore::Open(options.state_dir, options.retention);
  if (!store.ok()) return store.status();
  s->store_ = std::move(*store);
  s->hub_ = std::make_unique<EventHub>(s->store_.get(), clock, EventHub::Options{});
  s->coordinator_ =
      std::make_unique<Coordinator>(options.timing, s->store_.get(), s->hub_.get(), clock);
  if (absl::Status st = s->coordinator_->Recover(); !st.ok()) return st;
  s->job_service_ = std::make_unique<JobServiceImpl>(s->coordinator_.get(), s->hub_.get());
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default on Linux: a second coordinator could then bind
  // the same port and take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->worker_service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen,
                                               ": is another coordinator running there?"));
  }
  s->housekeeping_ = std::thread([srv = s.get(), tick = options.tick] {
    while (!srv->stop_.WaitForNotificationWithTimeout(tick)) srv->coordinator_->Tick();
  });
  DDP_LOG(INFO) << "ddp-coordinator serving on " << listen->host << ":" << s->port_
                << ", state in " << options.state_dir;
  return s;
}

void CoordinatorServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (housekeeping_.joinable()) housekeeping_.join();
    // Open streams are cancelled; their reactors finish and clean up.
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
}

void CoordinatorServer::Wait() {
  if (server_) server_->Wait();
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  Wait();
}

}  // namespace ddp
