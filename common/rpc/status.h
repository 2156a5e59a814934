// absl::Status <-> grpc::Status, in one place (style: the adapter maps statuses, the
// service logic never sees gRPC).
#ifndef DDP_COMMON_RPC_STATUS_H_
#define DDP_COMMON_RPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ddp {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ddp

#endif  // DDP_COMMON_RPC_STATUS_H_
