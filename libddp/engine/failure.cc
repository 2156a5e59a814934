#include "libddp/engine/failure.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/contract/exit_codes.h"

namespace ddp {
namespace {

constexpr char kFailurePayload[] = "type.ddp/failure_kind";

absl::Status Mark(absl::Status status, const char* kind) {
  if (!status.ok()) status.SetPayload(kFailurePayload, absl::Cord(kind));
  return status;
}

// The number (with an optional unit: B, KiB, MiB, GiB, TiB) right after `prefix` in
// `text`, in bytes; -1 if there is none.
double BytesAfter(absl::string_view text, absl::string_view prefix) {
  const size_t at = text.find(prefix);
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = text.substr(at + prefix.size());
  size_t n = 0;
  while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '.')) {
    ++n;
  }
  double value;
  if (n == 0 || !absl::SimpleAtod(rest.substr(0, n), &value)) return -1;
  rest = absl::StripLeadingAsciiWhitespace(rest.substr(n));
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"TiB", 1ULL << 40}, {"GiB", 1ULL << 30}, {"MiB", 1ULL << 20}, {"KiB", 1ULL << 10}};
  for (const auto& [unit, scale] : kUnits) {
    if (absl::StartsWith(rest, unit)) return value * scale;
  }
  return value;  // "bytes" or no unit.
}

}  // namespace

absl::Status AsPermanent(absl::Status status) { return Mark(std::move(status), "permanent"); }
absl::Status AsNodeFault(absl::Status status) { return Mark(std::move(status), "node"); }

FailureKind ClassifyFailure(const absl::Status& status) {
  if (auto kind = status.GetPayload(kFailurePayload)) {
    if (*kind == "permanent") return FailureKind::kPermanent;
    if (*kind == "node") return FailureKind::kNodeFault;
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return FailureKind::kPermanent;
    default:
      return FailureKind::kRetryable;
  }
}

int ExitCodeFor(FailureKind kind) {
  switch (kind) {
    case FailureKind::kPermanent:
      return kExitPermanent;
    case FailureKind::kNodeFault:
      return kExitNodeFault;
    case FailureKind::kRetryable:
      break;
  }
  return kExitRetryable;
}

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kPermanent:
      return "permanent";
    case FailureKind::kNodeFault:
      return "node fault";
    case FailureKind::kRetryable:
      break;
  }
  return "retryable";
}

absl::Status AllocationFailure(absl::string_view what, int64_t host_memory_bytes) {
  const std::string first(what.substr(0, what.find('\n')));
  // CUDA, LibTorch 1.x: "Tried to allocate 20.00 GiB (GPU 0; 15.78 GiB total capacity;
  // ...", 2.x: "Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 15.78 GiB".
  const double gpu_request = BytesAfter(what, "Tried to allocate ");
  double gpu_total = BytesAfter(what, "total capacity of ");
  if (gpu_total < 0 && absl::StrContains(what, "total capacity")) gpu_total = BytesAfter(what, "; ");
  if (gpu_request > 0 && gpu_total > 0) {
    if (gpu_request > gpu_total) {
      return AsPermanent(absl::ResourceExhaustedError(absl::StrCat(
          "an allocation of ", std::llround(gpu_request / (1 << 20)),
          " MiB exceeds the GPU's whole memory (", std::llround(gpu_total / (1 << 20)),
          " MiB): the model or batch is too large for this device; make it smaller (",
          first, ")")));
    }
    return absl::ResourceExhaustedError(first);
  }
  // CPU: "DefaultCPUAllocator: not enough memory: you tried to allocate N bytes".
  const double cpu_request = BytesAfter(what, "you tried to allocate ");
  if (cpu_request > 0 && host_memory_bytes > 0 &&
      cpu_request > static_cast<double>(host_memory_bytes)) {
    return AsPermanent(absl::ResourceExhaustedError(absl::StrCat(
        "an allocation of ", std::llround(cpu_request / (1 << 20)),
        " MiB exceeds this machine's whole memory (", host_memory_bytes >> 20,
        " MiB): the model or batch is too large; make it smaller (", first, ")")));
  }
  return absl::ResourceExhaustedError(first);
}

int64_t HostMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : -1;
}

}  // namespace ddp
