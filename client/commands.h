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

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ddp/v1/job_service.grpc.pb.h"

namespace ddp {

inline constexpr int kCtlOk = 0;
inline constexpr int kCtlFailed = 1;
inline constexpr int kCtlUsage = 2;
inline constexpr int kCtlCancelled = 3;
inline constexpr int kCtlLost = 4;

struct CtlContext {
  std::string coordinator;  // HOST:PORT, for messages.
  bool json = false;        // -o json
  bool tty = false;         // stdout is a terminal: redraw in place
  std::ostream* out;
  std::ostream* err;
  std::unique_ptr<v1::JobService::Stub> stub;
  // How long `watch` and `logs -f` try to reconnect to a coordinator that went away.
  absl::Duration reconnect_for = absl::Seconds(60);
};

// Connects (lazily) to `coordinator`.
CtlContext MakeContext(const std::string& coordinator, bool json, bool tty, std::ostream* out,
                       std::ostream* err);

// Prints `status` as ddpctl's error message and returns the exit code for it.
int ReportError(CtlContext& ctx, const absl::Status& status, const std::string& job_id = "");
// Says the coordinator stayed away past reconnect_for; returns kCtlLost.
int ReportLost(CtlContext& ctx, const absl::Status& status);

int Submit(CtlContext& ctx, const std::string& path, bool watch);
int Watch(CtlContext& ctx, const std::string& job_id);
int Get(CtlContext& ctx, const std::string& job_id, bool history);
int List(CtlContext& ctx, int limit);
int Cancel(CtlContext& ctx, const std::string& job_id, bool wait);
int Logs(CtlContext& ctx, const std::string& job_id, bool follow, int rank, int tail);
int Workers(CtlContext& ctx);

}  // namespace ddp

#endif  // DDP_CLIENT_COMMANDS_H_
