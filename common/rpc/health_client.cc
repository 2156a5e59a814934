#include "common/rpc/health_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"

namespace ddp {
namespace {

// One Check in flight: its stub, context and buffers live until its callback ran.
struct Call {
  std::unique_ptr<grpc::GenericStub> stub;
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;
  grpc::Status status;
};

// HealthCheckRequest{service = 1}, by hand (field 1, length-delimited).
grpc::ByteBuffer Request(const std::string& service) {
  std::string body;
  if (!service.empty()) {
    body = absl::StrCat(std::string(1, '\x0a'), std::string(1, static_cast<char>(service.size())),
                        service);
  }
  grpc::Slice slice(body);
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<bool> Answer(const std::string& target, Call& call) {
  if (!call.status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("health check of ", target, ": ", call.status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  std::string got;
  if (call.response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) got.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{status = 1}: 1 SERVING, 2 NOT_SERVING.
  if (got == std::string("\x08\x01", 2)) return true;
  if (got == std::string("\x08\x02", 2)) return false;
  return absl::UnavailableError(
      absl::StrCat("health check of ", target, ": unexpected answer '", absl::CHexEscape(got), "'"));
}

}  // namespace

std::vector<absl::StatusOr<bool>> CheckHealthAll(const std::vector<std::string>& targets,
                                                 const std::string& service,
                                                 absl::Duration deadline) {
  // Service names are short (their length is one byte above); a longer one is none.
  std::vector<absl::StatusOr<bool>> out;
  if (service.size() > 127) {
    out.assign(targets.size(), absl::InvalidArgumentError("health service name too long"));
    return out;
  }
  std::vector<std::unique_ptr<Call>> calls;
  absl::BlockingCounter pending(static_cast<int>(targets.size()));
  const auto until = absl::ToChronoTime(absl::Now() + deadline);
  for (const std::string& target : targets) {
    auto call = std::make_unique<Call>();
    call->stub = std::make_unique<grpc::GenericStub>(
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    call->ctx.set_deadline(until);
    call->request = Request(service);
    Call* c = call.get();
    c->stub->UnaryCall(&c->ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &c->request,
                       &c->response, [c, &pending](grpc::Status st) {
                         c->status = std::move(st);
                         pending.DecrementCount();
                       });
    calls.push_back(std::move(call));
  }
  pending.Wait();
  for (size_t i = 0; i < targets.size(); ++i) out.push_back(Answer(targets[i], *calls[i]));
  return out;
}

absl::StatusOr<bool> CheckHealth(const std::string& target, const std::string& service,
                                 absl::Duration deadline) {
  return CheckHealthAll({target}, service, deadline)[0];
}

}  // namespace ddp
