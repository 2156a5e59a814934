// Authentication and authorization of every coordinator RPC, in one place.
//
// The gRPC adapters (grpc_service.cc) ask Authorizer::Check() first thing in each
// handler; it establishes who the caller is and whether the method's row in the
// table below admits them, so the service logic behind the adapters never sees a
// refused call and always knows its caller's Identity.
//
//   method                         roles                     configured by
//   SubmitJob, CancelJob,          admin, user               --auth-token-file
//   CaptureStacks
//   GetJob, ListJobs, WatchJob,    admin, user, viewer       --auth-token-file
//   StreamLogs, ListWorkers
//   CordonWorker, DrainWorker,     admin                     --auth-token-file
//   UncordonWorker, RemoveWorker
//   Register, Heartbeat,           worker, and only for      --tls-ca (certificates)
//   ReportEvents, WaitForTasks,    its own worker name       or worker tokens
//   Leave
//
// Who the caller is: a bearer token (`authorization: Bearer <token>`) found in the
// token file gives that line's role and name; a client certificate verified against
// --tls-ca (only possible over TLS) gives role worker, named by its CN and SANs. A
// presented token wins over a certificate, and a wrong one is refused even when a
// certificate is present. Without --auth-token-file, JobService is open; without
// both, WorkerService is open too: the loopback quickstart.
//
// Refusals: UNAUTHENTICATED (no or unknown credentials) and PERMISSION_DENIED (known
// caller, wrong role or worker name), each saying how to pass the right credentials.
// Tokens are never logged or echoed.
//
// Lifecycle: Create() loads the token file; Reload() (SIGHUP, or a change seen by
// ReloadIfChanged() from the housekeeping thread) swaps in a new table, keeping the
// old one if the new file is invalid. Thread-safe.
#ifndef DDP_COORDINATOR_RPC_AUTH_H_
#define DDP_COORDINATOR_RPC_AUTH_H_

#include <grpcpp/server_context.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth/tokens.h"
#include "coordinator/core/admission.h"

namespace ddp {

enum class Method {
  kSubmitJob,
  kGetJob,
  kListJobs,
  kCancelJob,
  kWatchJob,
  kStreamLogs,
  kListWorkers,
  kCordonWorker,
  kDrainWorker,
  kUncordonWorker,
  kRemoveWorker,
  kCaptureStacks,
  kRegister,
  kHeartbeat,
  kReportEvents,
  kWaitForTasks,
  kLeave,
};

const char* MethodName(Method method);

struct AuthOptions {
  std::string token_file;            // --auth-token-file; empty: JobService open.
  bool client_certificates = false;  // --tls-ca given: certificates identify workers.
};

// What a caller presented, extracted from the call (or made by tests).
struct PresentedCredentials {
  // The `authorization` metadata, if present (e.g. "Bearer abc...").
  std::optional<std::string> authorization;
  // Names of a verified client certificate: its CN, then its SANs. Empty: none.
  std::vector<std::string> certificate_names;
};

// Reads the `authorization` metadata and the verified peer certificate of a call.
PresentedCredentials CredentialsOf(const grpc::ServerContextBase& ctx);

class Authorizer {
 public:
  // INVALID_ARGUMENT / NOT_FOUND naming --auth-token-file when it is unusable.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(const AuthOptions& options);

  // The caller's identity if `method` admits them; for WorkerService methods `worker`
  // is the request's worker name, which must be the caller's own. `how` tells a
  // refused JobService caller how to pass a token (default: ddpctl's flags; the
  // dashboard says how a browser does).
  absl::StatusOr<Identity> Authorize(const PresentedCredentials& presented, Method method,
                                     const std::string& worker = "",
                                     absl::string_view how = {}) const;
  absl::StatusOr<Identity> Check(const grpc::ServerContextBase& ctx, Method method,
                                 const std::string& worker = "") const {
    return Authorize(CredentialsOf(ctx), method, worker);
  }

  // Asked before anything else on every call of the gRPC services and the dashboard:
  // an error refuses the call with it (a coordinator whose lease lapsed: "not the
  // leader"). Set once, before serving.
  void SetGate(std::function<absl::Status()> gate) { gate_ = std::move(gate); }
  // The gate's answer now (OK without one): long-lived calls ask it again.
  absl::Status Gate() const { return gate_ ? gate_() : absl::OkStatus(); }

  // Re-reads the token file now. On error the previous table stays in force.
  absl::Status Reload();
  // Re-reads it if its size or modification time changed since the last read.
  absl::Status ReloadIfChanged();

  bool jobs_authenticated() const { return !options_.token_file.empty(); }
  bool workers_authenticated() const {
    return jobs_authenticated() || options_.client_certificates;
  }

 private:
  explicit Authorizer(AuthOptions options) : options_(std::move(options)) {}
  absl::StatusOr<Identity> Identify(const PresentedCredentials& presented, bool worker_method,
                                    absl::string_view how) const;

  const AuthOptions options_;
  std::function<absl::Status()> gate_;
  mutable absl::Mutex mu_;
  TokenTable tokens_ ABSL_GUARDED_BY(mu_);
  std::string file_stamp_ ABSL_GUARDED_BY(mu_);  // Size and mtime of the last read.
};

// What the coordinator's logic needs of an admitted JobService caller (its name as
// owner, whether it is an admin): anonymous and trusted when no one is authenticated.
// The gRPC services and the dashboard both use it, so both redact alike.
Caller CallerOf(const Identity& id);

}  // namespace ddp

#endif  // DDP_COORDINATOR_RPC_AUTH_H_
