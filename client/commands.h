// ddpctl's verbs. Each returns the process exit code:
//   0  success (watch: the job SUCCEEDED)
//   1  the job FAILED (watch), or the request failed
//   2  bad usage or a bad job file
//   3  the job was CANCELLED (watch)
//   4  lost the coordinator: `watch` or `logs -f` could not reconnect within
//      CtlContext::reconnect_for (60 s) after it went away
// Errors say what to do next ("no coordinator at 127.0.0.1:29400: is ddp-coordinator
// running?").
#ifndef DDP_CLIENT_COMMANDS_H_
#define DDP_CLIENT_COMMANDS_H_

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/credentials.h"
#include "ddp/v1/job_service.grpc.pb.h"

namespace ddp {

inline constexpr int kCtlOk = 0;
inline constexpr int kCtlFailed = 1;
inline constexpr int kCtlUsage = 2;
inline constexpr int kCtlCancelled = 3;
inline constexpr int kCtlLost = 4;

struct CtlContext {
  std::string coordinator;  // HOST:PORT, for messages: the one `stub` calls.
  bool tls = false;         // --tls-ca given: a failed handshake is named as such.
  bool json = false;        // -o json
  bool tty = false;         // stdout is a terminal: redraw in place
  std::ostream* out;
  std::ostream* err;
  std::unique_ptr<v1::JobService::Stub> stub;
  // How long `watch` and `logs -f` try to reconnect to a coordinator that went away.
  absl::Duration reconnect_for = absl::Seconds(60);
  // --coordinator a,b (coordinators in standby): every address and its channel.
  std::vector<std::string> coordinators;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
};

// With several coordinators: points ctx.stub at the one that leads, asking each in turn
// (following the leader a standby names: common/rpc/leader.h); leaves it as it is
// when none answers. With one, does nothing.
void FollowLeader(CtlContext& ctx);

// Connects (lazily) to `coordinator`, in plaintext without a token.
CtlContext MakeContext(const std::string& coordinator, bool json, bool tty, std::ostream* out,
                       std::ostream* err);
// The same with TLS (security.ca_file) and a bearer token (security.token). Errors:
// unusable certificate files, a token that would go in plaintext beyond loopback.
absl::StatusOr<CtlContext> MakeSecureContext(const std::string& coordinator,
                                             const ChannelSecurity& security, bool json,
                                             bool tty, std::ostream* out, std::ostream* err);

// GetJob (with the stored metric history when `history`), its text made safe for a
// terminal (sanitize.h).
absl::StatusOr<v1::Job> FetchJob(CtlContext& ctx, const std::string& job_id, bool history);

// Prints `status` as ddpctl's error message and returns the exit code for it.
int ReportError(CtlContext& ctx, const absl::Status& status, const std::string& job_id = "");
// Says the coordinator stayed away past reconnect_for; returns kCtlLost.
int ReportLost(CtlContext& ctx, const absl::Status& status);

int Submit(CtlContext& ctx, const std::string& path, bool watch);
int Watch(CtlContext& ctx, const std::string& job_id);
int Get(CtlContext& ctx, const std::string& job_id, bool history);
// The latest attempt, rank by rank, from the flight recorders (RenderDiagnosis).
// `now`: takes the ranks' stacks first (CaptureStacks) and shows them.
int Diagnose(CtlContext& ctx, const std::string& job_id, bool now = false);
int List(CtlContext& ctx, int limit);
int Cancel(CtlContext& ctx, const std::string& job_id, bool wait);
// collapse: fold a line several ranks printed alike into one (client/collapse.h).
int Logs(CtlContext& ctx, const std::string& job_id, bool follow, int rank, int tail,
         bool collapse = false);
// Every worker (following ListWorkers' pages), or the first `limit` (> 0) from
// `page_token`, then the cluster's summary; `summary_only` prints the summary alone.
int Workers(CtlContext& ctx, int limit, bool summary_only, const std::string& page_token = "");
// `ddpctl workers cordon|uncordon|drain|rm NAME`: says what became of the worker and
// of the jobs on it (-o json: the worker as ListWorkers shows it).
int WorkerMaintenance(CtlContext& ctx, const std::string& action, const std::string& worker,
                      v1::DrainPolicy policy);

struct PlotOptions {
  // FILE.svg or FILE.png; "table" draws a Unicode chart on stdout, "json" prints the
  // series.
  std::string output = "table";
  int width = 960, height = 720;  // Pixels, for files.
};
// client/plot_command.cc
int Plot(CtlContext& ctx, const std::string& job_id, const PlotOptions& options);
// client/tensorboard_command.cc: the job's stored history as DIR/JOB/, a TensorBoard run.
int Tensorboard(CtlContext& ctx, const std::string& job_id, const std::string& dir);

}  // namespace ddp

#endif  // DDP_CLIENT_COMMANDS_H_
