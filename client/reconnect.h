// How ddpctl's streaming verbs (`watch`, `logs -f`) ride out a coordinator restart.
//
// Once the coordinator has been reached, a stream that ends with a transient error
// (UNAVAILABLE and the like: the coordinator went away) is reopened after a backoff
// (100 ms doubling to 2 s, jittered) until the coordinator answers again or
// `give_up_after` has passed since the stream first broke. The first failure of an
// outage prints "coordinator unavailable, reconnecting..." to stderr.
#ifndef DDP_CLIENT_RECONNECT_H_
#define DDP_CLIENT_RECONNECT_H_

#include <ostream>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ddp {

// The coordinator is unreachable or went away mid-stream (as opposed to answering
// with an error of its own, such as NOT_FOUND).
bool IsTransient(const absl::Status& status);

class Reconnector {
 public:
  Reconnector(std::ostream* err, absl::Duration give_up_after)
      : err_(err), give_up_after_(give_up_after) {}

  // Data flowed on the current stream: the coordinator is back.
  void Connected();
  // The stream ended with `status` (not OK). Waits out the backoff and returns true
  // when the caller should reopen it; returns false when `status` is not transient or
  // the coordinator has been away too long (lost() is then true).
  bool Retry(const absl::Status& status);
  bool lost() const { return lost_; }

 private:
  std::ostream* const err_;
  const absl::Duration give_up_after_;
  bool outage_ = false;
  absl::Time outage_since_;
  absl::Duration backoff_ = absl::Milliseconds(100);
  bool lost_ = false;
  absl::BitGen rng_;
};

}  // namespace ddp

#endif  // DDP_CLIENT_RECONNECT_H_
