#include "coordinator/core/stall_watchdog.h"

#include <algorithm>

namespace ddp {

void StallWatch::Size(int world) {
  if (world <= 0 || static_cast<int>(stopped_.size()) >= world) return;
  stopped_.resize(static_cast<size_t>(world), false);
}

void StallWatch::Progress(int rank, int world, bool step, absl::Time now) {
  if (rank < 0 || rank >= world) return;
  if (last_.empty()) {
    if (!step) return;
    // Armed: from now on every rank has the timeout to report (again).
    last_.assign(static_cast<size_t>(world), now);
    if (reporting_ranks_only_) steps_.assign(static_cast<size_t>(world), 0);
    Size(world);
  }
  if (rank >= static_cast<int>(last_.size())) return;
  if (reporting_ranks_only_ && step && steps_[static_cast<size_t>(rank)] < 2) {
    ++steps_[static_cast<size_t>(rank)];
  }
  absl::Time& last = last_[static_cast<size_t>(rank)];
  if (last == absl::InfiniteFuture()) return;  // Done.
  longest_gap_ = std::max(longest_gap_, now - last);
  last = now;
}

void StallWatch::Done(int rank) {
  if (rank >= 0 && rank < static_cast<int>(last_.size())) {
    last_[static_cast<size_t>(rank)] = absl::InfiniteFuture();
  }
}

void StallWatch::SetStopped(int rank, int world, bool stopped) {
  if (rank < 0 || rank >= world) return;
  Size(world);
  stopped_[static_cast<size_t>(rank)] = stopped;
}

absl::Duration StallWatch::Timeout(double stall_timeout_s, double collective_timeout_s) const {
  if (stall_timeout_s > 0) return absl::Seconds(stall_timeout_s);
  const absl::Duration learned = std::max(kFloor, kGapsPerTimeout * longest_gap_);
  return std::min(learned, absl::Seconds(collective_timeout_s) / 2);
}

std::optional<StallWatch::Stall> StallWatch::Find(absl::Time now, absl::Duration timeout,
                                                  absl::Duration unreported_grace) const {
  if (last_.empty()) return std::nullopt;
  std::optional<Stall> oldest, stopped;
  for (size_t r = 0; r < last_.size(); ++r) {
    if (reporting_ranks_only_ && steps_[r] < 2) continue;
    if (last_[r] == absl::InfiniteFuture()) continue;  // Done.
    const Stall s{static_cast<int>(r), now - last_[r], r < stopped_.size() && stopped_[r]};
    if (s.stopped && (!stopped.has_value() || s.silent > stopped->silent)) stopped = s;
    if (!oldest.has_value() || s.silent > oldest->silent) oldest = s;
  }
  if (!oldest.has_value() || oldest->silent < timeout) return std::nullopt;  // No stall.
  // The cause, though it may have reported after the peers that wait for it.
  if (stopped.has_value()) return stopped;
  if (oldest->silent < timeout + unreported_grace) return std::nullopt;  // Its agent's word?
  return oldest;
}

}  // namespace ddp
