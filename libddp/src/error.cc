#include "ddp/error.h"

#include "libddp/engine/failure.h"
#include "libddp/src/api_bridge.h"

namespace ddp {

Error::Error(ErrorCode code, const std::string& message, int exit_code)
    : std::runtime_error(message), code_(code), exit_code_(exit_code) {}

Error ErrorFromStatus(const absl::Status& status) {
  ErrorCode code = ErrorCode::kInternal;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      code = ErrorCode::kInvalidArgument;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = ErrorCode::kFailedPrecondition;
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      code = ErrorCode::kUnavailable;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      code = ErrorCode::kDeadlineExceeded;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = ErrorCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return Error(code, std::string(status.message()), ExitCodeFor(ClassifyFailure(status)));
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw ErrorFromStatus(status);
}

absl::Status StatusFromError(const Error& error) {
  absl::Status st;
  switch (error.code()) {
    case ErrorCode::kInvalidArgument: st = absl::InvalidArgumentError(error.what()); break;
    case ErrorCode::kFailedPrecondition: st = absl::FailedPreconditionError(error.what()); break;
    case ErrorCode::kUnavailable: st = absl::UnavailableError(error.what()); break;
    case ErrorCode::kDeadlineExceeded: st = absl::DeadlineExceededError(error.what()); break;
    case ErrorCode::kResourceExhausted: st = absl::ResourceExhaustedError(error.what()); break;
    case ErrorCode::kInternal: st = absl::InternalError(error.what()); break;
  }
  return st;
}

}  // namespace ddp
