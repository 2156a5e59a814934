#include "coordinator/rpc/auth.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace ddp {
namespace {

bool IsWorkerMethod(Method m) {
  return m == Method::kRegister || m == Method::kHeartbeat || m == Method::kReportEvents ||
         m == Method::kWaitForTasks || m == Method::kLeave;
}

// The table: which roles each JobService method admits (WorkerService: worker only).
std::vector<Role> AllowedRoles(Method m) {
  switch (m) {
    case Method::kSubmitJob:
    case Method::kCancelJob:
    case Method::kCaptureStacks:
      return {Role::kAdmin, Role::kUser};
    case Method::kGetJob:
    case Method::kListJobs:
    case Method::kWatchJob:
    case Method::kStreamLogs:
    case Method::kListWorkers:
      return {Role::kAdmin, Role::kUser, Role::kViewer};
    case Method::kCordonWorker:
    case Method::kDrainWorker:
    case Method::kUncordonWorker:
    case Method::kRemoveWorker:
      return {Role::kAdmin};
    case Method::kRegister:
    case Method::kHeartbeat:
    case Method::kReportEvents:
    case Method::kWaitForTasks:
    case Method::kLeave:
      return {Role::kWorker};
  }
  return {};
}

constexpr char kHowClient[] =
    "pass a token with `ddpctl --token-file FILE` or the DDP_TOKEN environment variable";
constexpr char kHowWorker[] =
    "start ddp-worker with --tls-cert/--tls-key signed by the coordinator's --tls-ca, or "
    "with --token-file holding a `worker` token for its name";

std::string FileStamp(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_size, "/", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "/",
                      st.st_ino);
}

}  // namespace

const char* MethodName(Method m) {
  switch (m) {
    case Method::kSubmitJob: return "SubmitJob";
    case Method::kGetJob: return "GetJob";
    case Method::kListJobs: return "ListJobs";
    case Method::kCancelJob: return "CancelJob";
    case Method::kWatchJob: return "WatchJob";
    case Method::kStreamLogs: return "StreamLogs";
    case Method::kListWorkers: return "ListWorkers";
    case Method::kCordonWorker: return "CordonWorker";
    case Method::kDrainWorker: return "DrainWorker";
    case Method::kUncordonWorker: return "UncordonWorker";
    case Method::kRemoveWorker: return "RemoveWorker";
    case Method::kCaptureStacks: return "CaptureStacks";
    case Method::kRegister: return "Register";
    case Method::kHeartbeat: return "Heartbeat";
    case Method::kReportEvents: return "ReportEvents";
    case Method::kWaitForTasks: return "WaitForTasks";
    case Method::kLeave: return "Leave";
  }
  return "?";
}

PresentedCredentials CredentialsOf(const grpc::ServerContextBase& ctx) {
  PresentedCredentials p;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    p.authorization = std::string(it->second.data(), it->second.size());
  }
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
      for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
        std::string name(v.data(), v.size());
        if (std::find(p.certificate_names.begin(), p.certificate_names.end(), name) ==
            p.certificate_names.end()) {
          p.certificate_names.push_back(std::move(name));
        }
      }
    }
  }
  return p;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const AuthOptions& options) {
  std::unique_ptr<Authorizer> a(new Authorizer(options));
  if (!options.token_file.empty()) {
    if (absl::Status st = a->Reload(); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("--auth-token-file: ", st.message()));
    }
  }
  return a;
}

absl::Status Authorizer::Reload() {
  if (options_.token_file.empty()) return absl::OkStatus();
  const std::string stamp = FileStamp(options_.token_file);
  auto table = TokenTable::Load(options_.token_file);
  if (!table.ok()) return table.status();
  {
    absl::MutexLock lock(&mu_);
    tokens_ = *std::move(table);
    file_stamp_ = stamp;
  }
  return absl::OkStatus();
}

absl::Status Authorizer::ReloadIfChanged() {
  if (options_.token_file.empty()) return absl::OkStatus();
  const std::string stamp = FileStamp(options_.token_file);
  {
    absl::MutexLock lock(&mu_);
    if (stamp == file_stamp_) return absl::OkStatus();
  }
  absl::Status st = Reload();
  if (!st.ok()) {
    // Remember the stamp anyway so a broken file is reported once, not every check.
    absl::MutexLock lock(&mu_);
    file_stamp_ = stamp;
  }
  return st;
}

absl::StatusOr<Identity> Authorizer::Identify(const PresentedCredentials& p,
                                              bool worker_method,
                                              absl::string_view client_how) const {
  const absl::string_view how =
      worker_method ? kHowWorker : client_how.empty() ? kHowClient : client_how;
  if (p.authorization.has_value()) {
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(*p.authorization, kBearer)) {
      return absl::UnauthenticatedError(
          absl::StrCat("the authorization metadata must be `Bearer <token>`: ", how));
    }
    if (!jobs_authenticated()) {
      return absl::UnauthenticatedError(
          "this coordinator has no --auth-token-file, so it accepts no tokens: " +
          std::string(worker_method ? "use a client certificate" : "call it without one"));
    }
    std::optional<Identity> id;
    {
      absl::MutexLock lock(&mu_);
      id = tokens_.Find(absl::string_view(*p.authorization).substr(kBearer.size()));
    }
    if (!id.has_value()) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the token is not valid on this coordinator (unknown or revoked): check it against "
          "the coordinator's --auth-token-file; ", how));
    }
    return *id;
  }
  if (!p.certificate_names.empty() && options_.client_certificates) {
    Identity id;
    id.name = p.certificate_names.front();
    id.role = Role::kWorker;
    id.via = "certificate";
    return id;
  }
  return absl::UnauthenticatedError(
      absl::StrCat("this coordinator requires authentication: ", how));
}

absl::StatusOr<Identity> Authorizer::Authorize(const PresentedCredentials& p, Method method,
                                               const std::string& worker,
                                               absl::string_view how) const {
  if (gate_) {
    if (absl::Status st = gate_(); !st.ok()) return st;
  }
  const bool worker_method = IsWorkerMethod(method);
  if (worker_method ? !workers_authenticated() : !jobs_authenticated()) {
    Identity open;
    open.via = "open";
    open.role = worker_method ? Role::kWorker : Role::kAdmin;
    open.name = worker_method ? worker : "";
    return open;
  }
  auto id = Identify(p, worker_method, how);
  if (!id.ok()) return id.status();
  const std::vector<Role> allowed = AllowedRoles(method);
  if (std::find(allowed.begin(), allowed.end(), id->role) == allowed.end()) {
    std::vector<std::string> names;
    for (Role r : allowed) names.push_back(RoleName(r));
    std::string what =
        id->role == Role::kWorker
            ? "worker identities may call only WorkerService; ddpctl needs a user token"
        : worker_method
            ? "only ddp-worker may call WorkerService (with its certificate or a worker token)"
            : absl::StrCat("it needs role ", absl::StrJoin(names, " or "));
    return absl::PermissionDeniedError(absl::StrCat(id->name, " (role ", RoleName(id->role),
                                                    ") may not call ", MethodName(method),
                                                    ": ", what));
  }
  if (worker_method) {
    const bool own = id->via == "certificate"
                         ? std::find(p.certificate_names.begin(), p.certificate_names.end(),
                                     worker) != p.certificate_names.end()
                         : id->name == worker;
    if (!own) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker ", id->name, " may not speak for worker '", worker,
          "': a worker reports only under its own name (its certificate's CN or SAN, or its "
          "token's name); start it with --name ", id->name));
    }
  }
  return id;
}

Caller CallerOf(const Identity& id) {
  if (id.via == "open") return Caller();  // Anonymous, trusted: the loopback quickstart.
  Caller c;
  c.name = id.name;
  c.admin = id.role == Role::kAdmin;
  return c;
}

}  // namespace ddp
