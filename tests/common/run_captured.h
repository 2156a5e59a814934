// Runs a program to its end with both output streams captured, read as they come (so
// a chatty child never blocks on a full pipe), killed with SIGKILL after a timeout.
// The tests' one way of doing it (LocalCluster's ddpctl runs, PostgresServer's
// programs).
#ifndef DDP_TESTS_COMMON_RUN_CAPTURED_H_
#define DDP_TESTS_COMMON_RUN_CAPTURED_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/process.h"

namespace ddp::testing {

struct CapturedRun {
  ExitStatus exit;
  std::string out;
  std::string err;
  bool timed_out = false;  // Killed at the timeout.
};

// `options` with stdout and stderr captured (set here). Errors: what Subprocess::Spawn
// returns when the program cannot be started.
absl::StatusOr<CapturedRun> RunCaptured(SpawnOptions options, absl::Duration timeout);

}  // namespace ddp::testing

#endif  // DDP_TESTS_COMMON_RUN_CAPTURED_H_
