#include "worker/agent/coordinator_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "common/rpc/status.h"
#include "ddp/v1/worker_service.grpc.pb.h"

namespace ddp {
namespace {

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(const std::string& target)
      : stub_(v1::WorkerService::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req,
                                                absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::RegisterResponse resp;
    absl::Status st = FromGrpcStatus(stub_->Register(&ctx, req, &resp));
    if (!st.ok()) return st;
    return resp;
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req,
                                                  absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::HeartbeatResponse resp;
    absl::Status st = FromGrpcStatus(stub_->Heartbeat(&ctx, req, &resp));
    if (!st.ok()) return st;
    return resp;
  }

  absl::Status ReportEvents(const v1::ReportEventsRequest& req, absl::Duration deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::ReportEventsResponse resp;
    return FromGrpcStatus(stub_->ReportEvents(&ctx, req, &resp));
  }

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const std::string& target) {
  return std::make_unique<GrpcCoordinatorClient>(target);
}

}  // namespace ddp
