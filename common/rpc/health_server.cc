#include "common/rpc/health_server.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// gRPC runs the default health service only next to a registered service.
class UnimplementedService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() {
        Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            "this port serves only grpc.health.v1.Health"));
      }
      void OnDone() override { delete this; }
    };
    return new Reactor();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& listen) {
  std::unique_ptr<HealthServer> s(new HealthServer());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  s->unimplemented_ = std::make_unique<UnimplementedService>();
  builder.RegisterCallbackGenericService(s->unimplemented_.get());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // Port taken: fail, don't share.
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the health service on ", listen, ": is the port taken?"));
  }
  s->server_->GetHealthCheckService()->SetServingStatus("", false);
  return s;
}

HealthServer::~HealthServer() { Shutdown(); }

void HealthServer::Set(const std::string& service, bool serving) {
  if (server_) server_->GetHealthCheckService()->SetServingStatus(service, serving);
}

void HealthServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
}

}  // namespace ddp
