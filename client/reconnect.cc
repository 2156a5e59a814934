#include "client/reconnect.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace ddp {

bool IsTransient(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:       // Refused, reset, shut down.
    case absl::StatusCode::kCancelled:         // The server cancelled it on shutdown.
    case absl::StatusCode::kUnknown:           // "Stream removed" and kin.
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:          // RST_STREAM from a dying server.
    case absl::StatusCode::kDeadlineExceeded:
      return true;
    default:
      return false;
  }
}

void Reconnector::Connected() {
  if (outage_) *err_ << "ddpctl: reconnected to the coordinator" << std::endl;
  outage_ = false;
  backoff_ = absl::Milliseconds(100);
}

bool Reconnector::Retry(const absl::Status& status) {
  if (!IsTransient(status)) return false;
  const absl::Time now = absl::Now();
  if (!outage_) {
    outage_ = true;
    outage_since_ = now;
    *err_ << "ddpctl: coordinator unavailable, reconnecting..." << std::endl;
  }
  if (now - outage_since_ >= give_up_after_) {
    lost_ = true;
    return false;
  }
  const absl::Duration wait =
      std::min(backoff_ * absl::Uniform(rng_, 0.5, 1.0), outage_since_ + give_up_after_ - now);
  backoff_ = std::min(backoff_ * 2, absl::Seconds(2));
  absl::SleepFor(wait);
  return true;
}

}  // namespace ddp
