// How a trainer's failure is classified, and the exit code that tells its agent and
// the coordinator (common/exit_codes.h):
//
//   kPermanent  the job as written can never succeed anywhere: a bad spec, missing or
//               malformed data, a model that does not fit the data, an allocation
//               larger than the device's whole memory, a checkpoint of another job
//               or model. Exit 2: the job fails, no restart.
//   kNodeFault  this node cannot run it but another may: the device the job needs is
//               not here. Exit 3: retried (on other nodes, once the coordinator
//               avoids nodes that failed so).
//   kRetryable  anything else at run time: a peer died, a timeout, an I/O error, a
//               transient shortage. Exit 1: retried from the last checkpoint.
//
// A status's code decides (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION are
// permanent; the rest retryable) unless it was marked with AsPermanent or AsNodeFault.
// No LibTorch here.
#ifndef DDP_LIBDDP_ENGINE_FAILURE_H_
#define DDP_LIBDDP_ENGINE_FAILURE_H_

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ddp {

enum class FailureKind { kRetryable, kPermanent, kNodeFault };

absl::Status AsPermanent(absl::Status status);
absl::Status AsNodeFault(absl::Status status);
FailureKind ClassifyFailure(const absl::Status& status);
int ExitCodeFor(FailureKind kind);
const char* FailureKindName(FailureKind kind);  // "retryable", "permanent", "node fault"

// The status for an allocator's exception message: LibTorch's CPU allocator says
// "you tried to allocate N bytes", its CUDA allocator "Tried to allocate X GiB (GPU 0;
// Y GiB total capacity". RESOURCE_EXHAUSTED, marked permanent when the request exceeds
// the device's whole memory (`host_memory_bytes` for the CPU; the total the message
// gives for a GPU): no node like this one can ever grant it. Anything else (a request
// that would fit once memory is free, an unrecognized message) stays retryable.
absl::Status AllocationFailure(absl::string_view what, int64_t host_memory_bytes);
// This machine's physical memory in bytes.
int64_t HostMemoryBytes();

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_FAILURE_H_
