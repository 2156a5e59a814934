// What `ddpctl watch` notes beside a rank: a straggler (its compute time per step well
// above the other ranks') or a rank whose updates stopped. Pure, with the time passed
// in, so tests pin both down without waiting.
//
// Why compute time and not step time: with synchronous all-reduce every rank's step
// takes as long as the slowest one's; what differs is the time before a rank starts
// waiting on its peers, step_ms - comm_ms (comm_ms is the wait after backward). Where
// every rank reports its step's phases (data_ms, compute_ms, optimizer_ms), the note
// names the one the straggler loses most time in: "straggler 2.4x (data loading)".
#ifndef DDP_CLIENT_STRAGGLERS_H_
#define DDP_CLIENT_STRAGGLERS_H_

#include <map>
#include <string>

#include "absl/time/time.h"
#include "ddp/v1/types.pb.h"

namespace ddp {

struct RankNoteOptions {
  double straggler_ratio = 1.5;      // Compute time / the other ranks' median.
  double straggler_min_excess_ms = 1.0;  // Ignore sub-millisecond noise on tiny models.
  int stale_intervals = 10;          // Missed update intervals (every_steps x step time).
  absl::Duration stale_floor = absl::Seconds(10);  // Validation, checkpoints, batching.
};

// rank -> "straggler 2.4x (compute)" or "stale 23s" for ranks of the current attempt of a
// RUNNING job; ranks with nothing to say are absent.
std::map<int, std::string> RankNotes(const v1::Job& job, absl::Time now,
                                     const RankNoteOptions& options = {});

}  // namespace ddp

#endif  // DDP_CLIENT_STRAGGLERS_H_
