// Live recovery, the rank's side (docs/recovery.md): when a collective fails because
// a peer died, a surviving rank keeps its state, tears its process group down, and
// waits for its worker to announce the attempt's next generation (the generation
// file, DDP_GENERATION_FILE) with the store to form it on; a replacement starts with
// DDP_GENERATION set. Every rank of the new generation then agrees on whose state to
// take (ChooseSource) and that rank sends it to all.
#ifndef DDP_LIBDDP_ENGINE_RECOVERY_H_
#define DDP_LIBDDP_ENGINE_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/contract/environment.h"

namespace ddp {

class Comm;

// What the worker announces: "GENERATION MASTER_ADDR MASTER_PORT".
struct GenerationNews {
  int generation = 0;
  std::string master_addr;
  int master_port = 0;
};

// The announcement in `text`; INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<GenerationNews> ParseGenerationNews(const std::string& text);

// What `path` announces now, if it is a generation above `current` (an absent,
// unreadable or malformed file announces nothing). The worker replaces the file
// atomically: a partial line is never read.
std::optional<GenerationNews> NewerGeneration(const std::string& path, int current);

// Polls `path` (every 20 ms) until it announces a generation above `current`.
// DEADLINE_EXCEEDED after `timeout`; FAILED_PRECONDITION when `path` is empty (not
// launched by ddp-worker: nobody will replace the lost rank).
absl::StatusOr<GenerationNews> AwaitGeneration(const std::string& path, int current,
                                               absl::Duration timeout);

// The checkpoint-now notice (DDP_NOTICE_FILE: "SEQ DEADLINE_MS REASON"), as read.
struct Notice {
  int64_t seq = 0;          // 0: none (or the file is absent or unreadable).
  int64_t deadline_ms = 0;  // Unix ms when the ranks will be stopped; 0: unknown.
  std::string reason;
};
Notice ReadNotice(const std::string& path);

// A surviving rank after `cause` broke a collective: `env` moved to the next generation
// announced within `timeout` (its number and store). Otherwise `cause`, with why no
// generation came appended.
absl::StatusOr<Environment> NextGeneration(const Environment& env, const absl::Status& cause,
                                           absl::Duration timeout);

// Whether `status`, from a collective, says a peer died or hung (UNAVAILABLE), which
// live recovery can cure; anything else (a bad spec, a full disk) it cannot.
bool PeerFailure(const absl::Status& status);

// Collective, in a new generation: every rank says how many optimizer steps its state
// has taken (`steps`, or -1 for a replacement that holds none). The source is the
// lowest rank among those with the most: a rank that completed one more step than
// another (its all-reduce finished before the peer died) holds that step's exact
// result. FAILED_PRECONDITION when no rank holds state.
struct StateSource {
  int rank = 0;
  int64_t global_step = 0;
};
absl::StatusOr<StateSource> ChooseSource(Comm& comm, int64_t steps);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_RECOVERY_H_
