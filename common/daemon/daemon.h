// What every ddp daemon (ddp-coordinator, ddp-worker) does the same way at its edges:
// flag errors and exit codes, the shutdown signals, and systemd's notify protocol.
// Each main.cc declares its flags, fills its options and calls these; the daemon's
// composition root (coordinator/server.h, worker/agent/server.h) builds the rest.
//
// Exit codes: 0 after SIGTERM/SIGINT (or --help); 1 when it cannot start (a port in
// use, an unusable state dir or certificate); 2 for bad flags or flag values.
#ifndef DDP_COMMON_DAEMON_DAEMON_H_
#define DDP_COMMON_DAEMON_DAEMON_H_

#include <signal.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/flags.h"

namespace ddp::daemon {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCannotStart = 1;
inline constexpr int kExitUsage = 2;

// Parses argv into `flags`. Returns the exit code main should return now: 0 after
// --help (the usage printed), 2 after an unknown flag, a bad value or a positional
// argument (printed as "<program>: <message>", then the usage); nullopt to go on.
std::optional<int> ParseFlags(FlagSet& flags, int argc, char** argv);

// A flag value found wrong after parsing: prints "<program>: <message>" (and the
// usage, when `flags` is given) on stderr and returns 2.
int UsageError(const std::string& program, const absl::Status& status,
               const FlagSet* flags = nullptr);
// The daemon could not start: prints "<program>: <message>" and returns 1.
int StartError(const std::string& program, const absl::Status& status);

// Blocks SIGTERM and SIGINT (and SIGHUP, with `reload`) in the calling thread and in
// every thread started after it, so that they are taken only by Wait(). Construct
// it first in main, before any thread starts (gRPC starts threads with its first
// channel or server).
class ShutdownSignals {
 public:
  explicit ShutdownSignals(bool reload = false);
  // Blocks until one of the signals arrives and returns it (SIGHUP only with
  // `reload`: the caller reloads and waits again).
  int Wait();
  // As Wait(), for at most `timeout`: 0 when none arrived.
  int WaitFor(absl::Duration timeout);
  static const char* Name(int sig);

 private:
  sigset_t set_;
};

// systemd's notify protocol (Type=notify units); no-ops outside systemd.
void NotifyReady(const std::string& status);  // READY=1 and STATUS=<status>.
void NotifyStatus(const std::string& status);
void NotifyStopping();

}  // namespace ddp::daemon

#endif  // DDP_COMMON_DAEMON_DAEMON_H_
