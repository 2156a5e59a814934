// Exponential backoff with jitter for the agent's retries (registration, heartbeats
// and reports while the coordinator is unreachable): each delay is drawn uniformly
// from [d/2, d], d doubling from `initial` up to `max` and back to `initial` on
// Reset(). The jitter spreads a cluster's agents so that they do not come back in a
// stampede; the cap bounds how long an agent can take to notice that the coordinator
// is back (see kReconnectBound in agent.h).
#ifndef DDP_WORKER_AGENT_BACKOFF_H_
#define DDP_WORKER_AGENT_BACKOFF_H_

#include <algorithm>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace ddp {

class Backoff {
 public:
  Backoff(absl::Duration initial, absl::Duration max)
      : initial_(initial), max_(std::max(initial, max)), next_(initial) {}

  // The delay before the next retry; never more than max().
  absl::Duration Next() {
    const absl::Duration d = next_;
    next_ = std::min(next_ * 2, max_);
    return absl::Uniform(rng_, 0.5, 1.0) * d;
  }
  void Reset() { next_ = initial_; }
  absl::Duration max() const { return max_; }

 private:
  const absl::Duration initial_;
  const absl::Duration max_;
  absl::Duration next_;
  absl::BitGen rng_;
};

}  // namespace ddp

#endif  // DDP_WORKER_AGENT_BACKOFF_H_
